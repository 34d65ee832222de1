"""The PostgreSQL lease backend: psycopg 3 (async) over a psycopg_pool connection pool."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._models import Overlap, Run, RunStatus
from ...backend import (
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    LeaseBackend,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from ...errors import BackendError, BackendUnavailable, InvalidOption, LeaseLost, MissingDependency
from .. import _lease_rules as rules
from .._lease_rules import RunRow, answer_existing, lease_lost, pruned_outcome
from ._errors import translate
from ._listener import Listener
from ._queries import SCHEMA_VERSION, Names, Queries, check_schema, check_table_prefix
from ._registry import PostgresRegistry

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ["PostgresBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_DSN: Final = "postgresql://localhost/postgres"
# Without notifications (PgBouncer in transaction mode), backups re-check a watched run this
# often, so a hand-over is noticed within about this long instead of at lease expiry.
POLL_MS: Final = 500
# A pooled connection idle longer than this is tested (one empty round trip) before use.
IDLE_CHECK_S: Final = 0.5
# Batches larger than this are planned for their size with JIT compilation off; smaller ones
# reuse the prepared claim's generic plan (see no_jit, custom_plans, generic_plans in queries.sql).
LARGE_BATCH: Final = 100
# How long start() waits for the first LISTEN before going on without it.
LISTEN_WAIT_S: Final = 2.0
_URL_INTS: Final = ("history_size", "timeout_ms", "max_connections")
_URL_FLAGS: Final = ("notifications", "prepared_statements")
_URL_OPTIONS: Final = ("schema", "table_prefix", *_URL_FLAGS, *_URL_INTS)
# A statement and its parameters; one item of work: statements to run first, then the query
# whose rows are the item's answer, all in one transaction.
Statement = tuple[bytes, dict[str, Any] | None]
Work = tuple[Sequence[Statement], bytes, dict[str, Any]]
_RUN_COLUMNS: Final = (
    "job",
    "slot_key",
    "slot",
    "attempt",
    "run_id",
    "token",
    "instance",
    "trigger",
    "status",
    "fence",
    "started_at",
    "finished_at",
    "lease_expires_at",
    "released",
    "error",
    "reason",
)


def _import_driver() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "PostgresBackend needs psycopg 3 and psycopg_pool: pip install 'anarchon[postgres]'"
        ) from exc


def _positive_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOption(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def _run_row(values: dict[str, Any]) -> RunRow | None:
    if values.get("job") is None:
        return None
    fields = {name: values[name] for name in _RUN_COLUMNS}
    return RunRow(**fields)


def _bool_option(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise InvalidOption(f"URL option {name}={text!r} must be true or false")


class PostgresBackend(LeaseBackend):
    """Claims, leases and history in PostgreSQL tables, for any number of hosts.

    :param dsn: a libpq connection string or URL; the backend opens (and closes) its own pool
        on it. Ignored when ``pool`` is given.
    :param pool: a :class:`psycopg_pool.AsyncConnectionPool` or a single
        :class:`psycopg.AsyncConnection` to use instead; it stays the caller's (never closed).
        A single connection serialises every call and cannot be replaced if it breaks.
    :param schema: the schema of the tables; created if missing.
    :param table_prefix: prefix of the table and index names.
    :param history_size: at most about this many runs are kept per job.
    :param notifications: LISTEN for releases and results so backups act at once. Turn it off
        behind PgBouncer in transaction mode (LISTEN needs a session): backups then poll.
    :param timeout_ms: the longest one call may take, waiting for a connection included, before
        it fails with :class:`~anarchon.errors.BackendUnavailable`.
    :param max_connections: size of the pool the backend opens on ``dsn``.
    :param prepared_statements: let psycopg prepare statements it runs often (faster). Turn it
        off behind PgBouncer in transaction mode before 1.21, which cannot route them.
    """

    name = "postgres"

    def __init__(
        self,
        dsn: str = DEFAULT_DSN,
        pool: AsyncConnectionPool[Any] | AsyncConnection[Any] | None = None,
        schema: str = "public",
        table_prefix: str = "anarchon_",
        *,
        history_size: int = 1000,
        notifications: bool = True,
        timeout_ms: int = 5_000,
        max_connections: int = 10,
        prepared_statements: bool = True,
    ) -> None:
        _import_driver()
        import psycopg
        from psycopg_pool import AsyncConnectionPool

        if pool is not None and not isinstance(pool, AsyncConnectionPool | psycopg.AsyncConnection):
            raise InvalidOption(
                f"pool={pool!r} must be a psycopg_pool.AsyncConnectionPool or a "
                "psycopg.AsyncConnection (the backend is async; sync pools cannot be used)"
            )
        if pool is None and (not isinstance(dsn, str) or not dsn.strip()):
            raise InvalidOption(f"dsn={dsn!r} must be a PostgreSQL connection string or URL")
        for flag, value in (
            ("notifications", notifications),
            ("prepared_statements", prepared_statements),
        ):
            if not isinstance(value, bool):
                raise InvalidOption(f"{flag}={value!r} must be True or False")
        self.schema = check_schema(schema)
        self.table_prefix = check_table_prefix(table_prefix)
        self.history_size = _positive_int("history_size", history_size, 1)
        self.timeout_ms = _positive_int("timeout_ms", timeout_ms, 100)
        self.max_connections = _positive_int("max_connections", max_connections, 1)
        self.notifications = notifications
        self.prepared_statements = prepared_statements
        # None: psycopg prepares a statement after it ran a few times; False: never.
        self._prepare: bool | None = None if prepared_statements else False
        if not notifications:
            self.release_poll_ms = POLL_MS
        self.dsn = dsn if pool is None else None
        self._given = pool
        self._queries = Queries(Names(self.schema, self.table_prefix))
        self._pool: AsyncConnectionPool[Any] | None = None
        self._conn_lock = asyncio.Lock()
        self._listener: Listener | None = None
        self._started = False
        #: Test-only: milliseconds added to the database clock on this backend's connections
        #: (0 in production; see tests/conformance/test_differential.py).
        self._test_clock_offset_ms = 0
        self._clock_offsets: weakref.WeakKeyDictionary[AsyncConnection[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._checking: asyncio.Task[None] | None = None
        self._last_used: weakref.WeakKeyDictionary[AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary()
        )
        self._where = self._describe_server()

    @classmethod
    def from_url(cls, url: str) -> PostgresBackend:
        """Build from ``postgresql://user@host:5432/db?schema=s&table_prefix=p``.

        The backend's own options (``schema``, ``table_prefix``, ``notifications``,
        ``prepared_statements``, ``history_size``, ``timeout_ms``, ``max_connections``) are
        taken out of the query string; everything else (``sslmode``, ``application_name`` ...)
        stays in the DSN.
        """
        parts = urlsplit(url)
        ours: dict[str, str] = {}
        theirs: list[tuple[str, str]] = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in _URL_OPTIONS:
                ours[key] = value
            else:
                theirs.append((key, value))
        dsn = urlunsplit(parts._replace(query=urlencode(theirs)))
        options: dict[str, Any] = {}
        for key in _URL_INTS:
            if key in ours:
                try:
                    options[key] = int(ours[key])
                except ValueError:
                    raise InvalidOption(
                        f"URL option {key}={ours[key]!r} must be an integer"
                    ) from None
        for key in _URL_FLAGS:
            if key in ours:
                options[key] = _bool_option(key, ours[key])
        return cls(
            dsn,
            schema=ours.get("schema", "public"),
            table_prefix=ours.get("table_prefix", "anarchon_"),
            **options,
        )

    def __repr__(self) -> str:
        return (
            f"PostgresBackend({self._where!r}, schema={self.schema!r}, "
            f"table_prefix={self.table_prefix!r})"
        )

    def _describe_server(self) -> str:
        from psycopg import AsyncConnection
        from psycopg.conninfo import conninfo_to_dict

        if isinstance(self._given, AsyncConnection):
            info = self._given.info
            return f"{info.host}:{info.port}/{info.dbname}"
        conninfo = self._given.conninfo if self._given is not None else self.dsn
        if not isinstance(conninfo, str):
            return "(a pool with a conninfo function)"
        try:
            params = conninfo_to_dict(conninfo)
        except Exception:
            return "(unparsable DSN)"
        host = params.get("host") or params.get("hostaddr") or "localhost"
        return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or '(default)'}"

    # -- connections ------------------------------------------------------------------------

    async def _connect_listener(self) -> AsyncConnection[Any]:
        """A new connection of our own for LISTEN, to the same server as the pool's."""
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
            assert self.dsn is not None
            conninfo, kwargs = self.dsn, self._connection_options()
        kwargs.update(autocommit=True)
        kwargs.setdefault("connect_timeout", max(2, self.timeout_ms // 1000))
        return await AsyncConnection.connect(conninfo, **kwargs)

    def _connection_options(self) -> dict[str, Any]:
        assert self.dsn is not None
        from psycopg.conninfo import conninfo_to_dict

        options: dict[str, Any] = {
            "autocommit": True,
            # Fail a connection attempt quickly: a claim retried later is better than one stuck.
            "connect_timeout": max(2, self.timeout_ms // 1000),
            # Notice a dead peer on an idle connection (the listener's) within about a minute.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        if "application_name" not in conninfo_to_dict(self.dsn):
            options["application_name"] = "anarchon"
        if not self.prepared_statements:
            options["prepare_threshold"] = None
        return options

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        from psycopg import AsyncConnection

        given = self._given
        if isinstance(given, AsyncConnection):
            # One connection: one call at a time, or transactions would interleave on it.
            async with self._conn_lock:
                if given.closed or given.broken:
                    raise BackendUnavailable(
                        f"PostgreSQL {self._where}: the connection given to PostgresBackend is "
                        "closed; pass a pool to have broken connections replaced"
                    )
                yield given
            return
        pool = self._pool if given is None else given
        if pool is None:
            raise BackendError(f"{self!r} is not started; start the scheduler first")
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            conn = await pool.getconn(timeout=max(0.01, deadline - time.monotonic()))
            try:
                alive = await self._alive(conn)
            except BaseException:
                await pool.putconn(conn)
                raise
            if alive:
                break
            # The server ended it (restart, failover, pg_terminate_backend): the pool drops a
            # broken connection it gets back and opens another; test the other idle ones too.
            await pool.putconn(conn)
            self._check_pool()
        try:
            yield conn
        finally:
            self._last_used[conn] = time.monotonic()
            await pool.putconn(conn)

    async def _alive(self, conn: AsyncConnection[Any]) -> bool:
        """Test a connection that sat idle in the pool with one round trip.

        A connection used within IDLE_CHECK_S is trusted without it, so a busy backend pays
        nothing; one killed in that window fails its call, which the scheduler retries.
        """
        idle = time.monotonic() - self._last_used.get(conn, 0.0)
        if idle < IDLE_CHECK_S or not conn.autocommit:
            return not conn.broken
        try:
            await conn.execute("", prepare=self._prepare)
        except Exception:
            return False
        return True

    async def _call(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a connection within ``timeout_ms``; translate the driver's errors."""
        if not self._started:
            raise BackendError(f"{self!r} is not started; start the scheduler first")
        task = asyncio.ensure_future(self._on_connection(work))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout_ms / 1000)
        except TimeoutError:
            # The call goes on in the background until the driver gives it up; its connection
            # is then discarded. The caller hears at once that the backend did not answer.
            task.cancel()
            task.add_done_callback(_consume)
            raise BackendUnavailable(
                f"PostgreSQL {self._where}: no answer within timeout_ms={self.timeout_ms}"
            ) from None
        except asyncio.CancelledError:
            task.cancel()
            task.add_done_callback(_consume)
            raise

    async def _on_connection(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        try:
            async with self._connection() as conn:
                if self._clock_offsets.get(conn, 0) != self._test_clock_offset_ms:
                    await self._set_clock_offset(conn)
                return await work(conn)
        except BackendError:
            raise
        except Exception as exc:
            error = translate(exc, self._where)
            if error is None:
                raise
            if isinstance(error, BackendUnavailable):
                self._check_pool()
            raise error from exc

    async def _set_clock_offset(self, conn: AsyncConnection[Any]) -> None:
        """Test-only: move this connection's database clock by ``_test_clock_offset_ms``."""
        offset = self._test_clock_offset_ms
        async with self._atomic(conn):
            await conn.execute(self._queries["set_clock_offset"], {"offset": str(offset)})
        self._clock_offsets[conn] = offset

    def _check_pool(self) -> None:
        """After a connection failed, test the pool's idle connections and replace dead ones,
        so that one server restart or ``pg_terminate_backend`` costs one failed call, not one
        per pooled connection."""
        pool = self._pool if self._given is None else self._given
        if pool is None or not hasattr(pool, "check"):
            return
        if self._checking is not None and not self._checking.done():
            return

        async def check() -> None:
            with contextlib.suppress(Exception):
                await pool.check()

        self._checking = asyncio.ensure_future(check())

    @staticmethod
    @contextlib.asynccontextmanager
    async def _atomic(conn: AsyncConnection[Any], always: bool = False) -> AsyncIterator[None]:
        """A transaction when one is needed: always for several statements, and for one
        statement on a connection that is not in autocommit mode (a caller's)."""
        if always or not conn.autocommit:
            async with conn.transaction():
                yield
        else:
            yield

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the pool (if the backend owns it) and migrate the tables. Idempotent."""
        if self._started:
            return
        from psycopg_pool import AsyncConnectionPool

        if self._given is None:
            assert self.dsn is not None
            self._pool = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self.max_connections,
                kwargs=self._connection_options(),
                open=False,
                timeout=self.timeout_ms / 1000,
                name=f"anarchon-{self.schema}.{self.table_prefix}",
            )
            try:
                await self._pool.open(wait=True, timeout=self.timeout_ms / 1000)
            except Exception as exc:
                await self._pool.close()
                self._pool = None
                raise BackendUnavailable(
                    f"cannot connect to PostgreSQL {self._where} within "
                    f"timeout_ms={self.timeout_ms}: {translate(exc, self._where) or exc}; "
                    "check the DSN and that the server is up"
                ) from exc
        self._started = True
        try:
            await self._call(self._migrate)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop listening and close the pool the backend opened (never the caller's)."""
        self._started = False
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
            self._checking = None
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        q = self._queries
        async with conn.transaction():
            # Two instances starting at once on a fresh schema: the second waits here, then
            # finds the tables made and its version recorded.
            await conn.execute(q["migration_lock"], {"key": q.names.lock_key})
            cur = await conn.execute(q["schema_exists"], {"schema": self.schema})
            row = await cur.fetchone()
            if not (row and row[0]):
                await conn.execute(q["create_schema"])
            await conn.execute(q["create_version_table"])
            cur = await conn.execute(q["schema_version"])
            row = await cur.fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise BackendError(
                    f"tables {self.schema}.{self.table_prefix}* are at schema version {version}, "
                    f"newer than this anarchon understands ({SCHEMA_VERSION}); upgrade anarchon"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in q.migrations[number]:
                    await conn.execute(statement)
                await conn.execute(q["set_schema_version"], {"version": number})
                logger.info(
                    "migrated %s.%s* to schema version %d",
                    self.schema,
                    self.table_prefix,
                    number,
                    extra={"action": "migrated"},
                )

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        """LISTEN for releases and results on a dedicated connection (unless notifications are
        off); reconnects with backoff. Missed notifications only delay a backup until the
        lease expires."""
        if not self.notifications:
            return
        if self._listener is None:
            self._listener = Listener(
                self._connect_listener, self._queries.names.channel, self._where
            )
        self._listener.add(on_change)
        await self._listener.start(LISTEN_WAIT_S)

    # -- the contract -----------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`.

        A batch is one transaction, sent in one round trip: the rows of its jobs are locked,
        then one statement decides every request. A batch naming one slot twice is split so
        that the second request sees the first. A request the database cannot store is
        answered on its own (LOST with ``error``); if the server refuses a batch for a value
        of one request, each request of it is decided alone.
        """
        reqs = list(requests)
        outcomes: list[ClaimOutcome | None] = [None] * len(reqs)
        good: list[int] = []
        for n, req in enumerate(reqs):
            error = rules.unstorable(req)
            if error is None:
                good.append(n)
            else:
                outcomes[n] = rules.refused_outcome(req, 0, error)
        for chunk in _without_repeats([(n, reqs[n]) for n in good]):
            try:
                decided = await self._call(
                    functools.partial(self._claim, reqs=[r for _, r in chunk])
                )
            except BackendUnavailable:
                raise
            except BackendError:
                if len(chunk) == 1:
                    raise
                decided = [await self._claim_alone(req) for _, req in chunk]
                failed = [o.error for o in decided if o.error is not None]
                if len(failed) == len(decided):
                    raise failed[0] from None  # not one request's values: the whole call
            for (n, _), outcome in zip(chunk, decided, strict=True):
                outcomes[n] = outcome
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    async def _claim_alone(self, req: ClaimRequest) -> ClaimOutcome:
        try:
            [outcome] = await self._call(functools.partial(self._claim, reqs=[req]))
        except BackendUnavailable:
            raise
        except BackendError as exc:
            return rules.refused_outcome(req, 0, exc)
        return outcome

    async def _claim(
        self, conn: AsyncConnection[Any], reqs: list[ClaimRequest]
    ) -> list[ClaimOutcome]:
        q = self._queries
        params = {
            "job": [r.job for r in reqs],
            "slot_key": [r.slot_key for r in reqs],
            "slot": [r.slot for r in reqs],
            "run_id": [r.run_id for r in reqs],
            "token": [r.token for r in reqs],
            "instance": [r.instance for r in reqs],
            "trigger": [str(r.trigger) for r in reqs],
            "lease_ms": [r.lease_ms for r in reqs],
            "overlap_skip": [r.overlap is Overlap.SKIP for r in reqs],
            "skip_reason": [r.skip_reason for r in reqs],
        }
        before: list[Statement] = []
        if len(reqs) > LARGE_BATCH:
            before += [(q["no_jit"], None), (q["custom_plans"], None)]
        elif self._prepare is not False:
            before.append((q["generic_plans"], None))
        before.append((q["lock_jobs"], {"jobs": sorted({r.job for r in reqs})}))
        rows = await self._transaction(conn, before, q["claim"], params)
        if len(rows) != len(reqs):
            raise BackendError(f"claim answered {len(rows)} rows for {len(reqs)} requests")
        return [_claim_outcome(req, row) for req, row in zip(reqs, rows, strict=True)]

    async def _transaction(
        self,
        conn: AsyncConnection[Any],
        before: Sequence[Statement],
        query: bytes,
        params: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """Run ``before`` then ``query`` in one READ COMMITTED transaction; return the rows of
        ``query``.

        On an autocommit connection (the backend's own pool) the whole transaction, BEGIN to
        COMMIT, is sent in pipeline mode: one round trip to the server instead of one per
        statement.
        """
        try:
            [rows] = await self._transactions(conn, [(before, query, params)])
        except _Aborted as aborted:
            raise aborted.error from aborted
        if isinstance(rows, BaseException):
            raise rows
        return rows

    async def _transactions(
        self, conn: AsyncConnection[Any], work: Sequence[Work]
    ) -> list[list[dict[str, Any]] | BackendError]:
        """Run each item of ``work`` as its own READ COMMITTED transaction; return the rows of
        each item's query, or the permanent error of that item.

        All of them go in one round trip (pipeline mode, BEGIN ... COMMIT each). A statement
        that fails makes the server skip the rest of the round trip: :class:`_Aborted` then
        carries what was committed before it, and :meth:`_each` sends the others again one by
        one, so each is decided on its own. A transient error (connection lost, deadlock)
        fails the call: the caller retries the whole batch, which is safe since every item is
        idempotent per token.
        """
        from psycopg import AsyncPipeline
        from psycopg.pq import ExecStatus

        if not conn.autocommit or not AsyncPipeline.is_supported():
            return [await self._one_transaction(conn, item) for item in work]
        q = self._queries
        prepare = self._prepare
        cursors: list[Any] = []
        try:
            async with conn.pipeline():
                for before, query, params in work:
                    await conn.execute(q["begin"], prepare=prepare)
                    for statement, values in before:
                        await conn.execute(statement, values, prepare=prepare)
                    cur = conn.cursor(row_factory=_dict_row())
                    await cur.execute(query, params, binary=True, prepare=prepare)
                    await conn.execute(q["commit"], prepare=prepare)
                    cursors.append(cur)
        except Exception as exc:
            error = self._item_error(exc)
            done: list[list[dict[str, Any]] | None] = []
            for n in range(len(work)):
                result = cursors[n].pgresult if n < len(cursors) else None
                committed = result is not None and result.status == ExecStatus.TUPLES_OK
                done.append(await cursors[n].fetchall() if committed else None)
            await self._after_abort(conn)
            raise _Aborted(done, error) from exc
        return [await cur.fetchall() for cur in cursors]

    async def _after_abort(self, conn: AsyncConnection[Any]) -> None:
        """After a pipeline that failed part-way: the server skipped statements psycopg may
        have counted as prepared, and the connection may be inside a failed transaction.
        Close a connection of the backend's pool (the pool opens a fresh one); on a
        connection the caller passed in, roll back and forget every prepared statement."""
        from psycopg import AsyncConnection

        if conn.broken:
            return
        if not isinstance(self._given, AsyncConnection):
            await conn.close()
            return
        q = self._queries
        with contextlib.suppress(Exception):
            await conn.execute(q["rollback"], prepare=False)
        with contextlib.suppress(Exception):
            await conn.execute(q["deallocate_all"], prepare=False)

    async def _each(self, work: Sequence[Work]) -> list[list[dict[str, Any]] | BackendError]:
        """:meth:`_transactions` in one call; after a failed item, the items it did not commit
        are sent again one at a time, each on its own."""
        try:
            return await self._call(lambda conn: self._transactions(conn, work))
        except _Aborted as aborted:
            if len(work) == 1:
                return [aborted.error]
            out: list[list[dict[str, Any]] | BackendError] = []
            for item, done in zip(work, aborted.done, strict=True):
                if done is not None:
                    out.append(done)
                    continue
                try:
                    rows = await self._call(
                        lambda conn, item=item: self._one_transaction(conn, item)  # type: ignore[misc]
                    )
                except _Aborted as again:
                    rows = again.error
                out.append(rows)
            return out

    async def _one_transaction(
        self, conn: AsyncConnection[Any], item: Work
    ) -> list[dict[str, Any]] | BackendError:
        """One item of work without pipeline mode or prepared statements: on a connection
        psycopg keeps in transactions (a caller's), and for items sent again after a failure."""
        before, query, params = item
        try:
            async with conn.transaction():
                await conn.execute(self._queries["read_committed"], prepare=False)
                for statement, values in before:
                    await conn.execute(statement, values, prepare=False)
                cur = conn.cursor(row_factory=_dict_row())
                await cur.execute(query, params, binary=True, prepare=False)
                return await cur.fetchall()
        except Exception as exc:
            return self._item_error(exc)

    def _item_error(self, exc: Exception) -> BackendError:
        """The error of one item: a permanent one is returned for that item alone; anything
        transient, or a failure that is not the driver's, is raised for the call."""
        error = exc if isinstance(exc, BackendError) else translate(exc, self._where)
        if error is None or isinstance(error, BackendUnavailable):
            raise exc
        return error

    async def renew(self, ticket: Ticket) -> Ticket:
        """See :meth:`anarchon.backend.LeaseBackend.renew`."""
        [answer] = await self.renew_many([ticket])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`: one statement per ticket, each
        its own transaction, all sent in one round trip (pipeline mode)."""
        batch = list(tickets)
        out: list[Ticket | BackendError | None] = [rules.check_ticket(t) for t in batch]
        todo = [n for n, found in enumerate(out) if found is None]
        if todo:
            work: list[Work] = [
                (
                    [],
                    self._queries["renew"],
                    {**_ticket_params(batch[n]), "lease_ms": batch[n].lease_ms},
                )
                for n in todo
            ]
            answers = await self._each(work)
            for n, answer in zip(todo, answers, strict=True):
                out[n] = (
                    answer if isinstance(answer, BackendError) else _renewed(batch[n], answer[0])
                )
        return [o for o in out if o is not None]

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`.

        A read answers the common cases (ENDED, HELD, a retried TAKEN) without a lock. An
        expired or released lease is taken over in a transaction that first locks the job's
        row, so a backup that lost the race to another one sees the new attempt: HELD.
        """
        from psycopg.rows import dict_row

        error = rules.unstorable(request)
        if error is not None:
            raise error
        params = {
            "job": request.job,
            "slot_key": request.slot_key,
            "run_id": request.run_id,
            "token": request.token,
            "instance": request.instance,
            "lease_ms": request.lease_ms,
            "max_attempts": request.max_attempts,
            "channel": self._queries.names.channel,
        }
        q = self._queries

        async def work(conn: AsyncConnection[Any]) -> TakeoverOutcome:
            async with self._atomic(conn):
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(q["peek_takeover"], params, prepare=self._prepare)
                peeked = await cur.fetchone()
            assert peeked is not None
            answer = _peeked_takeover(request, peeked)
            if answer is not None:
                return answer
            lock: list[Statement] = [(q["lock_job"], {"job": request.job})]
            [row] = await self._transaction(conn, lock, q["take_over"], params)
            return _takeover_outcome(request, row)

        return await self._call(work)

    async def release(self, ticket: Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; backups hear it by NOTIFY."""
        params = {**_ticket_params(ticket), "channel": self._queries.names.channel}

        async def work(conn: AsyncConnection[Any]) -> None:
            [row] = await self._transaction(conn, [], self._queries["release"], params)
            if not row["done"]:
                raise lease_lost(ticket, row["attempt"], row["status"])

        await self._call(work)

    async def finish(self, ticket: Ticket, status: str, error: str | None) -> Run:
        """See :meth:`anarchon.backend.Backend.finish`; prunes the job's history and tells
        backups (NOTIFY) in the same statement."""
        [answer] = await self.finish_many([(ticket, status, error)])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: each result its own transaction
        (the job's row locked, then one statement records, prunes and notifies), all sent in
        one round trip (pipeline mode). One failing item fails alone."""
        batch = list(items)
        q = self._queries
        work: list[Work] = []
        for ticket, status, error in batch:
            params = {
                **_ticket_params(ticket),
                "status": str(RunStatus(status)),
                "error": error,
                "ttl_ms": _ttl(ticket.history_ttl_ms),
                "keep": self.history_size,
                "batch": rules.PRUNE_BATCH,
                "channel": q.names.channel,
            }
            work.append(([(q["lock_job"], {"job": ticket.job})], q["finish"], params))
        answers = await self._each(work)
        out: list[Run | BackendError] = []
        for (ticket, status, error), answer in zip(batch, answers, strict=True):
            if isinstance(answer, BackendError):
                out.append(answer)
            else:
                row = answer[0] if answer else None
                out.append(_finished(ticket, str(RunStatus(status)), error, row))
        return out

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`; an index scan of ``limit`` rows."""
        from psycopg.rows import dict_row

        async def work(conn: AsyncConnection[Any]) -> list[Run]:
            # One read: its isolation level changes nothing.
            async with self._atomic(conn):
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    self._queries["history"], {"job": job, "limit": limit}, prepare=self._prepare
                )
                rows = await cur.fetchall()
            return [r.to_run() for r in map(_run_row, rows) if r is not None]

        return await self._call(work)

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`; two index-only lookups."""

        async def work(conn: AsyncConnection[Any]) -> int | None:
            async with self._atomic(conn):
                cur = await conn.execute(
                    self._queries["last_slot"], {"job": job}, prepare=self._prepare
                )
                row = await cur.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self._call(work)

    async def server_time_ms(self) -> int | None:
        """The database clock, ``clock_timestamp()``, in epoch ms."""

        async def work(conn: AsyncConnection[Any]) -> int | None:
            async with self._atomic(conn):
                cur = await conn.execute(self._queries["now"], prepare=self._prepare)
                row = await cur.fetchone()
            return None if row is None else int(row[0])

        return await self._call(work)

    def registry(self) -> PostgresRegistry:
        """The registry, in a table of its own beside the backend's (see ``_registry``)."""
        return PostgresRegistry(self)

    def clone(self) -> PostgresBackend | None:
        """A new, unstarted backend on the same database, schema and prefix with a small pool
        of its own (two connections), for the scheduler's lease keeper thread. From a pool or
        connection you passed in, the copy connects with its connection string; None when
        that cannot be read (a conninfo function, connection keyword arguments)."""
        from psycopg import AsyncConnection
        from psycopg.conninfo import make_conninfo

        given = self._given
        if given is None:
            dsn = self.dsn
        elif isinstance(given, AsyncConnection):
            dsn = make_conninfo(given.info.dsn, password=given.info.password or None)
        elif isinstance(given.conninfo, str) and not given.kwargs:
            dsn = given.conninfo
        else:
            return None
        if dsn is None:
            return None
        return PostgresBackend(
            dsn,
            schema=self.schema,
            table_prefix=self.table_prefix,
            history_size=self.history_size,
            notifications=self.notifications,
            timeout_ms=self.timeout_ms,
            max_connections=2,
            prepared_statements=self.prepared_statements,
        )


async def _resolve(value: Any) -> Any:
    """A pool's ``conninfo`` or ``kwargs``: a value, or a function (maybe async) giving it."""
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _without_repeats(
    reqs: list[tuple[int, ClaimRequest]],
) -> list[list[tuple[int, ClaimRequest]]]:
    """Split a batch, in order, into chunks that never name one (job, slot_key) twice."""
    chunks: list[list[tuple[int, ClaimRequest]]] = [[]]
    seen: set[tuple[str, str]] = set()
    for item in reqs:
        _, req = item
        key = (req.job, req.slot_key)
        if key in seen:
            chunks.append([])
            seen = set()
        seen.add(key)
        chunks[-1].append(item)
    return [c for c in chunks if c]


class _Aborted(Exception):
    """A pipeline of transactions failed at ``error``; ``done`` holds the rows of the items
    committed before it (None for the others)."""

    def __init__(self, done: list[list[dict[str, Any]] | None], error: BackendError) -> None:
        super().__init__(str(error))
        self.done = done
        self.error = error


def _dict_row() -> Any:
    from psycopg.rows import dict_row

    return dict_row


def _ttl(history_ttl_ms: int | None) -> int | None:
    """The TTL to prune by: None for none; one longer than any stored time keeps everything."""
    if not history_ttl_ms or history_ttl_ms <= 0:
        return None
    return min(history_ttl_ms, rules.MAX_MS)


def _peeked_takeover(req: TakeoverRequest, row: dict[str, Any]) -> TakeoverOutcome | None:
    """Answer a takeover from the unlocked read (see :func:`rules.peek_takeover`), or None
    when the lease expired or was released and the locked statement must decide."""
    now = int(row["now"])
    stored = _run_row(row)

    class _One:
        def current(self, job: str, slot_key: str) -> RunRow | None:
            return stored

    return rules.peek_takeover(_One(), req, now)  # type: ignore[arg-type]


def _ticket_params(ticket: Ticket) -> dict[str, Any]:
    return {
        "job": ticket.job,
        "slot_key": ticket.slot_key,
        "attempt": ticket.attempt,
        "token": ticket.token,
        "fence": ticket.fence,
    }


def _renewed(ticket: Ticket, row: dict[str, Any]) -> Ticket | LeaseLost:
    """Interpret the renew statement's row for ``ticket``."""
    now, expires, attempt = row["now"], row["lease_expires_at"], row["attempt"]
    status, released, ours = row["status"], row["released"], row["ours"]
    if expires is not None:
        return ticket.renewed(int(expires), int(now))
    if ours and status == RunStatus.RUNNING and released:
        return LeaseLost(f"run {ticket.run_id} of job {ticket.job!r} was handed over")
    return lease_lost(ticket, attempt, status)


def _finished(
    ticket: Ticket, status: str, error: str | None, row: dict[str, Any] | None
) -> Run | LeaseLost:
    """Interpret the finish statement's row for ``ticket``."""
    stored = _run_row(row) if row is not None else None
    if stored is not None and row is not None and row["outcome"] == "finished":
        return stored.to_run()
    if rules.already_recorded(stored, ticket, status, error):
        assert stored is not None
        return stored.to_run()  # a retry whose first answer was lost
    return lease_lost(ticket, stored.attempt if stored else None, stored.status if stored else None)


def _claim_outcome(req: ClaimRequest, row: dict[str, Any]) -> ClaimOutcome:
    now = int(row["now"])
    verdict = row["verdict"]
    if verdict == "pruned":
        return pruned_outcome(req, now)
    stored = _run_row(row)
    if stored is None:
        # Only if the job lock was bypassed; the transaction is rolled back, the core retries.
        raise BackendUnavailable(f"claim of {req.job} {req.slot_key} raced; retry it")
    return answer_existing(stored, req, now)


def _takeover_outcome(req: TakeoverRequest, row: dict[str, Any]) -> TakeoverOutcome:
    now = int(row["now"])
    stored = _run_row(row)
    verdict = row["verdict"]
    if verdict is None or verdict == "ended":
        return TakeoverOutcome(
            status=TakeoverStatus.ENDED,
            run=stored.to_run() if stored else None,
            backend_now_ms=now,
        )
    assert stored is not None
    if verdict == "held":
        return TakeoverOutcome(
            status=TakeoverStatus.HELD,
            run=stored.to_run(),
            lease_expires_at_ms=stored.lease_expires_at,
            backend_now_ms=now,
        )
    if verdict == "exhausted":
        return TakeoverOutcome(
            status=TakeoverStatus.EXHAUSTED, run=stored.to_run(), backend_now_ms=now
        )
    # "taken", or "mine": a retried takeover whose first answer was lost.
    return TakeoverOutcome(
        status=TakeoverStatus.TAKEN,
        run=stored.to_run(),
        ticket=stored.ticket(req.lease_ms, now, req.history_ttl_ms),
        lease_expires_at_ms=stored.lease_expires_at,
        backend_now_ms=now,
    )
