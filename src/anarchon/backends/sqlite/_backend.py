"""The SQLite backend: the contract's methods, in :mod:`anarchon.backend`'s order.

The claim path: :meth:`SQLiteBackend.claim` decides each request with
:func:`anarchon.kit.lease.claim` inside one ``BEGIN IMMEDIATE`` transaction
(:meth:`._connection.Connection.write_each`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence

from ... import backend as contract
from ...errors import BackendError, LeaseLost
from ...kit import Action, Run, log_fields
from ...kit import lease as rules
from ...kit.feed import ChangeFeed
from ._changes import Changes
from ._connection import Connection
from ._control import SQLiteControl
from ._options import DEFAULT_PATH, ENV_PATH, EVENTS_POLL_MS, Options, parse_url
from ._queries import Q
from ._registry import SQLiteRegistry
from ._rows import SQLiteRows, newest_runs, row_of

__all__ = ["SQLiteBackend"]

logger = logging.getLogger("anarchon.backends.sqlite")


class SQLiteBackend(contract.LeaseBackend):
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
        self._options = Options.check(path, history_size, busy_timeout_ms)
        self.path = self._options.path
        self.history_size = self._options.history_size
        self._db = Connection(
            self.path, busy_timeout_ms=self._options.busy_timeout_ms, history_size=self.history_size
        )
        self._feed = ChangeFeed(self.name)
        self._changes = Changes(self._db)
        # The path is logged by start(), once: not by a clone (the scheduler's lease keeper
        # opens the same file), nor by start_reader (the commands, which say where they read).
        self._log_path = True

    @classmethod
    def from_url(cls, url: str) -> SQLiteBackend:
        """Build the backend from ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db``,
        with the options ``?history_size=`` and ``?busy_timeout_ms=``."""
        path, options = parse_url(url)
        return cls(path, **options)

    def __repr__(self) -> str:
        return f"SQLiteBackend({str(self.path)!r})"

    @property
    def _test_clock_offset_ms(self) -> int:
        """Test-only: milliseconds added to the backend's clock (0 in production)."""
        return self._db.clock.offset_ms

    @_test_clock_offset_ms.setter
    def _test_clock_offset_ms(self, value: int) -> None:
        self._db.clock.offset_ms = value

    async def start(self) -> None:
        """Open the file (WAL, busy timeout) and migrate the schema. Idempotent.

        Raises :class:`~anarchon.errors.BackendError` if the file cannot be used, for instance
        when SQLite cannot put it in WAL mode.
        """
        if self._db.is_open:
            return
        await self._db.open()
        if not self._log_path:
            return
        self._log_path = False
        logger.info(
            "SQLite database %s%s",
            self.path,
            f" (the default: {DEFAULT_PATH} in the working directory; every process that shares "
            f"slots must use this file: set {ENV_PATH} or pass a path)"
            if self._options.default_path
            else "",
            extra=log_fields(Action.SQLITE_PATH, path=str(self.path)),
        )

    async def start_reader(self) -> None:
        """:meth:`start` without logging the file's path: the commands open the backend this
        way and name the file in their own output."""
        self._log_path = False
        await self.start()

    async def stop(self) -> None:
        """Stop polling events and claim notices, and close the file."""
        await self._feed.stop()
        self._changes.forget()
        await self._db.close()

    async def claim(self, requests: Sequence[contract.ClaimRequest]) -> list[contract.ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`; the whole batch is one transaction, each
        request decided on its own."""
        reqs = list(requests)

        # The won claims' rows are also their notices (see _changes). Events are pruned by
        # finish_many, never here: one more transaction, and wait for the lock, before the
        # winner's handlers start.
        return await self._db.call(
            lambda conn: self._db.write_each(conn, reqs, rules.claim, rules.refused_outcome)
        )

    async def finish_many(
        self, items: Sequence[contract.FinishRequest]
    ) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`; the batch is one transaction, each
        result decided on its own (with its retry, into ``anarchon_requests``), and the job's
        history pruned."""
        batch = list(items)

        def decide(rows: SQLiteRows, item: contract.FinishRequest, now: int) -> Run | BackendError:
            ticket, status, error, retry = item
            try:
                run = rules.finish(rows, ticket, status, error, now, retry)
            except LeaseLost as exc:
                return exc
            rows.add_event(ticket.job, ticket.slot_key, False, now)
            return run

        def work(conn: sqlite3.Connection) -> list[Run | BackendError]:
            out = self._db.write_each(conn, batch, decide, lambda _item, _now, exc: exc)
            self._db.prune_events(conn)
            return out

        return await self._db.call(work)

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`."""
        return await self._db.call(lambda conn: newest_runs(conn, job, limit))

    async def slot_records(self, job: str, slot: int) -> contract.SlotRecords:
        """See :meth:`anarchon.backend.Backend.slot_records`: three index lookups, whatever the
        size of the job's history."""

        def read(conn: sqlite3.Connection) -> contract.SlotRecords:
            rows = conn.execute(Q["slot_records"], (job, slot)).fetchall()
            oldest = conn.execute(Q["oldest_record"], {"job": job}).fetchone()[0]
            return contract.SlotRecords(
                [r.to_run() for r in map(row_of, rows) if r is not None],
                None if oldest is None else int(oldest),
            )

        return await self._db.call(read)

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """See :meth:`anarchon.backend.Backend.histories`: the history statement of each job
        (an index range of ``limit`` rows), all in one call on the database's thread. That
        call, not the statement, is what a read costs here: 3 000 jobs read one call each
        waited for 3 000 turns of the thread and of the event loop."""
        names = list(dict.fromkeys(jobs))
        if limit <= 0 or not names:
            return {job: [] for job in names}

        def read(conn: sqlite3.Connection) -> dict[str, list[Run]]:
            return {job: newest_runs(conn, job, limit) for job in names}

        return await self._db.call(read)

    async def server_time_ms(self) -> int | None:
        """The backend's clock: the host's wall clock (see the package docstring), the one
        leases are measured on; a step of it not yet taken is taken first."""

        def read(conn: sqlite3.Connection) -> int:
            self._db.settle(conn)
            return self._db.clock.now()

        return await self._db.call(read)

    async def subscribe_claims(self, on_claims: contract.ClaimListener) -> bool:
        """Report the claims won from now on (the first attempts recorded in ``anarchon_runs``),
        polled with the events: every :data:`~._options.EVENTS_POLL_MS`, and every
        :data:`~._options.CLAIMED_POLL_MS` inside the windows given to :meth:`expect_claims`."""
        self._feed.add_claims(on_claims)
        await self._changes.follow_claims()
        self._poll()
        return True

    def expect_claims(self, start_ms: int, end_ms: int) -> None:
        """See :meth:`anarchon.backend.Backend.expect_claims`: claim notices are polled every
        :data:`~._options.CLAIMED_POLL_MS` in this window, not every
        :data:`~._options.EVENTS_POLL_MS`."""
        self._changes.expect(start_ms, end_ms)

    def _poll(self) -> None:
        """Start the one poller of events and claim notices (once)."""
        if not self._feed.running:
            self._feed.start(
                self._changes.next, retry_s=EVENTS_POLL_MS / 1000, errors=(BackendError,)
            )

    def registry(self) -> SQLiteRegistry:
        """The registry, in a table of its own in this file (see ``_registry``)."""
        return SQLiteRegistry(self)

    def control(self) -> SQLiteControl:
        """Pauses and run requests, in tables of their own in this file (see ``_control``);
        claims read the pauses in their own transaction."""
        return SQLiteControl(self)

    async def renew_many(
        self, tickets: Sequence[contract.Ticket]
    ) -> list[contract.Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`; one transaction, each ticket
        decided on its own."""
        batch = list(tickets)

        def decide(
            rows: SQLiteRows, ticket: contract.Ticket, now: int
        ) -> contract.Ticket | BackendError:
            try:
                return rules.renew(rows, ticket, now)
            except BackendError as exc:  # LeaseLost, or a lease_ms out of range
                return exc

        return await self._db.call(
            lambda conn: self._db.write_each(conn, batch, decide, lambda _item, _now, exc: exc)
        )

    async def take_over(self, request: contract.TakeoverRequest) -> contract.TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`.

        Backups poll this every :attr:`release_poll_ms`; while the lease is live the answer
        comes from a read, without taking the database's write lock.
        """

        def decide(rows: SQLiteRows, now: int) -> contract.TakeoverOutcome:
            outcome = rules.take_over(rows, request, now)
            if outcome.status is contract.TakeoverStatus.EXHAUSTED:
                rows.add_event(request.job, request.slot_key, False, now)
            return outcome

        def work(conn: sqlite3.Connection) -> contract.TakeoverOutcome:
            if rules.unstorable(request) is None and not self._db.clock.pending(conn):
                rows = SQLiteRows(conn, self.history_size)
                peeked = rules.peek_takeover(rows, request, self._db.clock.now())
                if peeked is not None:
                    return peeked
            return self._db.write(conn, decide)

        return await self._db.call(work)

    async def release(self, ticket: contract.Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; other processes hear of it through
        the events table."""

        def work(rows: SQLiteRows, now: int) -> None:
            rules.release(rows, ticket, now)
            rows.add_event(ticket.job, ticket.slot_key, True, now)

        await self._db.call(lambda conn: self._db.write(conn, work))

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`."""

        def read(conn: sqlite3.Connection) -> int | None:
            value = conn.execute(Q["last_slot"], {"job": job}).fetchone()[0]
            return None if value is None else int(value)

        return await self._db.call(read)

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

        return await self._db.call(read)

    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        """See :meth:`anarchon.backend.LeaseBackend.open_runs`: one query per 400 jobs, through
        the index of running attempts."""
        names = list(dict.fromkeys(jobs))

        def read(conn: sqlite3.Connection) -> list[Run]:
            found: list[Run] = []
            for start in range(0, len(names), 400):
                chunk = names[start : start + 400]
                query = Q["open_runs"].replace("?jobs", ", ".join("?" * len(chunk)))
                rows = conn.execute(query, [*chunk, since_ms]).fetchall()
                found += [r.to_run() for r in map(row_of, rows) if r is not None]
            return found

        return await self._db.call(read)

    async def subscribe(self, on_change: contract.ChangeListener) -> None:
        """Poll the events table every :data:`~._options.EVENTS_POLL_MS` and report new
        releases and results to ``on_change``; events written before this call are not
        reported. A listener that raises is logged and the others still hear of it."""
        self._feed.add(on_change)
        await self._changes.follow_events()
        self._poll()

    def clone(self) -> SQLiteBackend:
        """A new, unstarted backend on the same file with the same options and a connection of
        its own, for the scheduler's lease keeper thread."""
        clone = SQLiteBackend(
            self.path,
            history_size=self.history_size,
            busy_timeout_ms=self._options.busy_timeout_ms,
        )
        clone._log_path = False  # this backend's start logged the path
        return clone
