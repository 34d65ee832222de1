"""The PostgreSQL backend's connections: the pool, liveness, the bounded call.

Every statement the backend runs goes through :meth:`Connections.call`: on a connection of
the backend's own pool (or the caller's pool, or the caller's one connection), within
``timeout_ms``, with the driver's errors translated by :mod:`._errors`. An outage is logged
once when the first call fails (``backend_unavailable``) and once when a call succeeds again
(``backend_recovered``), never per failed call.

A pooled connection that sat idle is looked at before use: if anything arrived on its socket
while it was idle (the server's goodbye on a restart or ``pg_terminate_backend``, or the end of
the stream), it is tested with an empty round trip; a quiet one costs no round trip. After a
connection error the pool's other idle connections are checked in the background, so one
server restart costs one failed call, not one per pooled connection. A statement nobody waits
for (a winner's claim notices) can be left to run after a call has answered
(:meth:`Connections.defer`): its connection returns to the pool once it is done.

How a statement is sent is :mod:`._statements`' (the base of :class:`Connections`);
transactions, one or many in a round trip, are :mod:`._transactions`', whose class adds them
to this one and is the one the backend uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import select
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from anarchon.errors import BackendError, BackendUnavailable
from anarchon.kit import Action, log_fields
from anarchon.kit.calls import Outage, bounded_call

from ._errors import translate
from ._statements import Rows, Statement, Statements, atomic

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from ._attempts import ConnectAttempts
    from ._options import Options
    from ._queries import Queries

# Rows (a read's answer, defined in _statements) for the registry and the control store.
__all__ = ["Connections", "Rows", "describe_server"]

logger = logging.getLogger("anarchon.backends.postgres")

T = TypeVar("T")

# A pooled connection idle longer than this is looked at before use (see Connections._alive).
IDLE_CHECK_S: Final = 0.5


_warned_libpq = False


def check_libpq() -> None:
    """Refuse a libpq without pipeline mode (older than 14: results are sent in pipelines), and
    warn once per process (``libpq_old``) when it cannot cancel a query without blocking
    (older than 17): a call past ``timeout_ms`` is then cancelled from a thread, without a time
    limit. ``anarchon[postgres]`` installs psycopg's binary package, which carries a libpq 17;
    psycopg's own words name the libpq found."""
    global _warned_libpq
    from psycopg import NotSupportedError, capabilities

    try:
        capabilities.has_pipeline(check=True)
    except NotSupportedError as exc:
        raise BackendError(
            f"the PostgreSQL backend needs libpq 14 or newer: {exc}; install "
            "'anarchon[postgres]' (psycopg's binary package, with libpq 17) or a newer libpq"
        ) from None
    if _warned_libpq:
        return
    try:
        capabilities.has_cancel_safe(check=True)
    except NotSupportedError as exc:
        _warned_libpq = True
        logger.warning(
            "%s: a call past timeout_ms is cancelled from a thread, without a time limit; "
            "'anarchon[postgres]' installs psycopg's binary package, with libpq 17",
            exc,
            extra=log_fields(Action.LIBPQ_OLD),
        )


def describe_server(options: Options) -> str:
    """``host:port/dbname`` of the server, for messages (never a password)."""
    from psycopg import AsyncConnection
    from psycopg.conninfo import conninfo_to_dict

    given = options.pool
    if isinstance(given, AsyncConnection):
        info = given.info
        return f"{info.host}:{info.port}/{info.dbname}"
    conninfo = given.conninfo if given is not None else options.dsn
    if not isinstance(conninfo, str):
        return "(a pool with a conninfo function)"
    try:
        params = conninfo_to_dict(conninfo)
    except Exception:
        return "(unparsable DSN)"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or '(default)'}"


