"""The Redis backend's way to Redis: the client, the bounded call, pipelines and pub/sub.

Every call to Redis goes through :func:`bounded` (:func:`anarchon.kit.calls.bounded_call`,
its driver errors translated by :mod:`._errors`), and those of a started backend through
:class:`Connection`, which logs one line when Redis stops answering (``backend_unavailable``)
and one when it answers again (``backend_recovered``), not one per failed call.
:class:`Notifications` keeps the pub/sub subscription that wakes backups, re-made with backoff
after a failure (``notifications_lost``, ``notifications_resumed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from ...backend import ChangeEvent, ClaimNotice
from ...errors import BackendError, BackendUnavailable, InvalidOption
from ...kit import Action, log_fields, redact_url
from ...kit.calls import Deadlines, Outage, bounded_call
from . import _timings as timings
from ._errors import is_driver_error, is_unreachable, translate, translator
from ._rows import text
from ._scripts import Args, Call, ScriptRunner

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub
    from redis.asyncio.cluster import RedisCluster
    from redis.backoff import AbstractBackoff

    Client = Redis | RedisCluster

__all__ = ["Connection", "Notifications", "bounded"]

T = TypeVar("T")

logger = logging.getLogger("anarchon.backends.redis")

# redis-py's own retries on a lost connection, before the core's backoff takes over.
DRIVER_RETRIES: Final = 2
# hget_many() reads this many keys per script call (a call holds the server about 1 ms).
HGET_SCRIPT_KEYS: Final = 2_000
# A script's answer (JSON the script wrote) decoded by the JSON scanner itself: json.loads
# adds two regular-expression matches and three calls around it (about a third of its cost
# on a claim's answer), checks our own scripts' output does not need.
_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


async def bounded(
    aw: Awaitable[T], where: str, timeout_s: float | None = timings.CALL_TIMEOUT_S
) -> T:
    """Await a call to Redis with :func:`anarchon.kit.calls.bounded_call`: driver errors
    translated, abandoned after ``timeout_s``.

    The shield matters on Redis: redis-py (>= 8 sends every command through
    ``asyncio.wait_for`` when ``socket_timeout`` is set, its default) can swallow a
    cancellation that arrives as a write completes on Python 3.11, and the scheduler cancels
    tasks that may be talking to Redis (lease renewals, skew checks) when a run ends and on
    stop; behind the shield, cancelling the caller always cancels the caller. The inner task is
    cancelled too; if it finishes its command anyway, no harm done: every script is safe to
    have run once more or less from a caller that went away.
    """
    return await bounded_call(
        aw, where=f"Redis {where}", timeout_s=timeout_s, translate=translator(where)
    )


def renewal_timeout(lease_ms: int) -> float:
    """How long a renewal may take: a renewal that hangs longer than a third of the lease is
    better retried."""
    return min(timings.CALL_TIMEOUT_S, max(0.5, lease_ms / 3000))


def _policies(config: Any) -> set[str]:
    """The maxmemory-policy values in a CONFIG GET answer: ``{name: value}`` from one server,
    ``{node: {name: value}}`` from a cluster."""
    if not isinstance(config, dict):
        return set()
    found = set()
    for key, value in config.items():
        if isinstance(value, dict):
            found |= _policies(value)
        elif text(key) == "maxmemory-policy":
            found.add(text(value))
    return found


def _cancellable(client: Client) -> bool:
    """Whether every command of ``client`` ends at once when its task is cancelled, so that
    :meth:`Connection.call` may await it in the caller's task (``bounded_call``'s ``inline``):
    a client on one server (plain or Sentinel) with no ``socket_timeout``, the backend's own
    by default (see :func:`_from_url`). With a ``socket_timeout`` redis-py sends each command
    through ``asyncio.wait_for``, which can swallow a cancellation on Python 3.11; a cluster
    client routes through more layers than were checked. Those keep a task of their own."""
    pool = getattr(client, "connection_pool", None)
    options = getattr(pool, "connection_kwargs", None)
    return isinstance(options, dict) and options.get("socket_timeout") is None


def _from_url(url: str) -> Callable[[], Redis]:
    """The client of a backend made from ``url``.

    Without a ``socket_timeout`` in the URL, redis-py is given none (its default is 5 s): every
    call is bounded by :func:`bounded` already (:data:`~._timings.CALL_TIMEOUT_S`, a third of
    the lease for a renewal), which cancels a call that takes too long, and redis-py closes a
    connection whose command was cancelled mid-way, as it does one that timed out. redis-py's
    own timeout wraps every command's write in ``asyncio.wait_for``, a task of its own on
    Python 3.11: about 30 us of CPU per command, a tenth of a claim's. Connecting stays
    bounded by ``socket_connect_timeout`` (:data:`~._timings.CALL_TIMEOUT_S` unless the URL
    says otherwise).
    """

    def connect() -> Redis:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.exceptions import ConnectionError, TimeoutError

        # The URL's own query options win over these keyword arguments. retry_on_error: before
        # redis-py 6, a command is retried only on the errors it names, whatever ``retry`` says.
        return Redis.from_url(
            url,
            retry=Retry(_jitter_backoff(base=0.05, cap=0.5), DRIVER_RETRIES),
            retry_on_error=[ConnectionError, TimeoutError],
            socket_timeout=None,
            socket_connect_timeout=timings.CALL_TIMEOUT_S,
        )

    return connect


def _jitter_backoff(base: float, cap: float) -> AbstractBackoff:
    """redis-py's backoff between its retries of a command: a random delay up to
    ``base * 2**failures``, at most ``cap`` seconds. As redis-py's ``ExponentialWithJitterBackoff``
    computes it; that class is only in redis-py 5.3 and later, and ``redis>=5.0.1`` is allowed."""
    from redis.backoff import AbstractBackoff

    class JitterBackoff(AbstractBackoff):
        def compute(self, failures: int) -> float:
            return min(cap, random.random() * base * float(2**failures))

    return JitterBackoff()


def _close_unstarted(counted: Coroutine[Any, Any, Any], aw: Awaitable[Any]) -> None:
    """Close ``aw`` if ``counted`` (the coroutine that awaits it, given to
    :func:`bounded_call`) never began: its task was cancelled first, so it never will, and
    bounded_call closes ``counted`` alone (``aw`` would be "never awaited")."""
    if inspect.getcoroutinestate(counted) == inspect.CORO_CREATED and inspect.iscoroutine(aw):
        aw.close()


class Connection:
    """One backend's client (made from a URL, or given), its scripts, and every call made on it.

    :param where: how messages name the server (a redacted URL, or the given client's repr).
    :param connect: makes the client at :meth:`open`.
    :param given: the client the caller passed in, if any: :meth:`close` never closes it.
    """

    #: How "not started" errors name the backend (the backend sets its repr).
    owner = "the Redis backend"

    def __init__(
        self, where: str, connect: Callable[[], Client], given: Client | None = None
    ) -> None:
        self.where = where
        # What bounded() would make on every call, made once: claims are the hot path.
        self._named = f"Redis {where}"
        self._translate = translator(where)
        self._connect = connect
        self._given = given
        self._client: Client | None = None
        self._scripts: ScriptRunner | None = None
        self._cluster = False
        # Whether calls may run in the caller's task (see _cancellable).
        self._inline = False
        # The limits of the calls made inline, kept by one timer (see Deadlines).
        self._deadlines = Deadlines()
        self._outage = Outage(logger, f"Redis {where}")
        self._announcing: set[asyncio.Future[None]] = set()
        # The calls in flight (see _close_after_calls), and what close() waits on for them.
        self._in_flight = 0
        self._idle: asyncio.Event | None = None

    @classmethod
    def to_url(cls, url: str) -> Connection:
        """A connection that makes (and closes) its own client from ``url``."""
        return cls(redact_url(url), _from_url(url))

    @classmethod
    def to_client(cls, client: Client) -> Connection:
        """A connection on a client the caller keeps (and closes)."""
        return cls(repr(client), lambda: client, given=client)

    @property
    def shown(self) -> str:
        """The server as the backend's repr shows it."""
        return self.where if self._given is not None else repr(self.where)

    def copy(self) -> Connection | None:
        """An unopened connection with a client of its own on the same server: from the same
        URL, or a copy of a plain ``redis.asyncio.Redis`` client (same connection options).
        None for Sentinel and Cluster clients: the first ask the sentinels for the primary,
        the second route by slot, so neither can be rebuilt from connection options alone."""
        from redis.asyncio import ConnectionPool, Redis

        given = self._given
        if given is None:
            return Connection(self.where, self._connect)
        if type(given) is not Redis or type(given.connection_pool) is not ConnectionPool:
            return None
        pool = given.connection_pool

        def connect() -> Redis:
            return Redis(
                connection_pool=ConnectionPool(
                    connection_class=pool.connection_class, **pool.connection_kwargs
                )
            )

        return Connection(redact_url(f"a copy of {given!r}"), connect)

    # -- life cycle -------------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` succeeded and :meth:`close` has not been called since."""
        return self._scripts is not None

    async def open(self) -> None:
        """Make the client, check the server answers and load the scripts; warn about an
        eviction policy that may drop records."""
        client = self._connect()
        from redis.asyncio.cluster import RedisCluster

        if isinstance(client, RedisCluster) and not hasattr(client, "pubsub"):
            import redis

            raise InvalidOption(
                f"a RedisCluster client needs redis-py 8.0 or later (this is {redis.__version__}):"
                " the backend's notifications publish and subscribe on it, which redis-py's"
                " asyncio cluster client cannot do before 8.0"
            )
        scripts = ScriptRunner(client)
        try:
            await bounded(self._prepare(client, scripts), self.where)
            await self._check_eviction(client)
        except (BackendError, TypeError) as exc:
            if self._given is None:
                await client.aclose()
            if isinstance(exc, TypeError):  # an unknown query option reached redis-py
                raise InvalidOption(f"Redis URL {self.where!r}: {exc}") from exc
            raise type(exc)(f"cannot start the Redis backend: {exc}") from exc
        except BaseException:  # cancelled (a stop during the start): close what was made
            if self._given is None:
                await client.aclose()
            raise
        self._client, self._scripts = client, scripts
        self._cluster = isinstance(client, RedisCluster)
        self._inline = _cancellable(client)

    @staticmethod
    async def _prepare(client: Client, scripts: ScriptRunner) -> None:
        await client.ping()
        await scripts.load()

    async def _check_eviction(self, client: Client) -> None:
        """Warn if Redis may evict our keys: an evicted record lets a slot run twice."""
        try:
            config = await bounded(client.config_get("maxmemory-policy"), self.where)
        except BackendError:
            return  # CONFIG is often disabled on managed Redis; nothing to check then
        for policy in sorted(p for p in _policies(config) if p.startswith("allkeys")):
            logger.warning(
                "Redis maxmemory-policy is %s: under memory pressure Redis may evict anarchon's "
                "records and a slot could run twice; use noeviction or a volatile-* policy",
                policy,
                extra=log_fields(Action.EVICTION_POLICY),
            )

    async def close(self) -> None:
        """Let announcements on their way finish (briefly), forget the client, and close it
        if this connection made it, with the connections that calls still in flight give back
        (see :meth:`_close_after_calls`)."""
        announcing, self._announcing = self._announcing, set()
        if announcing:
            _, late = await asyncio.wait(announcing, timeout=timings.ANNOUNCE_WAIT_S)
            for task in late:
                task.cancel()
        client, self._client, scripts, self._scripts = self._client, None, self._scripts, None
        if scripts is not None:
            await scripts.release_lane()
        if client is not None and self._given is None:
            from redis.asyncio import Redis

            await client.aclose()
            if isinstance(client, Redis):
                # A client built on a pool (a copy of a given client) leaves that pool open.
                await client.connection_pool.disconnect()
                await self._close_after_calls(client.connection_pool)

    async def _close_after_calls(self, pool: Any) -> None:
        """Close the connections that calls still in flight when ``pool`` was closed give back.

        Such a call (a ``run_now()`` reading history as its scheduler stops) has its connection
        closed under it; redis-py tries it again on a new connection, which the call then gives
        back to the pool open, and nothing but the garbage collector would close it (a
        ResourceWarning). Each call ends within its limit: wait for them (at most
        :data:`~._timings.CLOSE_CALLS_WAIT_S`), then close the pool's connections again.

        The calls in flight are this connection's own count: every call that takes a
        connection of the pool goes through :meth:`call` (scripts, pipelines, the scripts
        loaded again, every command) or is an announcement (:meth:`announce`), in flight until
        it returns, and a call in a task of its own until that task ends (see
        :meth:`_in_task`). Not counted: a subscription's connection (:class:`Notifications`),
        which the backend's stop() closes before this, and which redis-py closes before giving
        it back to the pool; the calls of :meth:`open`, made before there is a client to
        close."""
        if not self._in_flight:
            return
        idle = self._idle = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timings.CLOSE_CALLS_WAIT_S):
                    await idle.wait()
        finally:
            self._idle = None
        await pool.disconnect()

    def _call_ended(self) -> None:
        """One call in flight less: wake a close() waiting for the last one."""
        self._in_flight -= 1
        if self._idle is not None and not self._in_flight:
            self._idle.set()

    def client(self) -> Client:
        """The open client; :class:`BackendError` before :meth:`open`."""
        if self._client is None:
            raise BackendError(f"{self.owner} is not started; start the scheduler first")
        return self._client

    @property
    def on_cluster(self) -> bool:
        """Whether the open client is a Redis Cluster's; :class:`BackendError` before
        :meth:`open`."""
        self.client()
        return self._cluster

    def _runner(self) -> ScriptRunner:
        self.client()
        assert self._scripts is not None
        return self._scripts

    # -- calls ------------------------------------------------------------------------------

    async def call(self, aw: Awaitable[T], timeout_s: float = timings.CALL_TIMEOUT_S) -> T:
        """:func:`bounded`, logging once when Redis stops answering and once when it answers
        again. An error reply (OOM, READONLY ...) is an answer: it is raised like any failure
        but is no outage, so refused writes between successful reads do not flap the log.
        The call is in flight (see :meth:`_close_after_calls`) until it ends."""
        # In flight while this call waits: two integer operations on every claim (not a call
        # of _call_ended()).
        self._in_flight += 1
        try:
            if self._inline:
                # bounded_call(inline=True, deadlines=...) without its frame: every claim.
                result = await self._deadlines.call(aw, self._named, timeout_s, self._translate)
            else:
                result = await self._counted(aw, timeout_s)
        except BackendUnavailable as exc:
            # No cause: bounded's own timeout; else the driver's exception.
            if exc.__cause__ is None or is_unreachable(exc.__cause__):
                self._outage.failed(exc)
            raise
        finally:
            self._in_flight -= 1
            if self._idle is not None and not self._in_flight:
                self._idle.set()
        if self._outage.down:
            self._outage.answered()
        return result

    async def _counted(self, aw: Awaitable[T], timeout_s: float) -> T:
        """:func:`bounded_call` of ``aw`` (in a task of its own), in flight until that task
        ends (see :meth:`_in_task`)."""
        counted = self._in_task(aw)
        try:
            return await bounded_call(
                counted, where=self._named, timeout_s=timeout_s, translate=self._translate
            )
        except BaseException:
            _close_unstarted(counted, aw)
            raise

    async def _in_task(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` in the task of a :func:`bounded_call`, in flight (see
        :meth:`_close_after_calls`) until it ends: that task may go on after its caller gave
        up on it (cancelled, or past its limit) if redis-py swallows its cancellation."""
        self._in_flight += 1
        try:
            return await aw
        finally:
            self._call_ended()

    async def script(self, name: str, keys: Sequence[str], args: str) -> Any:
        """Run one script and return its raw answer."""
        return await self.call(self._runner().call(name, keys, args))

    async def script_raw_many(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run one script per call in one pipeline and return their raw answers in order; the
        first call that failed raises its error, translated."""
        answers = await self.call(self._runner().call_many(name, calls))
        for answer in answers:
            if isinstance(answer, BaseException):
                raise translate(answer, self.where) from answer
        return answers

    async def script_json(self, name: str, keys: Sequence[str], args: str) -> dict[str, Any]:
        """Run one script and return its decoded JSON answer."""
        decoded: dict[str, Any] = json.loads(text(await self.script(name, keys, args)))
        return decoded

    async def scripts(
        self,
        name: str,
        calls: Sequence[Call],
        *,
        timeout_s: float = timings.CALL_TIMEOUT_S,
        transient_raise: bool = False,
    ) -> list[Any | BackendError]:
        """Run one script per call in one pipeline: each item its decoded JSON answer, or the
        error of that item alone (a transient one is raised for the whole call when
        ``transient_raise``)."""
        answers = await self.call(self._runner().call_many(name, calls), timeout_s)
        return [self._decoded(answer, transient_raise) for answer in answers]

    async def script_answer(
        self, name: str, keys: Sequence[str], args: Args, *, transient_raise: bool = False
    ) -> Any | BackendError:
        """:meth:`scripts` of one call, without the lists around it (a claim of one request,
        the most frequent call)."""
        answer = await self.call(self._runner().call_one(name, keys, args))
        return self._decoded(answer, transient_raise)

    def _decoded(self, answer: Any, transient_raise: bool) -> Any | BackendError:
        """A script's answer decoded (a JSON object or list), or its error reply translated
        (raised if transient and ``transient_raise``)."""
        if not isinstance(answer, BaseException):
            return _scan(text(answer), 0)[0]
        error = translate(answer, self.where)
        if transient_raise and isinstance(error, BackendUnavailable):
            raise error from answer
        return error

    def announce(self, channel: str, messages: Sequence[str]) -> None:
        """PUBLISH ``messages`` on ``channel``, in order, from a task of its own: the caller
        (a claim or a finish on its way back to the scheduler) does not wait for it. Best
        effort: a failure is logged at debug level (a lost claim notice costs another instance
        a losing claim; a lost finish, a backup's check at lease expiry)."""
        if not messages:
            return
        client = self.client()

        async def publish() -> None:
            self._in_flight += 1
            try:
                for message in messages:
                    await self._counted(client.publish(channel, message), timings.CALL_TIMEOUT_S)
            except BackendError as exc:
                logger.debug(
                    "announcement on %s not published: %s",
                    channel,
                    exc,
                    extra=log_fields(Action.NOTIFY),
                )
            finally:
                self._call_ended()

        task = asyncio.ensure_future(publish())
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)

    async def hget_ints(self, keys: Sequence[str], field: str) -> list[int | None]:
        """The integer ``field`` of each hash in ``keys`` (None where it has none), in one round
        trip: on one server, one call of the ``hget_ints`` script per :data:`HGET_SCRIPT_KEYS`
        keys, each answering one string (2 000 HGET answers cost redis-py 30 ms of CPU, that
        string 2.5 ms); on a cluster, whose keys lie in many slots, one HGET per key,
        pipelined."""
        client = self.client()
        if not keys:
            return []
        if self.on_cluster:

            async def pipelined() -> list[int | None]:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.hget(key, field)
                return [None if v is None else int(v) for v in await pipe.execute()]

            return await self.call(pipelined())
        runner = self._runner()
        part = HGET_SCRIPT_KEYS
        calls: list[Call] = [(keys[at : at + part], field) for at in range(0, len(keys), part)]

        async def scripted() -> list[int | None]:
            if len(calls) == 1:
                answers: list[Any] = [await runner.call("hget_ints", *calls[0])]
            else:
                answers = await runner.call_many("hget_ints", calls)
            found: list[int | None] = []
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
                found += [int(v) if v else None for v in text(answer).split(",")]
            return found

        return await self.call(scripted())

    async def dbsize(self) -> int:
        """How many keys the client's database holds (``DBSIZE``, O(1)); one server only."""
        return int(await self.call(self.client().dbsize()))

    async def scan_keys(self, pattern: str, count: int) -> set[str]:
        """Every key of the client's database that matches ``pattern`` (``SCAN ... MATCH``,
        about ``count`` keys visited a call, each call bounded on its own); one server only.
        A key present for the whole scan is found; one made or removed meanwhile may not be."""
        client = cast("Redis", self.client())  # on a cluster, each node has its own keys
        found: set[str] = set()
        cursor = 0
        while True:
            cursor, keys = await self.call(client.scan(cursor, match=pattern, count=count))
            found.update(text(key) for key in keys)
            if not int(cursor):
                return found

    async def time_ms(self) -> int | None:
        """The server's clock (``TIME``) in ms, None if it answers something else."""
        answer = await self.call(self.client().time())
        if isinstance(answer, tuple | list) and len(answer) == 2:
            seconds, micros = answer
            return int(seconds) * 1000 + int(micros) // 1000
        return None


class Notifications:
    """The stream of changes under one prefix, for :class:`anarchon.kit.feed.ChangeFeed`: a
    pub/sub subscription to ``channel``, made in the first call (and again in the first call
    after a failure), pinged when quiet so a dead connection is noticed. Messages published
    while it is down are lost (backups then act at lease expiry).

    :param client: the backend's open client.
    :param where: how messages name the server.
    """

    def __init__(
        self,
        client: Client,
        where: str,
        channel: str,
        decode: Callable[[Any], Sequence[ChangeEvent | ClaimNotice]] | None = None,
    ) -> None:
        self._client = client
        self._where = where
        self._channel = channel
        self._decode = decode or self._decode_change
        self._pubsub: PubSub | None = None

    async def subscribe(self) -> None:
        """Subscribe now (the feed's first call then waits for messages); raises
        :class:`BackendError` as :meth:`next_changes` does."""
        await self.next_changes()

    async def next_changes(self) -> Sequence[ChangeEvent | ClaimNotice]:
        """Subscribe if not subscribed (no events then), else wait for the next message (at
        most :data:`._timings.PUBSUB_PING_S`, then ping). Raises :class:`BackendError` when Redis
        fails, after closing the subscription."""
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
                await bounded(self._pubsub.subscribe(self._channel), self._where)
                return []
            return await self._next(self._pubsub)
        except BaseException:
            await self._close()
            raise

    async def _next(self, pubsub: PubSub) -> Sequence[ChangeEvent | ClaimNotice]:
        try:
            message = await pubsub.get_message(timeout=timings.PUBSUB_PING_S)
            if message is None:  # quiet for a while: make sure the connection still works
                await bounded(pubsub.ping(), self._where)
                return []
        except Exception as exc:
            if not is_driver_error(exc):
                raise
            raise translate(exc, self._where) from exc
        if message.get("type") != "message":
            return []
        return self._decode(message.get("data"))

    @staticmethod
    def _decode_change(data: Any) -> list[ChangeEvent]:
        """One change (``[job, slot_key, released]``, a script's) or a JSON list of them (a
        batch of finishes, :func:`encode_changes`)."""
        try:
            value = json.loads(text(data))
            items = value if value and isinstance(value[0], list) else [value]
            events = []
            for job, slot_key, released in items:
                events.append(ChangeEvent(str(job), str(slot_key), bool(released)))
        except (ValueError, TypeError, IndexError, KeyError):
            logger.warning(
                "ignoring a malformed notification %r", data, extra=log_fields(Action.NOTIFY)
            )
            return []
        return events

    async def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
