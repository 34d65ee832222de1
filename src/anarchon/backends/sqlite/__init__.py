"""SQLite: the embedded default, for several processes on one host sharing one file.

The file is opened in WAL mode with a busy timeout; every decision is one short
``BEGIN IMMEDIATE`` transaction, so exactly one process wins each slot. Leases use the host's
clock, which every process on the host shares. SQLite cannot notify other processes, so each
release and result is also written to an events table that every process polls once every
:data:`EVENTS_POLL_MS` (one small read, however many runs it watches) to wake its backups.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from ..._models import Run
from ..._options import HISTORY_SIZE, Bound, check_int
from ..._retry import backoff
from ...backend import (
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    LeaseBackend,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from ...errors import BackendError, BackendUnavailable, LeaseLost
from .. import _lease_rules as rules
from .._lease_rules import RunRow
from .._sql import load_queries

__all__ = ["SQLiteBackend"]

Q: Final = load_queries(__name__, "queries.sql")
SCHEMA_VERSION: Final = 3
MIGRATIONS: Final = {1: Q["migration_1"], 2: Q["migration_2"], 3: Q["migration_3"]}
ENV_PATH: Final = "ANARCHON_DB"
DEFAULT_PATH: Final = "anarchon.db"
BUSY_TIMEOUT: Final = Bound(0, 3_600_000, ms=True)
# Prune a job's history by count at most this often per process; age pruning is cheap.
PRUNE_EVERY_MS: Final = 10_000
# How often each process reads the events table; a hand-over is noticed within this.
EVENTS_POLL_MS: Final = 200
# Events are kept this long: far longer than a poll interval, so none is missed.
EVENTS_KEEP_MS: Final = 60_000

T = TypeVar("T")

logger = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _SQLiteRows:
    """The :class:`~anarchon.backends._lease_rules.RowStore` over one open transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def current(self, job: str, slot_key: str) -> RunRow | None:
        return _row(self.conn.execute(Q["current"], (job, slot_key)).fetchone())

    def live_holder(self, job: str, now: int) -> RunRow | None:
        return _row(self.conn.execute(Q["live_holder"], (job, now)).fetchone())

    def insert(self, row: RunRow) -> None:
        self.conn.execute(Q["insert"], _params(row))

    def update(self, row: RunRow) -> None:
        self.conn.execute(Q["update"], _params(row))

    def next_fence(self, job: str) -> int:
        return int(self.conn.execute(Q["next_fence"], (job,)).fetchone()[0])

    def pruned_through(self, job: str) -> int | None:
        found = self.conn.execute(Q["pruned_through"], (job,)).fetchone()
        return None if found is None or found[0] is None else int(found[0])


def _events_since(conn: sqlite3.Connection, since: int) -> list[tuple[int, str, str, int]]:
    return conn.execute(Q["events_since"], (since,)).fetchall()


def _row(values: tuple[Any, ...] | None) -> RunRow | None:
    if values is None:
        return None
    (
        job,
        slot_key,
        slot,
        attempt,
        run_id,
        token,
        instance,
        trigger,
        status,
        fence,
        started_at,
        finished_at,
        lease_expires_at,
        released,
        error,
        reason,
    ) = values
    return RunRow(
        job=job,
        slot_key=slot_key,
        slot=slot,
        attempt=attempt,
        run_id=run_id,
        token=token,
        instance=instance,
        trigger=trigger,
        status=status,
        fence=fence,
        started_at=started_at,
        finished_at=finished_at,
        lease_expires_at=lease_expires_at,
        released=bool(released),
        error=error,
        reason=reason,
    )


def _params(row: RunRow) -> dict[str, Any]:
    return {
        "job": row.job,
        "slot_key": row.slot_key,
        "slot": row.slot,
        "attempt": row.attempt,
        "run_id": row.run_id,
        "token": row.token,
        "instance": row.instance,
        "trigger": str(row.trigger),
        "status": str(row.status),
        "fence": row.fence,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "lease_expires_at": row.lease_expires_at,
        "released": int(row.released),
        "error": row.error,
        "reason": row.reason,
    }


