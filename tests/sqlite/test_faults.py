"""SQLite faults: a COMMIT that fails, a file that cannot use WAL, a wall clock that steps, a file
that is recreated, and one item of a batch that the file cannot store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from anarchon import BackendError, BackendUnavailable, RunStatus, SQLiteBackend, Trigger
from anarchon.backend import (
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    TakeoverRequest,
    TakeoverStatus,
)
from anarchon.backends.sqlite._connection import Connection
from anarchon.control import Pause
from tests.chaos.faketime import LIBRARY
from tests.records import instance_record
from tests.sqlite.test_control import run_request

SLOT = 1_800_000_000_000


def request(slot: int = SLOT, **kw: object) -> ClaimRequest:
    return ClaimRequest(
        job="job",
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=str(kw.pop("instance", "i")),
        trigger=Trigger.SCHEDULE,
        lease_ms=int(kw.pop("lease_ms", 5_000)),  # type: ignore[call-overload]
    )


def takeover(slot_key: str = str(SLOT)) -> TakeoverRequest:
    return TakeoverRequest(
        job="job",
        slot_key=slot_key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="backup",
        lease_ms=5_000,
        max_attempts=3,
    )


async def test_a_failed_commit_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In rollback-journal mode a COMMIT waits for readers and fails past the busy timeout;
    the transaction must not stay open (every later BEGIN would fail, and other processes
    would stay locked out)."""
    path = tmp_path / "journal.db"
    monkeypatch.setattr(Connection, "_enable_wal", lambda self, conn: None)
    backend = SQLiteBackend(path, busy_timeout_ms=200)
    await backend.start()
    with closing(sqlite3.connect(path, isolation_level=None)) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM anarchon_runs").fetchone()  # holds a SHARED lock
        with pytest.raises(BackendUnavailable, match="locked"):
            await backend.claim([request()])
        reader.execute("COMMIT")
    [won] = await backend.claim([request(SLOT + 1000)])
    assert won.status is ClaimStatus.WON
    other = SQLiteBackend(path, busy_timeout_ms=200)
    await other.start()
    [lost] = await other.claim([request(SLOT + 1000, instance="other")])
    assert lost.status is ClaimStatus.LOST
    await other.stop()
    await backend.stop()


async def test_a_database_without_wal_is_refused(tmp_path: Path) -> None:
    """SQLite keeps its journal mode where WAL cannot work and says which in its answer; an
    in-memory database is one such place (a file system without shared memory another)."""
    backend = SQLiteBackend(tmp_path / "any.db")
    backend._db.path = Path(":memory:")  # what SQLite opens: a private in-memory database
    with pytest.raises(BackendError, match=r"cannot use WAL mode \(its journal_mode is 'memory'\)"):
        await backend.start()


