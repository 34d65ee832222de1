"""Redis: claims, leases and history in Redis, every state change one Lua script.

Each decision (claim, renew, release, take over, finish with pruning) is one script on the keys
of one job, run atomically by Redis with Redis's own clock (``TIME``). Keys are listed in
:mod:`._keys`, scripts live in ``*.lua`` next to this module, and driver errors are translated in
:mod:`._errors`. Releases and finishes are published on a pub/sub channel, so a backup acts
within milliseconds of a hand-over; a lost message only delays it to the lease expiry.

Works with a plain ``redis.asyncio.Redis``, a Sentinel-managed one
(``Sentinel(...).master_for(...)``) or a ``redis.asyncio.cluster.RedisCluster``: every key of a
job carries the hash tag ``{job}``, so each script stays in one cluster slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._models import Run, RunStatus
from ..._redact import redact_url as _redacted
from ..._retry import backoff
from ...backend import (
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    LeaseBackend,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from ...errors import BackendError, BackendUnavailable, InvalidOption, LeaseLost, MissingDependency
from .. import _lease_rules as rules
from .._lease_rules import RunRow, lease_lost
from ._errors import guarded, is_driver_error, translate
from ._keys import DEFAULT_PREFIX, Namespace
from ._scripts import ScriptRunner

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub
    from redis.asyncio.cluster import RedisCluster

__all__ = ["RedisBackend"]

logger = logging.getLogger(__name__)

DEFAULT_URL: Final = "redis://localhost:6379/0"
# Options the backend takes from a URL's query; the rest of the URL goes to redis-py.
URL_OPTIONS: Final = ("prefix", "history_size")
# Every call to Redis is abandoned after this long (BackendUnavailable), so a hung server
# cannot hang the scheduler; a renewal gets at most a third of its lease (see _errors.guarded).
CALL_TIMEOUT_S: Final = 5.0
# redis-py's own retries on a lost connection, before the core's backoff takes over.
DRIVER_RETRIES: Final = 2
# Slots within this long after a Redis (re)start may have been claimed on the server that was
# there before (the uptime has 1 s resolution, instance clocks may be a little ahead).
RESTART_MARGIN_MS: Final = 2_000
# Pruning looks at most at this many history entries per result, so a finish stays a short
# script (it prunes at most rules.PRUNE_BATCH slots, as every backend does).
PRUNE_SCAN: Final = 1_000
# subscribe() waits this long for the first subscription before returning anyway.
SUBSCRIBE_WAIT_S: Final = 2.0
# A quiet subscription pings this often, so a dead connection is noticed and re-made.
PUBSUB_PING_S: Final = 10.0


def _require_driver() -> None:
    try:
        import redis.asyncio  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "the Redis backend needs the redis package (redis-py >= 5): "
            "pip install 'anarchon[redis]'"
        ) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _row(data: dict[str, Any]) -> RunRow:
    """A stored attempt (JSON written by the scripts) as the lease rules' row."""
    return RunRow(
        job=data["job"],
        slot_key=data["slot_key"],
        slot=_opt_int(data.get("slot")),
        attempt=int(data["attempt"]),
        run_id=data["run_id"],
        token=data["token"],
        instance=data["instance"],
        trigger=data["trigger"],
        status=data["status"],
        fence=int(data.get("fence", 0)),
        started_at=int(data["started_at"]),
        finished_at=_opt_int(data.get("finished_at")),
        lease_expires_at=_opt_int(data.get("lease_expires_at")),
        released=bool(data.get("released", False)),
        error=data.get("error"),
        reason=data.get("reason"),
    )


def _policies(config: Any) -> set[str]:
    """The maxmemory-policy values in a CONFIG GET answer: ``{name: value}`` from one server,
    ``{node: {name: value}}`` from a cluster."""
    if not isinstance(config, dict):
        return set()
    found = set()
    for key, value in config.items():
        if isinstance(value, dict):
            found |= _policies(value)
        elif _text(key) == "maxmemory-policy":
            found.add(_text(value))
    return found


