"""SQLite's poller and its write lock: claim notices read from the runs table, polled fast only
inside the windows the scheduler expects notices in, and a write that waits for another
process's transaction in short steps instead of SQLite's busy handler."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import types
from collections.abc import Awaitable, Callable, Sequence
from contextlib import closing
from pathlib import Path

import pytest

from anarchon import BackendUnavailable, RunStatus, SQLiteBackend
from anarchon.backend import ChangeEvent, ClaimNotice, ClaimRequest, ClaimStatus
from anarchon.backends.sqlite import _connection
from anarchon.backends.sqlite._changes import Changes
from anarchon.backends.sqlite._connection import Connection
from anarchon.backends.sqlite._options import (
    BUSY_WAIT_FIRST_S,
    BUSY_WAIT_MAX_S,
    CLAIMED_POLL_MS,
    EVENTS_POLL_MS,
)
from tests.records import claim_request

SLOT = 1_800_000_000_000


def request(slot: int = SLOT, instance: str = "i") -> ClaimRequest:
    return claim_request("job", slot, instance)


async def heard_within(notices: list[ClaimNotice], count: int, limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while len(notices) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return len(notices) >= count


def test_the_poller_reads_fast_only_inside_the_expected_windows(tmp_path: Path) -> None:
    changes = Changes(Connection(tmp_path / "x.db", busy_timeout_ms=1000, history_size=10))
    assert changes.delay_ms(1_000) == EVENTS_POLL_MS  # no window: the events' pace
    changes.expect(2_000, 2_600)
    changes.expect(5_000, 5_000)  # empty: ignored
    assert changes.delay_ms(1_000) == EVENTS_POLL_MS
    assert changes.delay_ms(1_920) == 80  # wakes when the window begins
    assert changes.delay_ms(2_000) == CLAIMED_POLL_MS
    assert changes.delay_ms(2_599) == CLAIMED_POLL_MS
    assert changes.delay_ms(2_600) == EVENTS_POLL_MS  # over
    changes.expect(3_000, 3_400)
    changes.expect(3_100, 3_900)  # overlapping windows: fast until the last ends
    assert changes.delay_ms(3_200) == CLAIMED_POLL_MS
    assert changes.delay_ms(3_800) == CLAIMED_POLL_MS
    assert changes.delay_ms(3_900) == EVENTS_POLL_MS


async def _count_polls(backend: SQLiteBackend) -> list[float]:
    """Record the time of each poll of ``backend``'s poller (set before it starts)."""
    polls: list[float] = []
    original = backend._changes.next

    async def counted() -> Sequence[ChangeEvent | ClaimNotice]:
        found = await original()
        polls.append(time.monotonic())
        return found

    backend._changes.next = counted  # type: ignore[method-assign]
    return polls


async def test_claim_notices_are_polled_fast_only_while_expected(tmp_path: Path) -> None:
    """Outside the windows the notices are read with the events (5 times a second); inside,
    every 50 ms (20 times: at least 8 on a loaded host)."""
    backend = SQLiteBackend(tmp_path / "a.db")
    await backend.start()
    polls = await _count_polls(backend)
    heard: list[ClaimNotice] = []
    assert await backend.subscribe_claims(heard.extend)
    try:
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await asyncio.sleep(1.0)
        slow = sum(1 for t in polls if t > began)
        assert slow <= 1000 // EVENTS_POLL_MS + 1, polls
        now = time.time_ns() // 1_000_000
        backend.expect_claims(now, now + 1_100)  # wakes the poller asleep for 200 ms
        began = time.monotonic()
        await asyncio.sleep(1.0)
        fast = sum(1 for t in polls if t > began)
        assert fast >= 8, (slow, fast)
    finally:
        await backend.stop()


async def _statements(backend: SQLiteBackend, seconds: float) -> list[str]:
    """The statements ``backend``'s connection runs in the next ``seconds``."""
    seen: list[str] = []
    await backend._db.call(lambda c: c.set_trace_callback(seen.append))
    try:
        await asyncio.sleep(seconds)
    finally:
        await backend._db.call(lambda c: c.set_trace_callback(None))
    return seen


async def test_an_idle_poll_reads_one_pragma_and_a_write_is_still_heard_at_once(
    tmp_path: Path,
) -> None:
    """While nothing is committed to the file, a poll asks a second connection's ``PRAGMA
    data_version`` on the event loop and sends the backend's connection nothing (it read the
    events and the runs there five times a second); a claim of another process, of this one, a
    result and a release are heard at the next poll as before."""
    path = tmp_path / "i.db"
    listener, other = SQLiteBackend(path), SQLiteBackend(path)
    await listener.start()
    await other.start()
    heard: list[ClaimNotice] = []
    changes: list[tuple[str, str, bool]] = []
    try:
        await listener.subscribe(lambda *change: changes.append(change))
        assert await listener.subscribe_claims(heard.extend)
        await asyncio.sleep(0.5)  # the first poll read the tables
        asked = listener._db.data_version
        polls: list[int | None] = []

        def counted() -> int | None:
            polls.append(asked())
            return polls[-1]

        listener._db.data_version = counted  # type: ignore[method-assign]
        idle = await _statements(listener, 1.0)
        assert len(polls) >= 2 and polls[0] is not None, polls
        assert idle == [], idle
        began = time.monotonic()
        [won] = await other.claim([request(instance="other")])
        assert won.ticket is not None and await heard_within(heard, 1, 2.0)
        assert time.monotonic() - began < 1.0  # the next poll: 200 ms, on a loaded host more
        [mine] = await listener.claim([request(SLOT + 1_000, instance="listener")])
        assert mine.ticket is not None and await heard_within(heard, 2, 2.0)
        await other.finish(won.ticket, RunStatus.SUCCEEDED, None)
        await listener.release(mine.ticket, "handed over")
        deadline = time.monotonic() + 2.0
        while len(changes) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        assert changes == [("job", str(SLOT), False), ("job", str(SLOT + 1_000), True)]
        assert [n.instance for n in heard] == ["other", "listener"]
    finally:
        await other.stop()
        await listener.stop()


