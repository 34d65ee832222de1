"""SQLite: the embedded default, for several processes on one host sharing one file.

The file is opened in WAL mode with a busy timeout; every decision is one short
``BEGIN IMMEDIATE`` transaction, so exactly one process wins each slot. SQLite cannot notify
other processes, so each release and result is also written to an events table that every
process polls once every :data:`EVENTS_POLL_MS` (one small read, however many runs it watches)
to wake its backups.

The backend's clock (lease expiry, fences, the times in history, :meth:`server_time_ms`) is the
host's wall clock *anchored* once per boot: ``anchor_wall + (boot clock now - anchor_boot)``,
the anchor stored in the file and keyed by ``/proc/sys/kernel/random/boot_id``. The boot clock
(``CLOCK_BOOTTIME``) is one clock for every process of the host; it counts suspended time and
never steps, so an NTP step or a VM resume cannot expire every lease at once. The backend clock
then follows the wall clock by slewing, at most :data:`SLEW_MS` per :data:`SLEW_EVERY_MS`
(1 %), and takes a difference of more than :data:`STEP_OVER_MS` at once (a clock that was wrong
at boot). Without a boot id (not Linux) it is the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    TakeoverStatus,
    Ticket,
)
from ...errors import BackendError, BackendUnavailable, LeaseLost
from .. import _lease_rules as rules
from .._lease_rules import RunRow
from .._sql import load_queries
from ._registry import SQLiteRegistry

__all__ = ["SQLiteBackend"]

logger = logging.getLogger(__name__)

Q: Final = load_queries(__name__, "queries.sql")
SCHEMA_VERSION: Final = 4
MIGRATIONS: Final = {n: Q[f"migration_{n}"] for n in range(1, SCHEMA_VERSION + 1)}
ENV_PATH: Final = "ANARCHON_DB"
DEFAULT_PATH: Final = "anarchon.db"
BUSY_TIMEOUT: Final = Bound(0, 3_600_000, ms=True)
# How often each process reads the events table; a hand-over is noticed within this.
EVENTS_POLL_MS: Final = 200
# Events are kept this long: far longer than a poll interval, so none is missed; the table is
# trimmed at most this often.
EVENTS_KEEP_MS: Final = 60_000
EVENTS_PRUNE_EVERY_MS: Final = 10_000
# The backend clock follows the wall clock by at most SLEW_MS per SLEW_EVERY_MS (1 %): a lease
# of 15 s stretches or shrinks by at most 0.15 s while it catches up after a step. Differences
# under SLEW_FROM_MS are left alone; over STEP_OVER_MS they are taken at once.
SLEW_MS: Final = 10
SLEW_EVERY_MS: Final = 1_000
SLEW_FROM_MS: Final = 100
STEP_OVER_MS: Final = 3_600_000
BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")
# What a value the file cannot hold raises while it is bound or computed: decided per item.
_DATA_ERRORS: Final = (
    OverflowError,
    ValueError,
    sqlite3.DataError,
    sqlite3.InterfaceError,
    sqlite3.IntegrityError,
)

T = TypeVar("T")
Item = TypeVar("Item")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _boot_ms() -> int | None:
    """The host's boot clock (CLOCK_BOOTTIME: never steps, counts suspend), or None."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return time.clock_gettime_ns(clock) // 1_000_000