def _args(**values: Any) -> str:
    """A script's arguments as JSON; None is left out (absent in Lua)."""
    return json.dumps({k: v for k, v in values.items() if v is not None})


class RedisBackend(LeaseBackend):
    """Claims, leases and history in Redis, shared by every instance that uses the same prefix.

    :param url: where Redis is (``redis://``, ``rediss://`` or ``unix://``, with redis-py's
        query options such as ``socket_timeout``); the backend creates its client in
        :meth:`start` and closes it in :meth:`stop`.
    :param client: a ``redis.asyncio.Redis`` (plain or from ``Sentinel.master_for``) or a
        ``redis.asyncio.cluster.RedisCluster`` to use instead of ``url``. It stays yours: the
        backend never closes it.
    :param prefix: the namespace of every key (see :mod:`anarchon.backends.redis._keys` for
        the rule): applications that share slots use the same prefix, others a different one.
    :param history_size: at most about this many runs are kept per job.
    """

    name = "redis"
    # Releases and finishes are pushed through pub/sub; without it backups would poll.
    release_poll_ms = None

    def __init__(
        self,
        url: str = DEFAULT_URL,
        client: Redis | RedisCluster | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        history_size: int = 1000,
    ) -> None:
        _require_driver()
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise InvalidOption(f"history_size={history_size!r} must be an integer >= 1")
        if client is not None:
            if url != DEFAULT_URL:
                raise InvalidOption(
                    f"RedisBackend got both url={_redacted(url)!r} and a client; pass one of them"
                )
            if not hasattr(client, "evalsha") or not hasattr(client, "pipeline"):
                raise InvalidOption(
                    f"client={client!r} is not a redis.asyncio.Redis or RedisCluster client"
                )
        else:
            self._check_url(url)
        self.url = url
        self.prefix = prefix
        self.history_size = history_size
        self._keys = Namespace(prefix)
        self._given = client
        self._client: Redis | RedisCluster | None = None
        self._scripts: ScriptRunner | None = None
        self._listeners: list[Callable[[str, str, bool], None]] = []
        self._listener: asyncio.Future[None] | None = None
        #: Test-only: milliseconds added to Redis's clock in every script (0 in production;
        #: see tests/conformance/test_differential.py).
        self._test_clock_offset_ms = 0

    def _a(self, **values: Any) -> str:
        """A script's arguments as JSON, with the test-only clock offset when there is one."""
        return _args(**values, clock_offset_ms=self._test_clock_offset_ms or None)

    @classmethod
    def from_url(cls, url: str) -> RedisBackend:
        """Build the backend from ``redis://host:6379/0?prefix=app:&history_size=500``.

        ``prefix`` and ``history_size`` are the backend's; every other query option is passed
        on to redis-py. ``rediss://`` (TLS) and ``unix://`` work as in redis-py.
        """
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {key: value for key, value in query if key in URL_OPTIONS}
        rest = urlencode([(key, value) for key, value in query if key not in URL_OPTIONS])
        options: dict[str, Any] = {}
        if "prefix" in ours:
            options["prefix"] = ours["prefix"]
        if "history_size" in ours:
            try:
                options["history_size"] = int(ours["history_size"])
            except ValueError:
                raise InvalidOption(
                    f"history_size={ours['history_size']!r} in the Redis URL must be an integer"
                ) from None
        return cls(urlunsplit(parts._replace(query=rest)), **options)

    @staticmethod
    def _check_url(url: str) -> None:
        from redis.connection import parse_url

        if not isinstance(url, str):
            raise InvalidOption(f"url={url!r} must be a string such as {DEFAULT_URL!r}")
        if any(key in URL_OPTIONS for key, _ in parse_qsl(urlsplit(url).query)):
            raise InvalidOption(
                f"Redis URL {_redacted(url)!r} carries backend options ({', '.join(URL_OPTIONS)}): "
                "use RedisBackend.from_url() or pass them as arguments"
            )
        try:
            parse_url(url)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise InvalidOption(f"Redis URL {_redacted(url)!r} is not valid: {exc}") from None

    def __repr__(self) -> str:
        where = repr(self._given) if self._given is not None else repr(_redacted(self.url))
        return f"RedisBackend({where}, prefix={self.prefix!r})"

    @property
    def _where(self) -> str:
        return repr(self._given) if self._given is not None else _redacted(self.url)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, check the server answers, and load the scripts. Idempotent.

        Raises :class:`~anarchon.errors.BackendUnavailable` if Redis cannot be reached.
        """
        if self._scripts is not None:
            return
        client = self._given if self._given is not None else self._connect()
        scripts = ScriptRunner(client)
        try:
            await guarded(self._prepare(client, scripts), self._where, CALL_TIMEOUT_S)
        except (BackendError, TypeError) as exc:
            if self._given is None:
                await client.aclose()
            if isinstance(exc, TypeError):  # an unknown query option reached redis-py
                raise InvalidOption(f"Redis URL {self._where!r}: {exc}") from exc
            raise type(exc)(f"cannot start the Redis backend: {exc}") from exc
        self._client, self._scripts = client, scripts
        await self._check_eviction(client)

    @staticmethod
    async def _prepare(client: Redis | RedisCluster, scripts: ScriptRunner) -> None:
        await client.ping()
        await scripts.load()

    def _connect(self) -> Redis:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialWithJitterBackoff

        return Redis.from_url(
            self.url,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), DRIVER_RETRIES),
        )

    async def _check_eviction(self, client: Redis | RedisCluster) -> None:
        """Warn if Redis may evict our keys: an evicted record lets a slot run twice."""
        try:
            config = await guarded(
                client.config_get("maxmemory-policy"), self._where, CALL_TIMEOUT_S
            )
        except BackendError:
            return  # CONFIG is often disabled on managed Redis; nothing to check then
        for policy in sorted(p for p in _policies(config) if p.startswith("allkeys")):
            logger.warning(
                "Redis maxmemory-policy is %s: under memory pressure Redis may evict anarchon's "
                "records and a slot could run twice; use noeviction or a volatile-* policy",
                policy,
                extra={"action": "eviction_policy"},
            )

    async def stop(self) -> None:
        """Stop listening and close the client this backend created (never one passed in)."""
        listener, self._listener = self._listener, None
        while listener is not None and not listener.done():
            # Cancel until it takes: on Python 3.11 redis-py's socket writes (asyncio.wait_for)
            # can swallow a cancellation that arrives as the write completes.
            listener.cancel()
            await asyncio.wait([listener], timeout=0.5)
        if listener is not None and not listener.cancelled() and listener.exception():
            logger.error("the Redis notification listener failed", exc_info=listener.exception())
        self._listeners.clear()
        client, self._client, self._scripts = self._client, None, None
        if client is not None and self._given is None:
            await client.aclose()

    def _runner(self) -> ScriptRunner:
        if self._scripts is None:
            raise BackendError(f"{self!r} is not started; start the scheduler first")
        return self._scripts

    def _started_client(self) -> Redis | RedisCluster:
        self._runner()
        assert self._client is not None
        return self._client

    async def _call(
        self, script: str, job: str, args: str, timeout_s: float = CALL_TIMEOUT_S
    ) -> dict[str, Any]:
        keys = self._keys.job(job).all()
        answer = await guarded(self._runner().call(script, keys, args), self._where, timeout_s)
        decoded: dict[str, Any] = json.loads(_text(answer))
        return decoded

    # -- the contract -----------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`; one script call per request, all in
        one pipeline (one round trip)."""
        reqs = list(requests)
        if not reqs:
            return []
        errors = [rules.unstorable(r) for r in reqs]
        sent = [n for n, error in enumerate(errors) if error is None]
        calls = [(self._keys.job(reqs[n].job).all(), self._claim_args(reqs[n])) for n in sent]
        answers = await guarded(
            self._runner().call_many("claim", calls), self._where, CALL_TIMEOUT_S
        )
        decided = dict(zip(sent, self._items(answers, transient_raise=True), strict=True))
        out: list[ClaimOutcome] = []
        for n, req in enumerate(reqs):
            answer = decided[n] if n in decided else errors[n]
            if isinstance(answer, BackendError):
                out.append(rules.refused_outcome(req, 0, answer))
            else:
                assert answer is not None
                out.append(self._claim_outcome(req, answer))
        return out

    def _items(self, answers: list[Any], transient_raise: bool) -> list[Any]:
        """Each item of a pipeline: its decoded JSON answer, or the error of that item alone
        (a transient one is raised for the whole call when ``transient_raise``)."""
        out: list[Any] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                error = translate(answer, self._where)
                if transient_raise and isinstance(error, BackendUnavailable):
                    raise error from answer
                out.append(error)
            else:
                out.append(json.loads(_text(answer)))
        return out

    def _claim_args(self, req: ClaimRequest) -> str:
        return self._a(
            job=req.job,
            slot_key=req.slot_key,
            slot=req.slot,
            run_id=req.run_id,
            token=req.token,
            instance=req.instance,
            trigger=str(req.trigger),
            lease_ms=req.lease_ms,
            overlap=str(req.overlap),
            skip_reason=req.skip_reason,
            restart_margin_ms=RESTART_MARGIN_MS,
        )

    @staticmethod
    def _claim_outcome(req: ClaimRequest, answer: dict[str, Any]) -> ClaimOutcome:
        now = int(answer["now"])
        row = _row(answer["run"])
        status = ClaimStatus(answer["status"])
        if status is ClaimStatus.WON:
            ticket = row.ticket(req.lease_ms, now, req.history_ttl_ms)
            return ClaimOutcome(status=status, run=row.to_run(), ticket=ticket, backend_now_ms=now)
        if status is ClaimStatus.SKIPPED:
            return ClaimOutcome(status=status, run=row.to_run(), backend_now_ms=now)
        if not row.token and row.reason and row.reason.startswith("unknown"):
            logger.warning(
                "job %s slot %s not run: %s",
                req.job,
                req.slot,
                row.reason,
                extra={"job": req.job, "slot": req.slot, "action": "claim_refused_unknown"},
            )
        return ClaimOutcome(
            status=status,
            run=row.to_run(),
            lease_expires_at_ms=_opt_int(answer.get("expires")),
            backend_now_ms=now,
        )

    async def renew(self, ticket: Ticket) -> Ticket:
        """See :meth:`anarchon.backend.LeaseBackend.renew`."""
        [answer] = await self.renew_many([ticket])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`: one pipeline, one round trip."""
        out: list[Ticket | BackendError | None] = [rules.check_ticket(t) for t in tickets]
        sent = [n for n, error in enumerate(out) if error is None]
        if not sent:
            return [o for o in out if o is not None]
        calls = [
            (
                self._keys.job(tickets[n].job).all(),
                self._a(
                    slot_key=tickets[n].slot_key,
                    token=tickets[n].token,
                    fence=tickets[n].fence,
                    lease_ms=tickets[n].lease_ms,
                ),
            )
            for n in sent
        ]
        # A renewal that hangs longer than a third of the lease is better retried.
        timeout = min(CALL_TIMEOUT_S, max(0.5, min(tickets[n].lease_ms for n in sent) / 3000))
        answers = await guarded(self._runner().call_many("renew", calls), self._where, timeout)
        for n, answer in zip(sent, self._items(answers, transient_raise=False), strict=True):
            ticket = tickets[n]
            if isinstance(answer, BackendError):
                out[n] = answer
            else:
                lost = _lost(ticket, answer)
                out[n] = lost or ticket.renewed(int(answer["expires"]), int(answer["now"]))
        return [o for o in out if o is not None]

    async def release(self, ticket: Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; wakes the backups at once."""
        answer = await self._call(
            "release",
            ticket.job,
            self._a(
                slot_key=ticket.slot_key,
                token=ticket.token,
                fence=ticket.fence,
                channel=self._keys.channel,
            ),
        )
        lost = _lost(ticket, answer)
        if lost is not None:
            raise lost

    async def finish(self, ticket: Ticket, status: str, error: str | None) -> Run:
        """See :meth:`anarchon.backend.Backend.finish`; prunes the job's history in the same
        script (by ``ticket.history_ttl_ms`` and ``history_size``)."""
        [answer] = await self.finish_many([(ticket, status, error)])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: one pipeline, one round trip;
        each result is its own script (record, prune, notify)."""
        if not items:
            return []
        calls = [
            (
                self._keys.job(ticket.job).all(),
                self._a(
                    slot_key=ticket.slot_key,
                    attempt=ticket.attempt,
                    token=ticket.token,
                    fence=ticket.fence,
                    status=RunStatus(status).value,
                    error=error,
                    history_ttl_ms=_ttl(ticket.history_ttl_ms),
                    history_size=self.history_size,
                    prune_batch=rules.PRUNE_BATCH,
                    prune_scan=PRUNE_SCAN,
                    channel=self._keys.channel,
                ),
            )
            for ticket, status, error in items
        ]
        answers = await guarded(
            self._runner().call_many("finish", calls), self._where, CALL_TIMEOUT_S
        )
        out: list[Run | BackendError] = []
        for (ticket, _, _), answer in zip(
            items, self._items(answers, transient_raise=False), strict=True
        ):
            if isinstance(answer, BackendError):
                out.append(answer)
            else:
                out.append(_lost(ticket, answer) or _row(answer["run"]).to_run())
        return out

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`."""
        error = rules.unstorable(request)
        if error is not None:
            raise error
        answer = await self._call(
            "take_over",
            request.job,
            self._a(
                slot_key=request.slot_key,
                run_id=request.run_id,
                token=request.token,
                instance=request.instance,
                lease_ms=request.lease_ms,
                max_attempts=request.max_attempts,
                channel=self._keys.channel,
            ),
        )
        now = int(answer["now"])
        status = TakeoverStatus(answer["status"])
        row = _row(answer["run"]) if "run" in answer else None
        ticket = None
        if status is TakeoverStatus.TAKEN:
            assert row is not None
            ticket = row.ticket(request.lease_ms, now, request.history_ttl_ms)
        return TakeoverOutcome(
            status=status,
            run=row.to_run() if row is not None else None,
            ticket=ticket,
            lease_expires_at_ms=_opt_int(answer.get("expires")),
            backend_now_ms=now,
        )

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`; O(log n + limit)."""
        keys = self._keys.job(job).all()
        if limit <= 0:
            return []
        rows = await guarded(
            self._runner().call("history", keys, _args(limit=limit)), self._where, CALL_TIMEOUT_S
        )
        return [_row(json.loads(_text(raw))).to_run() for raw in rows]

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`; one HGET."""
        return (await self.last_slots([job]))[job]

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """See :meth:`anarchon.backend.LeaseBackend.last_slots`: one HGET per job, pipelined."""
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        metas = [self._keys.job(job).meta for job in names]
        client = self._started_client()

        async def read() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for meta in metas:
                pipe.hget(meta, "last_slot")
            return list(await pipe.execute())

        values = await guarded(read(), self._where, CALL_TIMEOUT_S)
        return {
            job: None if value is None else int(value)
            for job, value in zip(names, values, strict=True)
        }

    async def server_time_ms(self) -> int | None:
        """Redis's clock (``TIME``), the one every lease is measured on."""
        client = self._started_client()
        answer = await guarded(client.time(), self._where, CALL_TIMEOUT_S)
        if isinstance(answer, tuple | list) and len(answer) == 2:
            seconds, micros = answer
            return int(seconds) * 1000 + int(micros) // 1000 + self._test_clock_offset_ms
        return None

    # -- notifications ----------------------------------------------------------------------

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        """Call ``on_change(job, slot_key, released)`` on every release (True) and finish
        (False) under this prefix.

        A listener task keeps one subscription open, pings it when quiet, and re-subscribes
        with backoff after a failure (messages published meanwhile are lost; backups then act
        at lease expiry). Waits up to two seconds for the first subscription.
        """
        self._listeners.append(on_change)
        if self._listener is not None:
            return
        client = self._started_client()
        ready = asyncio.Event()
        self._listener = asyncio.ensure_future(self._listen(client, ready))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.wait(), SUBSCRIBE_WAIT_S)

    async def _listen(self, client: Redis | RedisCluster, ready: asyncio.Event) -> None:
        delays = backoff()
        failing = False
        while True:
            pubsub: PubSub | None = None
            try:
                pubsub = client.pubsub()
                await guarded(pubsub.subscribe(self._keys.channel), self._where, CALL_TIMEOUT_S)
                ready.set()
                if failing:
                    logger.info("notifications from Redis resumed", extra={"action": "subscribed"})
                failing, delays = False, backoff()
                try:
                    await self._pump(pubsub)
                except Exception as exc:
                    if not is_driver_error(exc):
                        raise
                    raise translate(exc, self._where) from exc
            except BackendError as exc:
                if not failing:
                    logger.warning(
                        "notifications from Redis interrupted (%s); re-subscribing, backups "
                        "fall back to lease expiry meanwhile",
                        exc,
                        extra={"action": "subscribe_retry"},
                    )
                failing = True
                await asyncio.sleep(next(delays))
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _pump(self, pubsub: PubSub) -> None:
        while True:
            message = await pubsub.get_message(timeout=PUBSUB_PING_S)
            if message is None:  # quiet for a while: make sure the connection still works
                await pubsub.ping()
            elif message.get("type") == "message":
                self._dispatch(message.get("data"))

    def _dispatch(self, data: Any) -> None:
        try:
            job, slot_key, released = json.loads(_text(data))
        except (ValueError, TypeError):
            logger.warning("ignoring a malformed notification %r", data, extra={"action": "notify"})
            return
        for listener in list(self._listeners):
            try:
                listener(str(job), str(slot_key), bool(released))
            except Exception:
                logger.exception(
                    "a change listener failed",
                    extra={"job": job, "slot": slot_key, "action": "notify"},
                )

    def clone(self) -> RedisBackend | None:
        """A new, unstarted backend on the same Redis and prefix with a client of its own, for
        the scheduler's lease keeper thread: from the same URL, or a copy of a plain
        ``redis.asyncio.Redis`` client you passed in (same connection options; closed by the
        copy's :meth:`stop`). None for Sentinel and Cluster clients, which cannot be copied."""
        from redis.asyncio import ConnectionPool, Redis

        twin = RedisBackend(
            self.url if self._given is None else DEFAULT_URL,
            prefix=self.prefix,
            history_size=self.history_size,
        )
        given = self._given
        if given is None:
            return twin
        # Sentinel clients' pools ask the sentinels for the master; Cluster clients route by
        # slot: neither can be rebuilt from connection options alone.
        if type(given) is not Redis or type(given.connection_pool) is not ConnectionPool:
            return None
        pool = given.connection_pool

        def connect() -> Redis:
            return Redis(
                connection_pool=ConnectionPool(
                    connection_class=pool.connection_class, **pool.connection_kwargs
                )
            )

        twin._connect = connect  # type: ignore[method-assign]
        twin.url = f"a copy of {given!r}"
        return twin


def _ttl(history_ttl_ms: int | None) -> int | None:
    """The TTL a script prunes by: None for none; one longer than any stored time keeps
    everything (and stays an exact Lua number)."""
    if not history_ttl_ms or history_ttl_ms <= 0:
        return None
    return min(history_ttl_ms, rules.MAX_MS)


def _lost(ticket: Ticket, answer: dict[str, Any]) -> LeaseLost | None:
    """The :class:`LeaseLost` (the lease rules' wording) if the script refused ``ticket``."""
    lost = answer.get("lost")
    if lost is None:
        return None
    if lost == "released":
        return LeaseLost(f"run {ticket.run_id} of job {ticket.job!r} was handed over")
    if lost == "nobody":
        return lease_lost(ticket, None, None)
    return lease_lost(ticket, answer["attempt"], answer["status"])