async def test_a_backlog_past_one_read_is_read_on_without_another_write(tmp_path: Path) -> None:
    """A read gives at most 5 000 events: one that met the limit leaves the rest to the next
    poll, though nothing is committed in between (the poll reads only after a commit)."""
    from anarchon.backends.sqlite._changes import READ_LIMIT

    path = tmp_path / "b.db"
    backend = SQLiteBackend(path)
    await backend.start()
    changes: list[tuple[str, str, bool]] = []
    try:
        await backend.subscribe(lambda *change: changes.append(change))
        count = READ_LIMIT + 7
        with closing(sqlite3.connect(path, isolation_level=None)) as raw:
            raw.execute("BEGIN IMMEDIATE")
            raw.executemany(
                "INSERT INTO anarchon_events (job, slot_key, released, at) VALUES (?, ?, 0, 0)",
                [("job", str(n)) for n in range(count)],
            )
            raw.execute("COMMIT")
        deadline = time.monotonic() + 5.0
        while len(changes) < count and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert len(changes) == count and changes[-1] == ("job", str(count - 1), False)
    finally:
        await backend.stop()


async def test_a_won_claim_of_another_process_is_heard_and_nothing_else(tmp_path: Path) -> None:
    """Notices come from the runs table: won first attempts of any process; a lost claim, a
    skipped slot and a later attempt are no notice."""
    path = tmp_path / "n.db"
    listener, other = SQLiteBackend(path), SQLiteBackend(path)
    await listener.start()
    await other.start()
    heard: list[ClaimNotice] = []
    try:
        assert await listener.subscribe_claims(heard.extend)
        [won] = await other.claim([request(instance="other")])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        [lost] = await listener.claim([request(instance="listener")])
        assert lost.status is ClaimStatus.LOST
        [last] = await other.claim([request(SLOT + 1000, instance="other")])
        assert last.ticket is not None
        assert await heard_within(heard, 2)
        await asyncio.sleep(0.5)
        assert heard == [
            ClaimNotice("job", str(SLOT), "other", won.ticket.lease_expires_at_ms),
            ClaimNotice("job", str(SLOT + 1000), "other", last.ticket.lease_expires_at_ms),
        ]
    finally:
        await other.stop()
        await listener.stop()


async def test_notices_are_heard_again_after_the_rowids_went_back(tmp_path: Path) -> None:
    """A VACUUM of an emptied table gives rowids again: the poller follows it back, so only a
    notice written in between can be missed (a losing claim, never a run)."""
    path = tmp_path / "v.db"
    backend = SQLiteBackend(path)
    await backend.start()
    heard: list[ClaimNotice] = []
    try:
        assert await backend.subscribe_claims(heard.extend)
        for n in range(3):
            await backend.claim([request(SLOT + n * 1000)])
        assert await heard_within(heard, 3)
        with closing(sqlite3.connect(path, isolation_level=None)) as raw:
            raw.execute("DELETE FROM anarchon_runs")
            raw.execute("VACUUM")
        await asyncio.sleep(0.6)  # a few empty polls: the cursor goes back to 0
        [won] = await backend.claim([request(SLOT + 10_000)])
        assert won.status is ClaimStatus.WON
        assert await heard_within(heard, 4)
        assert heard[-1].slot_key == str(SLOT + 10_000)
    finally:
        await backend.stop()


def _hold_write_lock(path: Path, seconds: float) -> Callable[[], None]:
    """Take the file's write lock in another connection and let it go after ``seconds``; the
    returned function waits until it is gone."""
    taken = threading.Event()

    def hold() -> None:
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(seconds)
            conn.execute("COMMIT")

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait(5)
    return thread.join


async def _with_sleeps_recorded(
    monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Awaitable[object]]
) -> tuple[object, list[float]]:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(
        _connection, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    )
    return await fn(), sleeps


async def test_a_write_waits_for_another_transaction_in_short_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's busy handler would sleep up to 100 ms at a time; the backend tries again
    after 0.25 ms, doubling to at most 2 ms, and wins the lock once it is free."""
    path = tmp_path / "w.db"
    backend = SQLiteBackend(path)
    await backend.start()
    try:
        join = _hold_write_lock(path, 0.3)
        outcomes, sleeps = await _with_sleeps_recorded(
            monkeypatch, lambda: backend.claim([request()])
        )
        join()
        assert [o.status for o in outcomes] == [ClaimStatus.WON]  # type: ignore[attr-defined]
        assert sleeps[0] == BUSY_WAIT_FIRST_S and max(sleeps) == BUSY_WAIT_MAX_S, sleeps
        assert len(sleeps) > 20  # 0.3 s in steps of at most 2 ms (about 150 on a quiet host)
    finally:
        await backend.stop()


async def test_a_write_gives_up_after_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    backend = SQLiteBackend(path, busy_timeout_ms=200)
    await backend.start()
    try:
        join = _hold_write_lock(path, 1.5)
        began = time.monotonic()
        with pytest.raises(BackendUnavailable, match="locked"):
            await backend.claim([request()])
        assert 0.2 <= time.monotonic() - began < 1.4
        join()
        [won] = await backend.claim([request()])  # the connection is usable again
        assert won.status is ClaimStatus.WON
    finally:
        await backend.stop()
