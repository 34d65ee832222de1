"""The contract of :class:`~anarchon.backend.LeaseBackend` on Redis, in the order of
:mod:`anarchon.backend`: each method sends one script per item (``*.lua``) through
:mod:`._connection` and decodes the answer through :mod:`._rows`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ... import backend as contract
from ...errors import BackendError
from ...kit import Action, Run, RunStatus, backoff, log_fields
from ...kit.feed import ChangeFeed, decode_notices, won_notices
from ...kit.lease import PRUNE_BATCH, check_ticket, refused_outcome, retries_first, unstorable
from . import _rows as rows
from . import _timings as timings
from ._connection import Connection, Notifications, renewal_timeout
from ._control import RedisControl
from ._errors import is_permission_refused
from ._keys import DEFAULT_PREFIX, Namespace
from ._options import (
    DEFAULT_URL,
    check_client,
    check_history_size,
    check_url,
    require_driver,
    split_url,
)
from ._registry import RedisRegistry
from ._rows import text
from ._scripts import Call

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
else:
    # redis-py is imported when a backend is built, not before: at run time (for
    # typing.get_type_hints of the constructor) the client's type is Any.
    Redis = RedisCluster = Any

__all__ = ["RedisBackend"]


OPEN_RUNS_PART: Final = 500
"""Jobs of one call of the open_runs script in :meth:`RedisBackend.open_runs` on one server
(under a millisecond of the server's time: claims wait no longer); half as many in a call that
reads their newest attempts too (the first read since start)."""

OPEN_SCAN_MIN_JOBS: Final = 1_000
"""A call of :meth:`RedisBackend.open_runs` that asks again for at least this many jobs, on one
server, reads only those whose index of open attempts exists (found by one SCAN of the
database, :data:`OPEN_SCAN_KEYS_PER_JOB`), not every job's index: the pass every minute of
an instance of 100 000 jobs sent 200 000 keys, about 0.25 s of its CPU."""
OPEN_SCAN_KEYS_PER_JOB: Final = 20
"""... while the database holds at most this many keys per job this backend has asked for (a
job has at most five): past it, a SCAN would visit more keys, mostly other applications', than
reading each job's index costs."""
OPEN_SCAN_COUNT: Final = 2_000
"""Keys a SCAN call visits (well under a millisecond of the server's time: claims wait no
longer)."""


class RedisBackend(contract.LeaseBackend):
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
        require_driver()
        self.history_size = check_history_size(history_size)
        if client is not None:
            check_client(url, client)
            self._connection = Connection.to_client(client)
        else:
            check_url(url)
            self._connection = Connection.to_url(url)
        self.url = url
        self.prefix = prefix
        self._keys = Namespace(prefix)
        # Names every claim sends, made once.
        self._pauses_key = self._keys.control.pauses
        self._claims_channel = self._keys.claims_channel
        self._connection.owner = repr(self)
        self._feed = ChangeFeed(self.name)
        # Claim notices come on a subscription (connection) of their own.
        self._claims_feed = ChangeFeed(self.name)
        self._claims_refused = False
        #: Test-only: milliseconds added to Redis's clock in every script (0 in production;
        #: see tests/conformance/test_differential.py).
        self._test_clock_offset_ms = 0
        # The jobs whose newest attempts open_runs() has read since start() (see there).
        self._open_read: set[str] = set()
        # The jobs found with an index of open attempts by the last SCAN (None: SCAN was not
        # worth it), and when (monotonic s): see _jobs_with_open_attempts.
        self._open_scan: tuple[float, frozenset[str] | None] | None = None

    @classmethod
    def from_url(cls, url: str) -> RedisBackend:
        """Build the backend from ``redis://host:6379/0?prefix=app:&history_size=500``.

        ``prefix`` and ``history_size`` are the backend's; every other query option is passed
        on to redis-py. ``rediss://`` (TLS) and ``unix://`` work as in redis-py.
        """
        rest, options = split_url(url)
        return cls(rest, **options)

    def __repr__(self) -> str:
        return f"RedisBackend({self._connection.shown}, prefix={self.prefix!r})"

    def _args(self, **values: Any) -> str:
        return rows.arguments(values, self._test_clock_offset_ms)

    def _on_cluster(self) -> bool:
        return self._connection.on_cluster

    # -- Backend ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, check the server answers, and load the scripts. Idempotent.

        Raises :class:`~anarchon.errors.BackendUnavailable` if Redis cannot be reached.
        """
        self._open_read.clear()
        self._open_scan = None
        if not self._connection.opened:
            await self._connection.open()

    async def stop(self) -> None:
        """Stop listening and close the client this backend created (never one passed in)."""
        await self._feed.stop()
        await self._claims_feed.stop()
        await self._connection.close()

    async def claim(self, requests: Sequence[contract.ClaimRequest]) -> list[contract.ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`; all in one pipeline (one round trip): on
        one server, up to :data:`~._rows.CLAIMS_PER_CALL` claims per script call, on a cluster
        one (its jobs' keys lie in many slots). The won claims are announced on
        ``<prefix>_claims`` (:meth:`subscribe_claims`): a claim alone by its script, a batch in
        one message per 500 claims, published without waiting."""
        reqs = list(requests)
        if len(reqs) == 1:
            return [await self._claim_one(reqs[0])]
        return await self._claim_batch(reqs)

    async def _claim_batch(self, reqs: list[contract.ClaimRequest]) -> list[contract.ClaimOutcome]:
        """:meth:`claim` of any number of requests."""
        if not reqs:
            return []
        errors = [unstorable(r) for r in reqs]
        sent = [reqs[n] for n, error in enumerate(errors) if error is None]
        pauses_key = [self._pauses_key]
        held: dict[str, str] | None = None
        per_call = rows.CLAIMS_PER_CALL
        if sent and self._on_cluster():
            # The pauses live in another cluster slot than the jobs' keys: read them first.
            pauses_key, per_call = [], 1
            held = await self.control().held([req.job for req in sent])
        # One claim announces itself from its script (no extra command); a batch is announced
        # by one message after it (Connection.announce).
        alone = self._claims_channel if len(sent) == 1 else None
        answers = iter(await self._claimed(sent, pauses_key, held, alone, per_call))
        out: list[contract.ClaimOutcome] = []
        for req, error in zip(reqs, errors, strict=True):
            answer = error or next(answers)
            if isinstance(answer, BackendError):
                out.append(refused_outcome(req, 0, answer))
            else:
                out.append(rows.claim_outcome(req, answer))
        if len(sent) > 1:
            # The won claims' notices, one message per batch, sent while the runs start.
            notices = rows.notice_messages(won_notices(out))
            self._connection.announce(self._claims_channel, notices)
        return out

    async def _claim_one(self, req: contract.ClaimRequest) -> contract.ClaimOutcome:
        """:meth:`claim` of one request (what the scheduler sends for most slots): the same
        script call, answers and errors, without the lists and loops of a batch."""
        error = unstorable(req)
        if error is not None:
            return refused_outcome(req, 0, error)
        if self._on_cluster():
            [outcome] = await self._claim_batch([req])
            return outcome
        answer = await self._connection.script_answer(
            "claim",
            [*self._keys.job(req.job), self._pauses_key],
            rows.claim_arguments(
                req,
                claims_channel=self._claims_channel,
                clock_offset_ms=self._test_clock_offset_ms,
            ),
            transient_raise=True,
        )
        if isinstance(answer, BackendError):
            return refused_outcome(req, 0, answer)
        return rows.claim_outcome(req, answer[0])

    async def _claimed(
        self,
        reqs: list[contract.ClaimRequest],
        pauses_key: list[str],
        held: dict[str, str] | None,
        alone: str | None,
        per_call: int,
    ) -> list[rows.ClaimAnswer | BackendError]:
        """The claim script's answer to each request (or the error of its call), ``per_call``
        requests to a script call, all calls in one pipeline. A call of several that failed is
        sent again one claim per call, so that only the claim at fault gets the error."""
        parts = [reqs[at : at + per_call] for at in range(0, len(reqs), per_call)]
        calls = []
        for part in parts:
            keys: list[str] = []
            args: list[str] = []
            for req in part:
                keys += self._keys.job(req.job)
                args += rows.claim_arguments(
                    req,
                    rows.pauses_of(held, req.job),
                    claims_channel=alone,
                    clock_offset_ms=self._test_clock_offset_ms,
                )
            calls.append((keys + pauses_key, args))
        answers = await self._connection.scripts("claim", calls, transient_raise=True)
        out: list[rows.ClaimAnswer | BackendError] = []
        for part, answer in zip(parts, answers, strict=True):
            if not isinstance(answer, BackendError):
                out += answer
            elif len(part) == 1:
                out.append(answer)
            else:
                out += await self._claimed(part, pauses_key, held, alone, 1)
        return out

    async def finish_many(
        self, items: Sequence[contract.FinishRequest]
    ) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: one pipeline, one round trip;
        each result is its own script (record, store its retry, prune). The backups hear of the
        finishes on ``<prefix>_changes``: a result alone from its script, a batch in one
        message per 500 results, published without waiting.

        A retry goes into the requests hash from the script that accepts its result. On a
        Redis Cluster that hash lies in another slot than the job's keys, so each retry is
        stored first (``HSETNX``, once per id) and its result after: a retry is never lost,
        and one whose result is then refused is removed again (if the hash still holds it
        as stored: never another run's request of its id)."""
        if not items:
            return []
        on_cluster = self._on_cluster()
        refused = await retries_first(self.control(), items) if on_cluster else {}
        requests_key = [] if on_cluster else [self._keys.control.requests]
        # One result announces itself from its script; a batch, by one message after it.
        alone = self._keys.channel if len(items) == 1 else None
        sent = [n for n in range(len(items)) if n not in refused]
        calls = [
            (
                [*self._keys.job(ticket.job), *requests_key],
                self._args(
                    **rows.held_fields(ticket),
                    attempt=ticket.attempt,
                    status=RunStatus(status).value,
                    error=error,
                    history_ttl_ms=rows.prune_ttl(ticket.history_ttl_ms),
                    history_size=self.history_size,
                    prune_batch=PRUNE_BATCH,
                    prune_scan=rows.PRUNE_SCAN,
                    channel=alone,
                    retry_id=None if retry is None or on_cluster else retry.id,
                    retry=None if retry is None or on_cluster else retry.to_json(),
                ),
            )
            for ticket, status, error, retry in (items[n] for n in sent)
        ]
        answered = await self._connection.scripts("finish", calls) if calls else []
        answers = dict(zip(sent, answered, strict=True))
        out: list[Run | BackendError] = []
        finished: list[tuple[str, str]] = []
        for n, item in enumerate(items):
            answer = refused[n] if n in refused else answers[n]
            if isinstance(answer, BackendError):
                out.append(answer)
                continue
            lost = rows.lost(item.ticket, answer)
            if lost is None:
                finished.append((item.ticket.job, item.ticket.slot_key))
            elif item.retry is not None and on_cluster:
                await self.control().forget(item.retry)
            out.append(lost or rows.stored_run(answer["run"]))
        if alone is None:
            self._connection.announce(self._keys.channel, rows.change_messages(finished))
        return out

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`; O(log n + limit)."""
        keys = self._keys.job(job).all()
        if limit <= 0:
            return []
        return rows.runs(await self._connection.script("history", keys, self._args(limit=limit)))

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """See :meth:`anarchon.backend.Backend.histories`: the history script of each job, all
        in one pipeline (one round trip to each server of a cluster)."""
        names = list(dict.fromkeys(jobs))
        if limit <= 0 or not names:
            return {job: [] for job in names}
        args = self._args(limit=limit)
        calls: list[Call] = [(self._keys.job(job).all(), args) for job in names]
        answers = await self._connection.script_raw_many("history", calls)
        return {job: rows.runs(answer) for job, answer in zip(names, answers, strict=True)}

    async def server_time_ms(self) -> int | None:
        """Redis's clock (``TIME``), the one every lease is measured on."""
        now = await self._connection.time_ms()
        return None if now is None else now + self._test_clock_offset_ms

    async def subscribe_claims(self, on_claims: contract.ClaimListener) -> bool:
        """Call ``on_claims`` with the notices :meth:`claim` publishes on ``<prefix>_claims``
        (see ``_keys``), on a subscription of its own. False (and one
        ``claim_notices_refused`` warning) if Redis refuses the subscription (an ACL): the
        scheduler then claims every slot, as without notices."""
        if self._claims_refused:
            return False
        self._claims_feed.add_claims(on_claims)
        if self._claims_feed.running:
            return True
        client = self._connection.client()
        logger = self._claims_feed.logger
        stream = Notifications(
            client,
            self._connection.where,
            self._keys.claims_channel,
            lambda data: decode_notices(text(data), logger),
        )
        try:
            await stream.subscribe()
        except BackendError as exc:
            if not is_permission_refused(exc):
                raise
            self._claims_refused = True
            logger.warning(
                "Redis refused the claim notices' channel %s (%s); every instance claims every "
                "slot (grant the user the channel to rank claims)",
                self._keys.claims_channel,
                exc,
                extra=log_fields(Action.CLAIM_NOTICES_REFUSED),
            )
            await self._claims_feed.stop()
            return False
        self._claims_feed.start(stream.next_changes, delays=backoff, errors=(BackendError,))
        return True

    def registry(self) -> RedisRegistry:
        """The registry, in three keys of its own under the prefix (see ``_registry``)."""
        return RedisRegistry(self)

    def control(self) -> RedisControl:
        """Pauses and run requests, in two hashes under the prefix (see ``_control``); the
        claim script reads the same pauses."""
        return RedisControl(self)

    # -- LeaseBackend -----------------------------------------------------------------------

    async def renew_many(
        self, tickets: Sequence[contract.Ticket]
    ) -> list[contract.Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`: one pipeline, one round trip."""
        out: list[contract.Ticket | BackendError | None] = [check_ticket(t) for t in tickets]
        sent = [n for n, error in enumerate(out) if error is None]
        if not sent:
            return [o for o in out if o is not None]
        calls = [
            (
                self._keys.job(tickets[n].job).all(),
                self._args(**rows.held_fields(tickets[n]), lease_ms=tickets[n].lease_ms),
            )
            for n in sent
        ]
        timeout = renewal_timeout(min(tickets[n].lease_ms for n in sent))
        answers = await self._connection.scripts("renew", calls, timeout_s=timeout)
        for n, answer in zip(sent, answers, strict=True):
            ticket = tickets[n]
            if isinstance(answer, BackendError):
                out[n] = answer
            else:
                lost = rows.lost(ticket, answer)
                out[n] = lost or ticket.renewed(int(answer["expires"]), int(answer["now"]))
        return [o for o in out if o is not None]

    async def take_over(self, request: contract.TakeoverRequest) -> contract.TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`."""
        error = unstorable(request)
        if error is not None:
            raise error
        answer = await self._connection.script_json(
            "take_over",
            self._keys.job(request.job).all(),
            self._args(**rows.takeover_fields(request), channel=self._keys.channel),
        )
        return rows.takeover_outcome(request, answer)

    async def release(self, ticket: contract.Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; wakes the backups at once."""
        answer = await self._connection.script_json(
            "release",
            self._keys.job(ticket.job).all(),
            self._args(**rows.held_fields(ticket), channel=self._keys.channel),
        )
        lost = rows.lost(ticket, answer)
        if lost is not None:
            raise lost

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """See :meth:`anarchon.backend.LeaseBackend.last_slots`: each job's ``last_slot``, in
        one round trip (:meth:`Connection.hget_ints`)."""
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        metas = [self._keys.meta(job) for job in names]
        values = await self._connection.hget_ints(metas, "last_slot")
        return dict(zip(names, values, strict=True))

    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        """See :meth:`anarchon.backend.LeaseBackend.open_runs`: each job's index of its open
        attempts (``:leases``, kept by the scripts: running, live, expired or released), read by
        the open_runs script, :data:`OPEN_RUNS_PART` jobs a call on one server (a job a call on
        a cluster), all in one pipeline. A job with no open attempt costs Redis the read of an
        empty key and the client nothing (every instance asks every minute: the safety net).

        The first time since :meth:`start` a job is asked for, its
        :data:`~anarchon.backend.OPEN_RUNS_LOOKBACK` newest attempts are read as well, by the
        same script in the same pipeline (100 000 jobs: 400 calls, not 100 000 history calls):
        an attempt released by an earlier version of anarchon (before the index kept released
        attempts) is found there, when an instance of this version starts.

        Asked again for at least :data:`OPEN_SCAN_MIN_JOBS` jobs on one server, it reads only the
        jobs whose index exists (a job has it only while it has an open attempt), found by SCAN
        (:meth:`_jobs_with_open_attempts`), unless the database holds many more keys than the
        jobs have."""
        names = list(dict.fromkeys(jobs))
        if not names:
            return []
        unread = [job for job in names if job not in self._open_read]
        read = [job for job in names if job in self._open_read] if unread else names
        on_cluster = self._on_cluster()
        if len(read) >= OPEN_SCAN_MIN_JOBS and not on_cluster:
            holding = await self._jobs_with_open_attempts()
            if holding is not None:
                read = [job for job in read if job in holding]
        calls: list[Call] = []
        # A job read before: its index. Read for the first time: its newest attempts as well,
        # in the same call (half as many jobs a call: each costs the server two reads).
        for part, newest in ((read, None), (unread, contract.OPEN_RUNS_LOOKBACK)):
            per_call = 1 if on_cluster else OPEN_RUNS_PART // (1 if newest is None else 2)
            for at in range(0, len(part), per_call):
                keys: list[str] = []
                for job in part[at : at + per_call]:
                    job_keys = self._keys.job(job)
                    keys += (job_keys.leases, job_keys.runs)
                    if newest is not None:
                        keys.append(job_keys.order)
                args = [str(since_ms)] if newest is None else [str(since_ms), str(newest)]
                calls.append((keys, args))
        found: dict[tuple[str, str], Run] = {}
        for answer in await self._connection.script_raw_many("open_runs", calls):
            for run in contract.still_open(rows.open_runs(answer), since_ms):
                found[run.job, run.run_id] = run
        self._open_read.update(unread)
        return list(found.values())

    async def _jobs_with_open_attempts(self) -> frozenset[str] | None:
        """The jobs under this prefix that have an index of open attempts (a ``:leases``
        key), by one SCAN of the database that serves for :data:`._timings.OPEN_SCAN_FRESH_S`; None
        when the database holds more than :data:`OPEN_SCAN_KEYS_PER_JOB` keys per job asked
        for (then every job's index is read)."""
        now = time.monotonic()
        if self._open_scan is not None and now - self._open_scan[0] < timings.OPEN_SCAN_FRESH_S:
            return self._open_scan[1]
        found: frozenset[str] | None = None
        limit = OPEN_SCAN_KEYS_PER_JOB * len(self._open_read)
        if await self._connection.dbsize() <= limit:
            keys = await self._connection.scan_keys(self._keys.leases_pattern, OPEN_SCAN_COUNT)
            found = frozenset(filter(None, map(self._keys.job_of_leases, keys)))
        self._open_scan = (now, found)
        return found

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        """Call ``on_change(job, slot_key, released)`` on every release (True) and finish
        (False) under this prefix.

        A listener task keeps one subscription open, pings it when quiet, and re-subscribes
        with backoff after a failure (messages published meanwhile are lost; backups then act
        at lease expiry). The first subscriber waits up to two seconds for the subscription.
        A listener that raises is logged and the others still hear of it.
        """
        client = self._connection.client()
        self._feed.add(on_change)
        if not self._feed.running:
            stream = Notifications(client, self._connection.where, self._keys.channel)
            self._feed.start(stream.next_changes, delays=backoff, errors=(BackendError,))
            await self._feed.wait_live(timings.SUBSCRIBE_WAIT_S)

    def clone(self) -> RedisBackend | None:
        """A new, unstarted backend on the same Redis and prefix with a client of its own, for
        the scheduler's lease keeper thread: from the same URL, or a copy of a plain
        ``redis.asyncio.Redis`` client you passed in (same connection options; closed by the
        copy's :meth:`stop`). None for Sentinel and Cluster clients, which cannot be copied."""
        connection = self._connection.copy()
        if connection is None:
            return None
        twin = RedisBackend(self.url, prefix=self.prefix, history_size=self.history_size)
        if connection.where != self._connection.where:  # a copy of the client passed in
            twin.url = connection.where
        twin._connection = connection
        connection.owner = repr(twin)
        return twin
