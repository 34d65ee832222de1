"""Steering real processes on SQLite: three instances, one trigger, exactly one run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from anarchon import RunStatus, SQLiteBackend, Trigger, steering
from tests.conformance.procs import Fleet

pytestmark = pytest.mark.slow


async def test_a_trigger_runs_once_among_three_processes(tmp_path: Path) -> None:
    path = tmp_path / "anarchon.db"
    fleet = Fleet(f"sqlite:///{path}", tmp_path)
    # A yearly job: nothing but the trigger runs it during the test.
    workers = fleet.spawn(3, job="report", schedule="0 0 1 1 *", seconds=30)
    backend = SQLiteBackend(path)
    try:
        fleet.wait_ready(workers)
        await backend.start()
        request = await steering.trigger(backend, "report", by="ops@test")
        asked = time.time()
        for _ in range(200):  # up to 10 s
            if fleet.records("start"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(3.0)  # every instance has polled a few times since
        starts = fleet.records("start")
        assert len(starts) == 1, (starts, fleet.logs())
        [start] = starts
        assert start["run_id"] == request.id and start["trigger"] == "manual"
        assert start["t"] - asked < 4.0, (start, asked)  # about a second; slack for a busy host
        [run] = await backend.history("report")
        assert run.trigger is Trigger.MANUAL and run.requested_by == "ops@test"
        assert run.status is RunStatus.SUCCEEDED
        assert await backend.control().requests() == []  # type: ignore[union-attr]
    finally:
        await backend.stop()
        fleet.stop_all()