class SQLiteBackend(LeaseBackend):
    """Claims, leases and history in one SQLite file shared by processes on one host.

    :param path: the database file; default ``$ANARCHON_DB`` or ``anarchon.db`` in the working
        directory. Every process that should share slots must use the same file, on a local
        disk (SQLite locking is unreliable on network file systems).
    :param history_size: at most about this many runs are kept per job.
    :param busy_timeout_ms: how long a write waits for another process's transaction.
    """

    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        history_size: int = 1000,
        busy_timeout_ms: int = 10_000,
    ) -> None:
        owner = "SQLiteBackend"
        history_size = check_int("history_size", history_size, HISTORY_SIZE, owner)
        busy_timeout_ms = check_int("busy_timeout_ms", busy_timeout_ms, BUSY_TIMEOUT, owner)
        self._default_path = path is None and not os.environ.get(ENV_PATH)
        # Absolute now: the working directory may change before start(), and the log and every
        # message must say which file this is (two folders would otherwise mean two files).
        self.path = Path(
            os.path.abspath(path if path is not None else os.environ.get(ENV_PATH) or DEFAULT_PATH)
        )
        self.history_size = history_size
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._pruned_at: dict[str, int] = {}
        self._events_pruned_at = 0
        self._poller: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[str, str, bool], None]] = []

    def __repr__(self) -> str:
        return f"SQLiteBackend({str(self.path)!r})"

    # -- plumbing ---------------------------------------------------------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None or self._conn is None:
            raise BackendError(f"{self!r} is not started; start the scheduler first")
        conn = self._conn
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, fn, conn)
        except sqlite3.OperationalError as exc:
            # "database is locked" past the busy timeout, I/O errors: transient.
            raise BackendUnavailable(f"SQLite {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise BackendError(f"SQLite {self.path}: {exc}") from exc

    @staticmethod
    def _write(conn: sqlite3.Connection, fn: Callable[[_SQLiteRows, int], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(_SQLiteRows(conn), _now_ms())
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _open(self) -> sqlite3.Connection:
        if self.path.parent and not self.path.parent.exists():
            raise BackendError(f"SQLite database directory {self.path.parent} does not exist")
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._enable_wal(conn)
        # FULL: a claim the backend confirmed survives a power cut, not only a process crash.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        self._migrate(conn)
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
        # locked" at once, without its busy handler, while another process opens the same new
        # file: retry for as long as the busy timeout allows.
        deadline = time.monotonic() + self._busy_timeout_s
        for delay in backoff(first=0.01, cap=0.1):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise
                time.sleep(delay)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(Q["create_schema_table"])
            version = conn.execute(Q["schema_version"]).fetchone()[0] or 0
            if version > SCHEMA_VERSION:
                raise BackendError(
                    f"database schema version {version} is newer than this anarchon "
                    f"understands ({SCHEMA_VERSION}); upgrade anarchon"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(Q["set_schema_version"], (number,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the file (WAL, busy timeout) and migrate the schema. Idempotent."""
        if self._conn is not None:
            return
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="anarchon-sqlite")
        loop = asyncio.get_running_loop()
        try:
            self._conn = await loop.run_in_executor(self._thread, self._open)
        except sqlite3.Error as exc:
            self._thread.shutdown(wait=False)
            self._thread = None
            raise BackendError(f"cannot open SQLite database {self.path}: {exc}") from exc
        logger.info(
            "SQLite database %s%s",
            self.path,
            f" (the default: {DEFAULT_PATH} in the working directory; every process that shares "
            f"slots must use this file: set {ENV_PATH} or pass a path)"
            if self._default_path
            else "",
            extra={"action": "sqlite_path", "path": str(self.path)},
        )

    async def stop(self) -> None:
        """Stop polling events and close the file."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        conn, thread = self._conn, self._thread
        self._conn = self._thread = None
        if conn is not None and thread is not None:
            await asyncio.get_running_loop().run_in_executor(thread, conn.close)
            thread.shutdown(wait=True)

    # -- the contract -----------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`; the whole batch is one transaction."""
        reqs = list(requests)

        def work(conn: sqlite3.Connection) -> list[ClaimOutcome]:
            return self._write(conn, lambda rows, now: [rules.claim(rows, r, now) for r in reqs])

        return await self._call(work)

    async def renew(self, ticket: Ticket) -> Ticket:
        """See :meth:`anarchon.backend.LeaseBackend.renew`."""
        return await self._call(lambda c: self._write(c, lambda r, n: rules.renew(r, ticket, n)))

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`.

        Backups poll this every :attr:`release_poll_ms`; while the lease is live the answer
        comes from a read, without taking the database's write lock.
        """

        def work(conn: sqlite3.Connection) -> TakeoverOutcome:
            peeked = rules.peek_takeover(_SQLiteRows(conn), request, _now_ms())
            if peeked is not None:
                return peeked
            return self._write(conn, lambda r, n: rules.take_over(r, request, n))

        return await self._call(work)

    async def release(self, ticket: Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; other processes hear of it through
        the events table."""

        def work(rows: _SQLiteRows, now: int) -> None:
            rules.release(rows, ticket, now)
            rows.conn.execute(Q["add_event"], (ticket.job, ticket.slot_key, 1, now))

        await self._call(lambda c: self._write(c, work))

    async def finish(self, ticket: Ticket, status: str, error: str | None) -> Run:
        """See :meth:`anarchon.backend.Backend.finish`; prunes the job's history too."""

        [answer] = await self.finish_many([(ticket, status, error)])
        if isinstance(answer, LeaseLost):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | LeaseLost]:
        """See :meth:`anarchon.backend.Backend.finish_many`; the batch is one transaction."""
        batch = list(items)

        def work(rows: _SQLiteRows, now: int) -> list[Run | LeaseLost]:
            out: list[Run | LeaseLost] = []
            pruned: set[str] = set()
            for ticket, status, error in batch:
                try:
                    out.append(rules.finish(rows, ticket, status, error, now))
                except LeaseLost as exc:
                    out.append(exc)
                    continue
                rows.conn.execute(Q["add_event"], (ticket.job, ticket.slot_key, 0, now))
                if ticket.job not in pruned:
                    pruned.add(ticket.job)
                    self._prune(rows.conn, ticket, now)
            return out

        return await self._call(lambda c: self._write(c, work))

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | LeaseLost]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`; one transaction."""
        batch = list(tickets)

        def work(rows: _SQLiteRows, now: int) -> list[Ticket | LeaseLost]:
            out: list[Ticket | LeaseLost] = []
            for ticket in batch:
                try:
                    out.append(rules.renew(rows, ticket, now))
                except LeaseLost as exc:
                    out.append(exc)
            return out

        return await self._call(lambda c: self._write(c, work))

    def _prune(self, conn: sqlite3.Connection, ticket: Ticket, now: int) -> None:
        slots: list[int] = []
        if ticket.history_ttl_ms:
            cutoff = now - ticket.history_ttl_ms
            slots += [s for (s,) in conn.execute(Q["prune_by_age"], (ticket.job, cutoff)) if s]
        if now - self._pruned_at.get(ticket.job, 0) >= PRUNE_EVERY_MS:
            self._pruned_at[ticket.job] = now
            slots += [
                s
                for (s,) in conn.execute(Q["prune_by_count"], (ticket.job, self.history_size))
                if s is not None
            ]
        if slots:
            conn.execute(Q["raise_pruned_through"], {"job": ticket.job, "slot": max(slots)})
        if now - self._events_pruned_at >= PRUNE_EVERY_MS:
            self._events_pruned_at = now
            conn.execute(Q["prune_events"], (now - EVENTS_KEEP_MS,))

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`."""

        def read(conn: sqlite3.Connection) -> list[Run]:
            rows = conn.execute(Q["history"], (job, limit)).fetchall()
            return [r.to_run() for r in map(_row, rows) if r is not None]

        return await self._call(read)

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`."""

        def read(conn: sqlite3.Connection) -> int | None:
            value = conn.execute(Q["last_slot"], (job,)).fetchone()[0]
            return None if value is None else int(value)

        return await self._call(read)

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """See :meth:`anarchon.backend.LeaseBackend.last_slots`; one query per 500 jobs."""
        names = list(jobs)

        def read(conn: sqlite3.Connection) -> dict[str, int | None]:
            found: dict[str, int | None] = dict.fromkeys(names)
            for start in range(0, len(names), 500):
                chunk = names[start : start + 500]
                query = Q["last_slots"].replace("?jobs", ", ".join("?" * len(chunk)))
                found.update(conn.execute(query, chunk).fetchall())
            return found

        return await self._call(read)

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        """Poll the events table every :data:`EVENTS_POLL_MS` and report new releases and
        results to ``on_change``; events written before this call are not reported."""
        self._listeners.append(on_change)
        if self._poller is None:
            since = await self._call(lambda c: int(c.execute(Q["last_event"]).fetchone()[0]))
            self._poller = asyncio.ensure_future(self._poll_events(since))

    async def _poll_events(self, since: int) -> None:
        while True:
            await asyncio.sleep(EVENTS_POLL_MS / 1000)
            try:
                events = await self._call(functools.partial(_events_since, since=since))
            except BackendError:
                continue  # busy or briefly unavailable: the next poll catches up
            for seq, job, slot_key, released in events:
                since = seq
                for listener in self._listeners:
                    listener(job, slot_key, bool(released))

    async def server_time_ms(self) -> int | None:
        """The host clock, which every process on the host shares."""
        return _now_ms()

    def clone(self) -> SQLiteBackend:
        """A new, unstarted backend on the same file with the same options and a connection of
        its own, for the scheduler's lease keeper thread."""
        return SQLiteBackend(
            self.path,
            history_size=self.history_size,
            busy_timeout_ms=round(self._busy_timeout_s * 1000),
        )
