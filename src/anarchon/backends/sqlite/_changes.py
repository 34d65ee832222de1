"""What the SQLite backend's subscribers hear, by polling (SQLite cannot notify other processes).

One poller reads, in one trip to the connection's thread, the releases and results written to
``anarchon_events`` and the claims won since its last read: the first attempts recorded in
``anarchon_runs``, found by rowid (rows are added in commit order; nothing else is written for
a notice, so a claim costs no second insert). It reads every :data:`~._options.EVENTS_POLL_MS`,
and every :data:`~._options.CLAIMED_POLL_MS` inside the windows in which the scheduler waits
to hear whether another instance won a slot (:meth:`Changes.expect`, a backup's rank delay):
polling fast all the time would cost an idle process about 1 % of a core.

A poll reads the tables only when something was committed to the file since its last read:
it first asks :meth:`~._connection.Connection.data_version` (a second connection's ``PRAGMA
data_version``, which moves on any connection's commit, this backend's own included), on the
event loop, and goes no further while it stands still. An idle poll then costs a pragma and
no trip to the connection's thread (the trip, not the three queries, was most of a poll's
cost); a write is read at the next poll, so no notice comes later than before.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ...backend import ChangeEvent, ClaimNotice
from ._options import CLAIMED_POLL_MS, EVENTS_POLL_MS
from ._queries import Q

if TYPE_CHECKING:
    import sqlite3

    from ._connection import Connection

__all__ = ["Changes"]

# The statuses of a won first attempt (a skipped or missed slot was not won).
_WON = ("running", "succeeded", "failed")
# The LIMIT of the events_since and runs_since queries: a read that meets it leaves more to read.
READ_LIMIT: Final = 5_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Changes:
    """The poller's cursors (what was seen) and pace (when to read next) for one connection."""

    def __init__(self, db: Connection) -> None:
        self._db = db
        self._event_seq: int | None = None
        self._run_rowid: int | None = None
        # data_version() before the last read of the tables: while it answers the same, nothing
        # was committed since (None: read them at the next poll).
        self._version: int | None = None
        # (start, end) of the windows not yet begun, wall-clock ms; the end of those begun.
        self._windows: list[tuple[int, int]] = []
        self._fast_until = 0
        self._wake_at: int | None = None
        self._waiter: asyncio.Future[bool] | None = None

    async def follow_events(self) -> None:
        """Report the events written from now on (the first call sets the cursor)."""
        if self._event_seq is None:
            self._event_seq = await self._db.call(
                lambda c: int(c.execute(Q["last_event"]).fetchone()[0])
            )
            self._version = None

    async def follow_claims(self) -> None:
        """Report the claims won from now on (the first call sets the cursor)."""
        if self._run_rowid is None:
            self._run_rowid = await self._db.call(
                lambda c: int(c.execute(Q["last_run_rowid"]).fetchone()[0])
            )
            self._version = None

    def forget(self) -> None:
        """Drop the cursors and windows (the backend stopped)."""
        self._event_seq = self._run_rowid = None
        self._version = None
        self._windows.clear()
        self._fast_until = 0

    def expect(self, start_ms: int, end_ms: int) -> None:
        """Poll fast from ``start_ms`` to ``end_ms`` (wall clock, epoch ms)."""
        if end_ms <= start_ms:
            return
        heapq.heappush(self._windows, (start_ms, end_ms))
        waiter, wake_at = self._waiter, self._wake_at
        if waiter is not None and not waiter.done() and wake_at is not None and start_ms < wake_at:
            waiter.set_result(False)  # asleep past the window's start: wake up and plan again

    async def next(self) -> Sequence[ChangeEvent | ClaimNotice]:
        """Wait for the next poll, then read what is new (a stream for the change feed)."""
        await self._wait()
        # Before the read: a commit between the two moves it again, and is read next time.
        version = self._db.data_version()
        if version is not None and version == self._version:
            return ()  # nothing committed since the last read
        seq, rowid = self._event_seq, self._run_rowid
        events, runs, newest = await self._db.call(lambda c: _read(c, seq, rowid))
        # A read that met its limit leaves more to read, though nothing new is committed.
        full = len(events) >= READ_LIMIT or len(runs) >= READ_LIMIT
        self._version = None if full else version
        found: list[ChangeEvent | ClaimNotice] = []
        if events:
            self._event_seq = int(events[-1][0])
            found += [ChangeEvent(job, key, bool(released)) for _, job, key, released in events]
        if runs:
            self._run_rowid = int(runs[-1][0])
            found += [_notice(row) for row in runs if row[5] == 1 and row[6] in _WON]
        elif rowid is not None and newest < rowid and self._run_rowid == rowid:
            self._run_rowid = newest  # the rowids went back (a VACUUM renumbers them)
        return found

    def delay_ms(self, now: int) -> int:
        """How long to wait before the next poll, at wall-clock ``now``."""
        windows = self._windows
        while windows and windows[0][0] <= now:
            self._fast_until = max(self._fast_until, heapq.heappop(windows)[1])
        if now < self._fast_until:
            return CLAIMED_POLL_MS
        if windows:
            return max(0, min(EVENTS_POLL_MS, windows[0][0] - now))
        return EVENTS_POLL_MS

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = _wall_ms()
            delay = self.delay_ms(now)
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiter, self._wake_at = waiter, now + delay
            timer = loop.call_later(delay / 1000, _wake, waiter)
            try:
                if await waiter:
                    return
            finally:
                timer.cancel()
                self._waiter = self._wake_at = None


def _wake(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


def _read(
    conn: sqlite3.Connection, seq: int | None, rowid: int | None
) -> tuple[list[Any], list[Any], int]:
    """New events after ``seq`` and new runs after ``rowid`` (None: not followed); when there
    are no new runs, the newest rowid too."""
    events = [] if seq is None else conn.execute(Q["events_since"], (seq,)).fetchall()
    if rowid is None:
        return events, [], 0
    runs = conn.execute(Q["runs_since"], (rowid,)).fetchall()
    newest = 0 if runs else int(conn.execute(Q["last_run_rowid"]).fetchone()[0])
    return events, runs, newest


def _notice(row: tuple[Any, ...]) -> ClaimNotice:
    """A row of ``runs_since`` (rowid, job, slot key, instance, lease expiry, attempt, status)
    as a notice; the lease only while the run holds it."""
    _, job, key, instance, expires, _, status = row
    live = status == "running" and expires is not None
    return ClaimNotice(job, key, instance, int(expires) if live else None)
