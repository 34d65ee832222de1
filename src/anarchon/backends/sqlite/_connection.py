"""The SQLite connection: one file, one thread, short ``BEGIN IMMEDIATE`` transactions.

Every call runs on the backend's own thread (sqlite3 blocks) and its errors are translated in
one place (:mod:`._errors`). A write is one transaction that reads the clock first, taking a
step of the wall clock there (:class:`._clock.AnchoredClock`), and is rolled back whatever
fails, COMMIT included. One call runs on the caller's thread instead:
:meth:`Connection.data_version`, the change feed's idle check, one pragma on a second
connection that never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ...errors import BackendError
from ...kit import backoff
from ...kit.migrations import migrate
from ._clock import AnchoredClock
from ._errors import DATA_ERRORS, is_busy, translate
from ._options import EVENTS_KEEP_MS, EVENTS_PRUNE_EVERY_MS, lock_waits
from ._queries import ADDITIONS, STEPS, Q
from ._rows import SQLiteRows

__all__ = ["Connection"]

logger = logging.getLogger("anarchon.backends.sqlite")

T = TypeVar("T")
Item = TypeVar("Item")


class Connection:
    """The backend's one connection to ``path`` and the thread it runs on."""

    def __init__(self, path: Path, *, busy_timeout_ms: int, history_size: int) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_ms / 1000
        self.history_size = history_size
        self.clock = AnchoredClock()
        self._conn: sqlite3.Connection | None = None
        # A second connection, only for data_version() (on the event loop's thread).
        self._watch: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._events_pruned_at = 0
        self._busy_pragma = f"PRAGMA busy_timeout={busy_timeout_ms}"

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._conn is not None

    async def open(self) -> None:
        """Open the file on a new thread: WAL, busy timeout, migrations, the clock's anchor.

        Cancelled meanwhile (a stop during the start), it returns at once and the opening is
        undone on that thread once it ends (it may wait for a lock up to the busy timeout):
        the connections it made are closed and the thread ends, as after a failed open."""
        self._thread = thread = ThreadPoolExecutor(1, thread_name_prefix="anarchon-sqlite")
        opening = thread.submit(self._open)
        try:
            conn, watch = await asyncio.wrap_future(opening)
        except (sqlite3.Error, BackendError) as exc:
            thread.shutdown(wait=False)
            self._thread = None
            if isinstance(exc, BackendError):
                raise
            raise BackendError(f"cannot open SQLite database {self.path}: {exc}") from exc
        except BaseException:
            # Cancelled: the call may already run on the thread (it cannot be stopped). The
            # close is queued behind it on the same thread, so it closes what it opened.
            self._thread = None
            thread.submit(self._undo_open, opening)
            thread.shutdown(wait=False)
            raise
        self._conn, self._watch = conn, watch

    @staticmethod
    def _undo_open(opening: Future[tuple[sqlite3.Connection, sqlite3.Connection | None]]) -> None:
        """On the connection's thread, after ``opening`` (an :meth:`_open` whose caller was
        cancelled) ended: close the connections it made."""
        if opening.cancelled() or opening.exception() is not None:
            return  # never ran, or closed its connection itself
        conn, watch = opening.result()
        if watch is not None:
            watch.close()
        conn.close()

    async def close(self) -> None:
        """Close the file and end the thread."""
        conn, thread = self._conn, self._thread
        self._conn = self._thread = None
        watch, self._watch = self._watch, None
        if conn is not None and thread is not None:
            await asyncio.get_running_loop().run_in_executor(thread, conn.close)
            if watch is not None:
                await asyncio.get_running_loop().run_in_executor(thread, watch.close)
            thread.shutdown(wait=True)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the connection's thread; sqlite3's errors translated."""
        if self._thread is None or self._conn is None:
            raise BackendError(
                f"SQLiteBackend({str(self.path)!r}) is not started; start the scheduler first"
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, self._conn)
        except sqlite3.Error as exc:
            translated = translate(exc, str(self.path))
            if translated is None:
                raise
            raise translated from exc

    def data_version(self) -> int | None:
        """``PRAGMA data_version`` of a second connection to the file, which moves whenever any
        connection commits (this backend's own, its lease keeper's, another process's): the
        change feed reads its tables only when it moved. Asked on the caller's thread (the
        event loop's), unlike every other call: in WAL mode it is a look at the file's shared
        memory (and page 1 after a commit), and with no busy timeout it never waits for a lock.
        None when it cannot answer at once (busy, closed): then read the tables."""
        watch = self._watch
        if watch is None:
            return None
        try:
            return int(watch.execute(Q["data_version"]).fetchone()[0])
        except sqlite3.Error:
            return None

    def write(self, conn: sqlite3.Connection, fn: Callable[[SQLiteRows, int], T]) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction. Whatever fails, COMMIT included,
        the transaction is rolled back, so a failed commit cannot leave the connection inside
        a transaction that locks every other process out."""
        with self._transaction(conn):
            return fn(SQLiteRows(conn, self.history_size), self.clock.tick(conn))

    def settle(self, conn: sqlite3.Connection) -> None:
        """Take a step of the wall clock no write has taken yet (one read of the anchor; a
        write transaction only after a step), so a read that follows measures with the
        deadlines already moved."""
        if self.clock.pending(conn):
            self.write(conn, lambda rows, now: None)

    def write_each(
        self,
        conn: sqlite3.Connection,
        items: list[Item],
        decide: Callable[[SQLiteRows, Item, int], T],
        refuse: Callable[[Item, int, BackendError], T],
    ) -> list[T]:
        """Decide each item in one transaction. An item whose values the file cannot hold is
        answered by ``refuse`` and the others are decided as usual: the batch is tried as a
        whole, and only if an item fails that way again with a savepoint per item."""

        def run(rows: SQLiteRows, now: int, guarded: bool) -> list[T]:
            out: list[T] = []
            for item in items:
                if not guarded:
                    out.append(decide(rows, item, now))
                    continue
                conn.execute("SAVEPOINT item")
                try:
                    out.append(decide(rows, item, now))
                except DATA_ERRORS as exc:
                    conn.execute("ROLLBACK TO item")
                    error = BackendError(f"SQLite {self.path}: cannot store this item: {exc!r}")
                    out.append(refuse(item, now, error))
                conn.execute("RELEASE item")
            return out

        try:
            return self.write(conn, lambda rows, now: run(rows, now, False))
        except DATA_ERRORS:
            return self.write(conn, lambda rows, now: run(rows, now, True))

    def prune_events(self, conn: sqlite3.Connection) -> None:
        """Trim the events, at most every :data:`~._options.EVENTS_PRUNE_EVERY_MS`."""
        now = self.clock.now()
        if now - self._events_pruned_at >= EVENTS_PRUNE_EVERY_MS:
            self._events_pruned_at = now

            def prune(rows: SQLiteRows, at: int) -> None:
                rows.conn.execute(Q["prune_events"], (at - EVENTS_KEEP_MS,))

            self.write(conn, prune)

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        self._begin(conn)
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's write transaction in short steps
        (:func:`~._options.lock_waits`) for up to the busy timeout.

        Not SQLite's busy handler: it sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms
        between tries, so a write that arrives while another process commits (a claim lost to
        a competitor, a result beside a claim) waits up to 33 ms for a lock held 2. The
        connection keeps the busy timeout for everything else (a read during recovery)."""
        conn.execute("PRAGMA busy_timeout=0")
        try:
            deadline: float | None = None
            waits = lock_waits()
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    now = time.monotonic()
                    deadline = now + self.busy_timeout_s if deadline is None else deadline
                    if not is_busy(exc) or now >= deadline:
                        raise
                time.sleep(min(next(waits), max(0.0, deadline - now)))
        finally:
            conn.execute(self._busy_pragma)

    def _open(self) -> tuple[sqlite3.Connection, sqlite3.Connection | None]:
        """The connection, migrated, and the second one for :meth:`data_version` (None when it
        cannot be opened)."""
        watch = None
        if self.path.parent and not self.path.parent.exists():
            raise BackendError(f"SQLite database directory {self.path.parent} does not exist")
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._enable_wal(conn)
            # FULL: a claim the backend confirmed survives a power cut, not only a crash.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(self._busy_pragma)
            migrate(
                conn,
                STEPS,
                create_table=Q["create_schema_table"],
                read_version=Q["schema_version"],
                write_version=Q["set_schema_version"],
                where=f"SQLite {self.path}",
                additions=ADDITIONS,
                # BEGIN IMMEDIATE: processes opening a new file at once wait for the first.
                transaction=lambda: self._transaction(conn),
                logger=logger,
            )
            self.write(conn, lambda rows, now: None)  # read or set the clock's anchor
            # WAL is set in the file: the second connection opens in it. Its errors leave the
            # change feed reading its tables every poll, as without it.
            with contextlib.suppress(sqlite3.Error):
                watch = sqlite3.connect(
                    self.path, timeout=0, isolation_level=None, check_same_thread=False
                )
        except BaseException:
            conn.close()
            raise
        return conn, watch

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
        # locked" at once, without its busy handler, while another process opens the same new
        # file: retry for as long as the busy timeout allows.
        deadline = time.monotonic() + self.busy_timeout_s
        for delay in backoff(first=0.01, cap=0.1):
            try:
                found = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)
        mode = str(found[0]).lower() if found else "unknown"
        if mode != "wal":
            # SQLite answers with the mode in effect; it keeps the old one where WAL cannot
            # work (an in-memory database, a file system without shared memory).
            raise BackendError(
                f"SQLite {self.path} cannot use WAL mode (its journal_mode is {mode!r}): the "
                "backend needs WAL so that several processes share one file safely; use a "
                "file on a local disk (not ':memory:', not a network file system)"
            )