async def test_a_wall_clock_step_does_not_expire_leases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's clock takes the step at once (it is the host's wall clock, so the
    processes' offset stays 0) and moves the live lease by it: still held, for as long."""
    backend = SQLiteBackend(tmp_path / "clock.db")
    await backend.start()
    [won] = await backend.claim([request(lease_ms=30_000)])
    assert won.ticket is not None and won.ticket.lease_expires_at_ms is not None
    real = time.time_ns
    for step_s in (600, -90):  # +10 minutes, then back 90 s (more than max_late_ms)
        monkeypatch.setattr(time, "time_ns", lambda s=step_s: real() + s * 1_000_000_000)
        server = await backend.server_time_ms()
        assert server is not None and abs(server - time.time_ns() // 1_000_000) < 1_000
        held = await backend.take_over(takeover())
        assert held.status is TakeoverStatus.HELD, f"a {step_s} s step expired the lease"
        assert held.lease_expires_at_ms is not None and held.backend_now_ms is not None
        assert 20_000 < held.lease_expires_at_ms - held.backend_now_ms <= 30_000, step_s
    [after] = await backend.claim([request(SLOT + 1000)])
    assert after.ticket is not None and after.ticket.backend_now_ms is not None
    assert abs(after.ticket.backend_now_ms - time.time_ns() // 1_000_000) < 1_000
    renewed = await backend.renew(won.ticket)
    assert renewed.lease_expires_at_ms is not None
    await backend.stop()


async def test_a_step_moves_durations_and_leaves_instants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step is taken with every stored time that measures a duration moved by it (a live
    lease, a heartbeat, a request's due time, an instance's start only when going back), in
    the write that first sees it; history times and a pause's ``until`` stay."""
    backend = SQLiteBackend(tmp_path / "moves.db")
    await backend.start()
    now = time.time_ns() // 1_000_000
    [won] = await backend.claim([request(lease_ms=30_000)])
    assert won.ticket is not None and won.ticket.lease_expires_at_ms is not None
    registry, control = backend.registry(), backend.control()
    await registry.record(dataclasses.replace(instance_record("a", beat=now), started_ms=now))
    await control.request(run_request("job", now))
    await control.pause(Pause(job="job", by="me", at_ms=now, until_ms=now + 3_600_000))
    [run] = await backend.history("job")
    real = time.time_ns
    for step_ms, back in ((7_200_000, 0), (-90_000, -7_290_000)):  # from the real time
        monkeypatch.setattr(time, "time_ns", lambda s=step_ms: real() + s * 1_000_000)
        [record] = await registry.instances()  # a read: the step is taken first
        assert abs(record.heartbeat_ms - (now + step_ms)) < 2_000, step_ms
        assert abs(record.started_ms - (now + back)) < 2_000, step_ms
        assert await registry.remove_silent(time.time_ns() // 1_000_000 - 60_000) == []
        [req] = await control.requests()
        assert abs(req.due_ms - (now + step_ms)) < 2_000 and req.requested_at_ms == now
        [pause] = await control.pauses()
        assert pause.until_ms == now + 3_600_000
        [again] = await backend.history("job")
        assert again.started_at == run.started_at
        held = await backend.take_over(takeover())
        assert held.status is TakeoverStatus.HELD, step_ms
        assert held.lease_expires_at_ms is not None and held.backend_now_ms is not None
        assert 20_000 < held.lease_expires_at_ms - held.backend_now_ms <= 30_000, step_ms
    await backend.stop()


@pytest.mark.skipif(not LIBRARY.exists(), reason="Debian package faketime is not installed")
def test_a_process_whose_wall_clock_steps_keeps_its_lease(tmp_path: Path) -> None:
    """The same under libfaketime: the wall clock of the process jumps 10 minutes forward while
    the monotonic and boot clocks go on; the lease it holds is still live."""
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    script = textwrap.dedent(
        f"""
        import asyncio, json, time, uuid
        from anarchon import SQLiteBackend, Trigger
        from anarchon.backend import ClaimRequest, TakeoverRequest

        async def main():
            backend = SQLiteBackend({str(tmp_path / "ft.db")!r})
            await backend.start()
            [won] = await backend.claim([ClaimRequest(
                job="job", slot={SLOT}, run_id="r1", token="t1", instance="i",
                trigger=Trigger.SCHEDULE, lease_ms=30_000)])
            wall = time.time()
            open({str(offset)!r}, "w").write("+600\\n")
            await asyncio.sleep(0.2)
            stepped = time.time() - wall
            out = await backend.take_over(TakeoverRequest(
                job="job", slot_key="{SLOT}", run_id="r2", token="t2", instance="b",
                lease_ms=30_000, max_attempts=3))
            print(json.dumps({{"stepped": stepped, "status": out.status.value,
                               "left": out.lease_expires_at_ms - out.backend_now_ms
                               if out.lease_expires_at_ms else None}}))
            await backend.stop()

        asyncio.run(main())
        """
    )
    env = {
        **os.environ,
        "LD_PRELOAD": str(LIBRARY),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_TIMESTAMP_FILE": str(offset),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["stepped"] > 500, f"libfaketime did not step the wall clock: {answer}"
    assert answer["status"] == "held", answer
    assert 25_000 < answer["left"] <= 30_000, answer


async def test_fences_keep_rising_when_the_file_is_recreated(tmp_path: Path) -> None:
    path = tmp_path / "fence.db"
    backend = SQLiteBackend(path)
    await backend.start()
    [first] = await backend.claim([request()])
    await backend.stop()
    path.unlink()
    again = SQLiteBackend(path)
    await again.start()
    [second] = await again.claim([request(SLOT + 1000)])
    await again.stop()
    assert first.ticket is not None and second.ticket is not None
    assert first.ticket.fence is not None and second.ticket.fence is not None
    assert second.ticket.fence > first.ticket.fence


async def test_an_item_the_file_cannot_store_fails_alone(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "items.db")
    await backend.start()
    bad = request(SLOT + 1000, instance="bad\udc80")  # a lone surrogate: no UTF-8 for it
    outcomes = await backend.claim([request(), bad, request(SLOT + 2000)])
    assert [o.status for o in outcomes] == [ClaimStatus.WON, ClaimStatus.LOST, ClaimStatus.WON]
    assert isinstance(outcomes[1].error, BackendError)
    tickets = [o.ticket for o in outcomes if o.ticket is not None]
    results = await backend.finish_many(
        [
            FinishRequest(tickets[0], RunStatus.FAILED, "boom \udc80"),
            FinishRequest(tickets[1], RunStatus.SUCCEEDED, None),
        ]
    )
    assert isinstance(results[0], BackendError)
    assert getattr(results[1], "status", None) is RunStatus.SUCCEEDED
    renewed = await backend.renew_many([tickets[0], dataclasses.replace(tickets[0], lease_ms=-1)])
    assert not isinstance(renewed[0], BackendError) and isinstance(renewed[1], BackendError)
    await backend.stop()


async def test_processes_share_one_clock_anchor(tmp_path: Path) -> None:
    path = tmp_path / "anchor.db"
    a, b = SQLiteBackend(path), SQLiteBackend(path)
    await a.start()
    await b.start()
    times = [await a.server_time_ms(), await b.server_time_ms()]
    assert None not in times and abs(times[0] - times[1]) < 50  # type: ignore[operator]
    with closing(sqlite3.connect(path)) as conn:
        anchors = conn.execute("SELECT count(*) FROM anarchon_clock").fetchone()[0]
    assert anchors == 1
    await a.stop()
    await b.stop()
    await asyncio.sleep(0)