def _boot_id() -> str | None:
    """This boot of the host, or None where the kernel does not tell (not Linux)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


class _Clock:
    """The backend clock of one process: the shared anchor of this boot, kept in the file.

    :meth:`tick` runs inside every write transaction and reads (and if needed moves) the anchor
    there, so every process decides with the same clock; :meth:`now` between transactions uses
    the anchor last read.
    """

    def __init__(self) -> None:
        self.boot = _boot_id() if _boot_ms() is not None else None
        self.anchor: tuple[int, int] | None = None
        #: Test-only: added to the clock, so tests can move the backend's time (never set in
        #: production; see tests/conformance/test_differential.py).
        self.offset_ms = 0

    def now(self) -> int:
        boot = _boot_ms()
        if self.anchor is None or boot is None:
            return _wall_ms() + self.offset_ms
        wall, at = self.anchor
        return wall + (boot - at) + self.offset_ms

    def tick(self, conn: sqlite3.Connection) -> int:
        """The clock now, read inside a write transaction; anchors it for a new boot and slews
        it toward the wall clock (see the module docstring)."""
        boot = _boot_ms()
        if self.boot is None or boot is None:
            return _wall_ms() + self.offset_ms
        wall = _wall_ms()
        found = conn.execute(Q["clock_anchor"]).fetchone()
        if found is None or found[0] != self.boot:
            anchor = (wall, boot)
        else:
            anchor = (int(found[1]), int(found[2]))
            now = anchor[0] + boot - anchor[1]
            drift = wall - now
            if abs(drift) > STEP_OVER_MS:
                logger.warning(
                    "the host clock is %d ms from the SQLite backend's clock; taking it at once",
                    drift,
                    extra={"action": "clock_stepped"},
                )
                anchor = (wall, boot)
            elif abs(drift) > SLEW_FROM_MS and boot - anchor[1] >= SLEW_EVERY_MS:
                anchor = (now + max(-SLEW_MS, min(SLEW_MS, drift)), boot)
        if found is None or (found[0], found[1], found[2]) != (self.boot, *anchor):
            conn.execute(
                Q["set_clock_anchor"],
                {"boot_id": self.boot, "wall_ms": anchor[0], "boot_ms": anchor[1]},
            )
        self.anchor = anchor
        return anchor[0] + boot - anchor[1] + self.offset_ms


class _SQLiteRows:
    """The :class:`~anarchon.backends._lease_rules.RowStore` over one open transaction."""

    def __init__(self, conn: sqlite3.Connection, history_size: int) -> None:
        self.conn = conn
        self.history_size = history_size

    def current(self, job: str, slot_key: str) -> RunRow | None:
        return _row(self.conn.execute(Q["current"], (job, slot_key)).fetchone())

    def live_holder(self, job: str, now: int) -> RunRow | None:
        return _row(self.conn.execute(Q["live_holder"], (job, now)).fetchone())

    def insert(self, row: RunRow) -> None:
        self.conn.execute(Q["insert"], _params(row))

    def update(self, row: RunRow) -> None:
        self.conn.execute(Q["update"], _params(row))

    def next_fence(self, job: str, now: int) -> int:
        return int(self.conn.execute(Q["next_fence"], {"job": job, "now": now}).fetchone()[0])

    def pruned_through(self, job: str) -> int | None:
        found = self.conn.execute(Q["pruned_through"], (job,)).fetchone()
        return None if found is None or found[0] is None else int(found[0])

    def prune(self, job: str, keep_key: str, cutoff: int | None) -> None:
        """See :meth:`~anarchon.backends._lease_rules.RowStore.prune`."""
        conn = self.conn
        total = int(conn.execute(Q["slot_count"], (job,)).fetchone()[0])
        victims: list[str] = []
        if cutoff is not None:
            aged = {"job": job, "keep_key": keep_key, "cutoff": cutoff, "limit": rules.PRUNE_BATCH}
            victims += [key for (key,) in conn.execute(Q["prune_aged"], aged)]
        slots = [s for key in victims for (s,) in conn.execute(Q["drop_slot"], (job, key))]
        room = min(rules.PRUNE_BATCH, total - self.history_size) - len(victims)
        if room > 0:
            oldest = {"job": job, "keep_key": keep_key, "limit": room}
            for (key,) in conn.execute(Q["prune_oldest"], oldest).fetchall():
                slots += [s for (s,) in conn.execute(Q["drop_slot"], (job, key))]
        slots = [s for s in slots if s is not None]
        if slots:
            conn.execute(Q["raise_pruned_through"], {"job": job, "slot": max(slots)})


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
        disk (SQLite locking is unreliable on network file systems, and WAL mode, which the
        backend requires, does not work there).
    :param history_size: at most this many slots (a slot's attempts count as one) are kept per
        job, pruned when results are recorded.
    :param busy_timeout_ms: how long a write waits for another process's transaction.
    """

    name = "sqlite"
    one_host = True

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
        self._clock = _Clock()
        self._events_pruned_at = 0
        self._poller: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[str, str, bool], None]] = []

    def __repr__(self) -> str:
        return f"SQLiteBackend({str(self.path)!r})"

    @property
    def _test_clock_offset_ms(self) -> int:
        """Test-only: milliseconds added to the backend's clock (0 in production)."""
        return self._clock.offset_ms

    @_test_clock_offset_ms.setter
    def _test_clock_offset_ms(self, value: int) -> None:
        self._clock.offset_ms = value

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

    def _write(self, conn: sqlite3.Connection, fn: Callable[[_SQLiteRows, int], T]) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction. Whatever fails, COMMIT included,
        the transaction is rolled back, so a failed commit cannot leave the connection inside
        a transaction that locks every other process out."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(_SQLiteRows(conn, self.history_size), self._clock.tick(conn))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return result

    def _write_each(
        self,
        conn: sqlite3.Connection,
        items: list[Item],
        decide: Callable[[_SQLiteRows, Item, int], T],
        refuse: Callable[[Item, int, BackendError], T],
    ) -> list[T]:
        """Decide each item in one transaction. An item whose values the file cannot hold is
        answered by ``refuse`` and the others are decided as usual: the batch is tried as a
        whole, and only if an item fails that way again with a savepoint per item."""

        def run(rows: _SQLiteRows, now: int, guarded: bool) -> list[T]:
            out: list[T] = []
            for item in items:
                if not guarded:
                    out.append(decide(rows, item, now))
                    continue
                conn.execute("SAVEPOINT item")
                try:
                    out.append(decide(rows, item, now))
                except _DATA_ERRORS as exc:
                    conn.execute("ROLLBACK TO item")
                    error = BackendError(f"SQLite {self.path}: cannot store this item: {exc!r}")
                    out.append(refuse(item, now, error))
                conn.execute("RELEASE item")
            return out

        try:
            return self._write(conn, lambda rows, now: run(rows, now, False))
        except _DATA_ERRORS:
            return self._write(conn, lambda rows, now: run(rows, now, True))

    def _open(self) -> sqlite3.Connection:
        if self.path.parent and not self.path.parent.exists():
            raise BackendError(f"SQLite database directory {self.path.parent} does not exist")
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._enable_wal(conn)
            # FULL: a claim the backend confirmed survives a power cut, not only a crash.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
            self._migrate(conn)
            self._write(conn, lambda rows, now: None)  # read or set the clock's anchor
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
        # locked" at once, without its busy handler, while another process opens the same new
        # file: retry for as long as the busy timeout allows.
        deadline = time.monotonic() + self._busy_timeout_s
        for delay in backoff(first=0.01, cap=0.1):
            try:
                found = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
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
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the file (WAL, busy timeout) and migrate the schema. Idempotent.

        Raises :class:`~anarchon.errors.BackendError` if the file cannot be used, for instance
        when SQLite cannot put it in WAL mode.
        """
        if self._conn is not None:
            return
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="anarchon-sqlite")
        loop = asyncio.get_running_loop()
        try:
            self._conn = await loop.run_in_executor(self._thread, self._open)
        except (sqlite3.Error, BackendError) as exc:
            self._thread.shutdown(wait=False)
            self._thread = None
            if isinstance(exc, BackendError):
                raise
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
        """See :meth:`anarchon.backend.Backend.claim`; the whole batch is one transaction, each
        request decided on its own."""
        reqs = list(requests)

        def work(conn: sqlite3.Connection) -> list[ClaimOutcome]:
            return self._write_each(conn, reqs, rules.claim, rules.refused_outcome)

        return await self._call(work)

    async def renew(self, ticket: Ticket) -> Ticket:
        """See :meth:`anarchon.backend.LeaseBackend.renew`."""
        [answer] = await self.renew_many([ticket])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`.

        Backups poll this every :attr:`release_poll_ms`; while the lease is live the answer
        comes from a read, without taking the database's write lock.
        """

        def decide(rows: _SQLiteRows, now: int) -> TakeoverOutcome:
            outcome = rules.take_over(rows, request, now)
            if outcome.status is TakeoverStatus.EXHAUSTED:
                rows.conn.execute(Q["add_event"], (request.job, request.slot_key, 0, now))
            return outcome

        def work(conn: sqlite3.Connection) -> TakeoverOutcome:
            if rules.unstorable(request) is None:
                rows = _SQLiteRows(conn, self.history_size)
                peeked = rules.peek_takeover(rows, request, self._clock.now())
                if peeked is not None:
                    return peeked
            return self._write(conn, decide)

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
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`; the batch is one transaction, each
        result decided on its own."""
        batch = list(items)

        def decide(rows: _SQLiteRows, item: FinishRequest, now: int) -> Run | BackendError:
            ticket, status, error = item
            try:
                run = rules.finish(rows, ticket, status, error, now)
            except LeaseLost as exc:
                return exc
            rows.conn.execute(Q["add_event"], (ticket.job, ticket.slot_key, 0, now))
            return run

        def work(conn: sqlite3.Connection) -> list[Run | BackendError]:
            out = self._write_each(conn, batch, decide, lambda _item, _now, exc: exc)
            self._prune_events(conn)
            return out

        return await self._call(work)

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`; one transaction, each ticket
        decided on its own."""
        batch = list(tickets)

        def decide(rows: _SQLiteRows, ticket: Ticket, now: int) -> Ticket | BackendError:
            try:
                return rules.renew(rows, ticket, now)
            except BackendError as exc:  # LeaseLost, or a lease_ms out of range
                return exc

        def work(conn: sqlite3.Connection) -> list[Ticket | BackendError]:
            return self._write_each(conn, batch, decide, lambda _item, _now, exc: exc)

        return await self._call(work)

    def _prune_events(self, conn: sqlite3.Connection) -> None:
        now = self._clock.now()
        if now - self._events_pruned_at >= EVENTS_PRUNE_EVERY_MS:
            self._events_pruned_at = now
            self._write(
                conn, lambda rows, at: rows.conn.execute(Q["prune_events"], (at - EVENTS_KEEP_MS,))
            )

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`."""

        def read(conn: sqlite3.Connection) -> list[Run]:
            rows = conn.execute(Q["history"], (job, limit)).fetchall()
            return [r.to_run() for r in map(_row, rows) if r is not None]

        return await self._call(read)

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`."""

        def read(conn: sqlite3.Connection) -> int | None:
            value = conn.execute(Q["last_slot"], {"job": job}).fetchone()[0]
            return None if value is None else int(value)

        return await self._call(read)

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """See :meth:`anarchon.backend.LeaseBackend.last_slots`; one query per 400 jobs."""
        names = list(jobs)

        def read(conn: sqlite3.Connection) -> dict[str, int | None]:
            found: dict[str, int | None] = dict.fromkeys(names)
            for start in range(0, len(names), 400):
                chunk = names[start : start + 400]
                query = Q["last_slots"].replace("?jobs", ", ".join("?" * len(chunk)))
                found.update(conn.execute(query, chunk + chunk).fetchall())
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
        """The backend's clock: the host's wall clock as anchored for this boot (see the
        module docstring), the one leases are measured on."""
        return self._clock.now()

    def registry(self) -> SQLiteRegistry:
        """The registry, in a table of its own in this file (see ``_registry``)."""
        return SQLiteRegistry(self)

    def clone(self) -> SQLiteBackend:
        """A new, unstarted backend on the same file with the same options and a connection of
        its own, for the scheduler's lease keeper thread."""
        return SQLiteBackend(
            self.path,
            history_size=self.history_size,
            busy_timeout_ms=round(self._busy_timeout_s * 1000),
        )