class Connections(Statements):
    """Where the backend's statements run: its own pool, or the caller's pool or connection."""

    def __init__(self, options: Options, queries: Queries, where: str, owner: str) -> None:
        from psycopg import AsyncConnection

        super().__init__(options, queries)
        # Looked up once: an import statement in a function costs a call into importlib every
        # time it runs, once per call on the claim path.
        self._connection_class = AsyncConnection
        self.where = where
        self._owner = owner
        self._given = options.pool
        self._pool: AsyncConnectionPool[Any] | None = None
        # How the own pool's last connection attempt went (see _attempts); None for a given one.
        self._attempts: ConnectAttempts | None = None
        self._conn_lock = asyncio.Lock()
        self._open = False
        self._outage = Outage(logger, f"PostgreSQL {where}")
        self._checking: asyncio.Task[None] | None = None
        # Statements a call's work left to run on its connection after its answer (see defer),
        # and the tasks running them, each holding its connection until it is done.
        self._tails: dict[AsyncConnection[Any], Statement] = {}
        self._tail_tasks: set[asyncio.Task[None]] = set()
        self._last_used: weakref.WeakKeyDictionary[AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary()
        )
        #: Test-only: milliseconds added to the database clock on these connections (0 in
        #: production; see tests/conformance/test_differential.py).
        self.test_clock_offset_ms = 0
        self._clock_offsets: weakref.WeakKeyDictionary[AsyncConnection[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        # Makes a new connection of the backend's own pool ready for claims (see open).
        self._warm: Callable[[AsyncConnection[Any]], Awaitable[None]] | None = None
        self._warmed: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()
        self._call_where = f"PostgreSQL {where}"
        self._call_limit = f"timeout_ms={options.timeout_ms}"
        self._timeout_s = options.timeout_ms / 1000

    # -- opening and closing -------------------------------------------------------------------

    async def open(
        self,
        first: Callable[[AsyncConnection[Any]], Awaitable[None]],
        warm: Callable[[AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        """Open the pool if the backend owns one (waiting for its first connection), then run
        ``first`` (migrations, or a reader's check); close again if it fails. Idempotent.

        ``warm`` runs on every new connection of the backend's own pool before the pool hands
        it out (the pool's ``configure``), and on the first connection once ``first`` has run
        (which may have made what ``warm`` needs): the claim's statements are then planned
        before a claim waits for them (see PostgresBackend._warm). A warm-up that fails is
        ignored: the connection is used unwarmed. A pool or connection the caller gave is not
        warmed (its connections are the caller's)."""
        if self._open:
            return
        self._warm = warm
        check_libpq()
        await self._open_pool()
        self._open = True
        try:
            await self.call(first)
            if warm is not None and self._given is None:
                await self.call(self._warm_once)
        except BaseException:
            await self.close()
            raise

    async def _warm_once(self, conn: AsyncConnection[Any]) -> None:
        """Run the warm-up on ``conn`` unless it ran there already (the pool's ``configure``)."""
        if self._warm is None or conn in self._warmed:
            return
        try:
            await self._warm(conn)
        except Exception:
            # Not there yet (the first connection, before migrations) or the server refused:
            # the warm-up's transaction was rolled back, the connection is good as it is.
            return
        self._warmed.add(conn)

    async def _open_pool(self) -> None:
        from psycopg_pool import AsyncConnectionPool

        from ._attempts import (
            ATTEMPTS_ARG,
            ConnectAttempts,
            PoolConnection,
            open_unless_refused,
            quiet_while_opening,
        )

        timeout_s = self.options.timeout_ms / 1000
        if self._given is None:
            assert self.options.dsn is not None
            attempts = ConnectAttempts()
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.options.dsn,
                min_size=1,
                max_size=self.options.max_connections,
                kwargs={**self._connection_options(), ATTEMPTS_ARG: attempts},
                connection_class=PoolConnection,
                open=False,
                timeout=timeout_s,
                configure=self._warm_once,
                name=f"anarchon-{self.options.schema}.{self.options.table_prefix}",
            )
            try:
                with quiet_while_opening(pool.name):
                    try:
                        opened = await open_unless_refused(pool, attempts, timeout_s)
                    except BaseException:  # also cancelled: a stop during the start
                        await pool.close()
                        raise
                    if not opened:  # refused for good: no retry would connect
                        refused = attempts.refusal
                        await pool.close()
                        raise BackendError(
                            f"PostgreSQL {self.where} refused the connection: {refused}"
                        )
            except BackendError:
                raise
            except Exception as exc:
                why = attempts.failure or translate(exc, self.where) or exc
                raise BackendUnavailable(
                    f"cannot connect to PostgreSQL {self.where} within "
                    f"timeout_ms={self.options.timeout_ms}: {why}; "
                    "check the DSN and that the server is up"
                ) from exc
            self._pool, self._attempts = pool, attempts

    async def close(self) -> None:
        """Close the pool the backend opened (never the caller's), once the statements left to
        run after an answer (:meth:`defer`) are done."""
        self._open = False
        if self._tail_tasks:
            await asyncio.wait(list(self._tail_tasks), timeout=self._timeout_s)
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
            self._checking = None
        pool, self._pool, self._attempts = self._pool, None, None
        if pool is not None:
            await pool.close()

    def _connection_options(self) -> dict[str, Any]:
        from psycopg.conninfo import conninfo_to_dict

        assert self.options.dsn is not None
        options: dict[str, Any] = {
            "autocommit": True,
            # Fail a connection attempt quickly: a claim retried later is better than one stuck.
            "connect_timeout": max(2, self.options.timeout_ms // 1000),
            # Notice a dead peer on an idle connection (the listener's) within about a minute.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        if "application_name" not in conninfo_to_dict(self.options.dsn):
            options["application_name"] = "anarchon"
        if not self.options.prepared_statements:
            options["prepare_threshold"] = None
        return options

    async def connect_listener(self) -> AsyncConnection[Any]:
        """A new connection of its own for LISTEN, to the same server as the pool's."""
        from psycopg import AsyncConnection
        from psycopg.conninfo import make_conninfo

        given = self._given
        if isinstance(given, AsyncConnection):
            conninfo = make_conninfo(given.info.dsn, password=given.info.password or None)
            kwargs: dict[str, Any] = {}
        elif given is not None:
            conninfo = str(await _resolve(given.conninfo))
            kwargs = dict(await _resolve(given.kwargs) or {})
        else:
            assert self.options.dsn is not None
            conninfo, kwargs = self.options.dsn, self._connection_options()
        kwargs.update(autocommit=True)
        kwargs.setdefault("connect_timeout", max(2, self.options.timeout_ms // 1000))
        return await AsyncConnection.connect(conninfo, **kwargs)

    def copyable_dsn(self) -> str | None:
        """A connection string a copy of the backend can open its own pool on, or None when
        it cannot be read (a conninfo function, connection keyword arguments)."""
        from psycopg import AsyncConnection
        from psycopg.conninfo import make_conninfo

        given = self._given
        if given is None:
            return self.options.dsn
        if isinstance(given, AsyncConnection):
            return make_conninfo(given.info.dsn, password=given.info.password or None)
        if isinstance(given.conninfo, str) and not given.kwargs:
            return given.conninfo
        return None

    # -- the bounded call ----------------------------------------------------------------------

    async def call(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a connection within ``timeout_ms``; translate the driver's errors."""
        if not self._open:
            raise BackendError(f"{self._owner} is not started; start the scheduler first")
        try:
            result = await self._bounded(work)
        except BackendUnavailable as exc:
            error = self._with_pool_failure(exc)
            self._outage.failed(error)
            if error is exc:
                raise
            raise error from exc
        if self._outage.down:
            self._outage.answered()
        return result

    def _with_pool_failure(self, exc: BackendUnavailable) -> BackendUnavailable:
        """``exc`` with why the own pool's last connection attempt failed, if it did: a call
        that waited for a connection times out (or the pool does) and says only that; psycopg_pool
        logs its attempts' errors (a password rotated, a role disabled, a server down) and raises
        none of them. See :mod:`._attempts`."""
        failure = self._attempts.failure if self._attempts is not None else None
        if failure is None:
            return exc
        return BackendUnavailable(f"{exc}; the pool's last connection attempt failed: {failure}")

    async def _bounded(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        # On a timeout the call goes on in the background until the driver gives it up; its
        # connection is then discarded. The caller hears at once that the backend did not answer.
        return await bounded_call(
            self._on_connection(work),
            where=self._call_where,
            timeout_s=self._timeout_s,
            limit=self._call_limit,
            translate=self._translate,
        )

    async def _on_connection(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``work`` on a connection: the caller's one connection (one call at a time), else
        one of the pool's, given back when ``work`` ends however it ends."""
        given = self._given
        if isinstance(given, self._connection_class):
            # One connection: one call at a time, or transactions would interleave on it.
            async with self._conn_lock:
                if given.closed or given.broken:
                    raise BackendUnavailable(
                        f"PostgreSQL {self.where}: the connection given to PostgresBackend is "
                        "closed; pass a pool to have broken connections replaced"
                    )
                try:
                    return await self._work_on(given, work)
                finally:
                    tail = self._tails.pop(given, None)
                    if tail is not None:
                        await self.after_commit(given, tail)
        pool = self._pool if given is None else given
        if pool is None:
            raise BackendError(f"{self._owner} is not started; start the scheduler first")
        conn = await self._pooled(pool)
        answered = False
        try:
            result = await self._work_on(conn, work)
            answered = True
            return result
        finally:
            tail = self._tails.pop(conn, None)
            if tail is not None and answered:
                self._start_tail(pool, conn, tail)
            else:
                self._last_used[conn] = time.monotonic()
                await pool.putconn(conn)

    async def _work_on(
        self, conn: AsyncConnection[Any], work: Callable[[AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        # Test-only offsets: production sets none, so the weak dictionary is empty.
        offsets = self._clock_offsets
        if (offsets or self.test_clock_offset_ms) and (
            offsets.get(conn, 0) != self.test_clock_offset_ms
        ):
            await self._set_clock_offset(conn)
        return await work(conn)

    def _translate(self, exc: BaseException) -> BackendError | None:
        """:func:`._errors.translate`; a lost server also has the idle connections checked."""
        error = translate(exc, self.where)
        if isinstance(error, BackendUnavailable):
            self._check_pool()
        return error

    async def _pooled(self, pool: AsyncConnectionPool[Any]) -> AsyncConnection[Any]:
        """A live connection of ``pool`` within ``timeout_ms`` (see :meth:`_alive`)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            conn: AsyncConnection[Any] = await pool.getconn(
                timeout=max(0.01, deadline - time.monotonic())
            )
            try:
                alive = await self._alive(conn)
            except BaseException:
                await pool.putconn(conn)
                raise
            if alive:
                return conn
            # The server ended it (restart, failover, pg_terminate_backend): the pool drops a
            # broken connection it gets back and opens another; test the other idle ones too.
            await pool.putconn(conn)
            self._check_pool()

    async def _alive(self, conn: AsyncConnection[Any]) -> bool:
        """Test a connection that sat idle in the pool.

        A connection used within IDLE_CHECK_S is trusted as it is, so a busy backend pays
        nothing; one killed in that window fails its call, which the scheduler retries. An idle
        one whose socket has nothing to read is trusted too: a server that ended the session
        (restart, failover, ``pg_terminate_backend``) sent its goodbye or closed the stream,
        and either makes the socket readable. Only then is it tested with one round trip (at
        one job a second, 274 of 431 uses paid that round trip when every idle connection
        did). A peer gone silently is not seen by either test; the call's timeout covers it.
        """
        if conn.closed or conn.broken:
            return False
        idle = time.monotonic() - self._last_used.get(conn, 0.0)
        if idle < IDLE_CHECK_S or not conn.autocommit or not _readable(conn):
            return True
        try:
            await conn.execute("", prepare=self.options.prepare)
        except Exception:
            return False
        return True

    def _check_pool(self) -> None:
        """After a connection failed, test the pool's idle connections and replace dead ones."""
        pool = self._pool if self._given is None else self._given
        if pool is None or not hasattr(pool, "check"):
            return
        if self._checking is not None and not self._checking.done():
            return

        async def check() -> None:
            with contextlib.suppress(Exception):
                await pool.check()

        self._checking = asyncio.ensure_future(check())

    async def _set_clock_offset(self, conn: AsyncConnection[Any]) -> None:
        """Test-only: move this connection's database clock by ``test_clock_offset_ms``."""
        offset = self.test_clock_offset_ms
        async with atomic(conn):
            await conn.execute(self._queries["set_clock_offset"], {"offset": str(offset)})
        self._clock_offsets[conn] = offset

    # -- reads and deferred statements ---------------------------------------------------------

    async def read(self, query: bytes, params: dict[str, Any] | None = None) -> Rows:
        """The rows of one read-only statement, in a call of its own."""
        return await self.call(lambda conn: self.select(conn, query, params))

    async def read_if_there(self, query: bytes, params: dict[str, Any] | None = None) -> Rows:
        """Like :meth:`read`, but no rows (not an error) when the statement's table or schema is
        not there yet: the registry's and control's tables are created by their first write."""
        from psycopg import errors

        async def work(conn: AsyncConnection[Any]) -> Rows:
            try:
                return await self.select(conn, query, params)
            except (errors.UndefinedTable, errors.InvalidSchemaName):
                return []

        return await self.call(work)

    def defer(self, conn: AsyncConnection[Any], after: Statement) -> None:
        """Run ``after`` on ``conn`` once the current call's work has answered: the caller has
        its answer without waiting for it, and the connection goes back to the pool only when
        ``after`` is done (on a connection the caller passed in, it runs before the answer, as
        nothing else may use that connection meanwhile). For a statement whose outcome nobody
        waits for, sent after a commit (its failure fails nothing committed)."""
        self._tails[conn] = after

    def _start_tail(
        self, pool: AsyncConnectionPool[Any], conn: AsyncConnection[Any], after: Statement
    ) -> None:
        async def tail() -> None:
            try:
                await asyncio.wait_for(self.after_commit(conn, after), self._timeout_s)
            except BaseException:
                # Timed out or cancelled mid-statement: the connection is in no state to reuse.
                with contextlib.suppress(Exception):
                    await conn.close()
                raise
            finally:
                self._last_used[conn] = time.monotonic()
                await pool.putconn(conn)

        task = asyncio.ensure_future(tail())
        self._tail_tasks.add(task)
        task.add_done_callback(self._tail_done)

    def _tail_done(self, task: asyncio.Task[None]) -> None:
        self._tail_tasks.discard(task)
        if not task.cancelled():
            task.exception()  # seen: a tail that failed failed nothing committed


def _readable(conn: AsyncConnection[Any]) -> bool:
    """Whether the connection's socket has data or an end of stream waiting (no wait)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


async def _resolve(value: Any) -> Any:
    """A pool's ``conninfo`` or ``kwargs``: a value, or a function (maybe async) giving it."""
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value
