"""A real scheduler process frozen (SIGSTOP) past several slots of an every-second job, then
resumed (SIGCONT), on SQLite with every option at its default: the slots it passed over are
recorded ``behind`` (catch_up="latest": only the newest due slot runs), not ``overlap`` with the
first, each slot has one record, the counters it exits with add up to history, and its WARNING
says the process did not run. And a handler that blocks the event loop: the WARNING names it.
And two instances, one frozen: the slots the other ran are not counted ``behind``."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from anarchon import RunStatus, Scheduler, SQLiteBackend
from anarchon._metrics import skip_class
from tests.conformance.procs import Fleet, Worker, wait_for

pytestmark = pytest.mark.slow

FROZEN_S = 6.0


async def _history(path: Path) -> list[Any]:
    async with Scheduler(SQLiteBackend(path)) as scheduler:
        return await scheduler.history("tick", limit=200)


def _freeze(fleet: Fleet, worker: Worker) -> tuple[float, float]:
    """Stop ``worker`` (SIGSTOP) for :data:`FROZEN_S`, resume it, and wait for runs 2.5 s after;
    return when it was stopped and resumed (epoch ms)."""
    worker.kill(signal.SIGSTOP)
    stopped_ms = time.time() * 1000
    try:
        time.sleep(FROZEN_S)
    finally:
        worker.kill(signal.SIGCONT)
    resumed_ms = time.time() * 1000
    wait_for(
        lambda: [r for r in fleet.records("start") if r["t"] * 1000 > resumed_ms + 2_500],
        "runs after the freeze",
        20,
    )
    return stopped_ms, resumed_ms


async def test_a_frozen_instance_records_the_slots_it_passed_over_behind(tmp_path: Path) -> None:
    db = tmp_path / "anarchon.db"
    fleet = Fleet(f"sqlite:///{db}", tmp_path)
    try:
        [worker] = fleet.spawn(1, schedule="* * * * * *", seconds=60)
        fleet.wait_ready([worker])
        wait_for(lambda: len(fleet.records("start")) >= 2, "two runs before the freeze", 20)
        stopped_ms, resumed_ms = _freeze(fleet, worker)
        fleet.stop_all()
    finally:
        fleet.stop_all()
    history = await _history(db)
    by_slot: dict[int, list[Any]] = {}
    for run in history:
        by_slot.setdefault(run.slot_ms, []).append(run)
    assert all(len(runs) == 1 for runs in by_slot.values()), fleet.logs()
    starts = [r["slot"] for r in fleet.records("start")]
    assert len(starts) == len(set(starts)), "a slot ran twice"
    # The slots due while it was stopped (a margin at each end for the jitter and the signals).
    frozen = [s for s in by_slot if stopped_ms + 1_500 <= s <= resumed_ms - 1_500]
    assert len(frozen) >= 3, (sorted(by_slot), stopped_ms, resumed_ms)
    reasons = {s: by_slot[s][0].reason or "" for s in frozen}
    behind = [s for s, reason in reasons.items() if reason.startswith("behind: ")]
    assert len(behind) >= 3, reasons
    assert not [r for r in history if (r.reason or "").startswith("overlap")], reasons
    for slot in behind:
        assert "catch_up='latest' runs only the newest" in reasons[slot], reasons[slot]
    ran_frozen = [s for s in frozen if by_slot[s][0].status is RunStatus.SUCCEEDED]
    assert len(ran_frozen) <= 1, reasons  # at most the newest due slot, if it was in the span
    # Every slot from the first to the last recorded has its record: no slot without a fate.
    assert sorted(by_slot) == list(range(min(by_slot), max(by_slot) + 1, 1_000)), sorted(by_slot)
    # The counters the process exited with add up to history.
    [exit_record] = fleet.records("exit")
    slots = exit_record["by_job"]["tick"]["slots"]
    recorded: dict[str, int] = {}
    for run in history:
        key = "ran" if run.status is not RunStatus.SKIPPED else skip_class(run.skip_cause)
        recorded[key] = recorded.get(key, 0) + 1
    assert {k: v for k, v in slots.items() if v} == recorded, (slots, recorded)
    assert exit_record["metrics"]["behind"] == recorded["skipped_behind"]
    # The WARNING says why: the whole process stopped (its watchdog thread too), not a block.
    warnings = [line for line in worker.log.read_text().splitlines() if " behind (" in line]
    assert warnings, fleet.logs()
    assert all("its process did not run for" in line for line in warnings), warnings


async def test_a_handler_that_blocks_the_loop_is_named_as_the_cause_of_its_backlog(
    tmp_path: Path,
) -> None:
    # An async handler that blocks the event loop for 4 s (time.sleep) on an every-second job,
    # every option at its default: each run leaves a backlog, and its WARNING names the loop
    # blocked by that job, as the watchdog saw it, not a frozen process or a clock step.
    fleet = Fleet(f"sqlite:///{tmp_path / 'anarchon.db'}", tmp_path)
    try:
        [worker] = fleet.spawn(
            1, schedule="* * * * * *", seconds=60, handler_mode="block", sleep_ms=4_000
        )
        fleet.wait_ready([worker])

        def backlogs() -> list[str]:
            lines = worker.log.read_text().splitlines()
            return [line for line in lines if " behind (" in line]

        wait_for(lambda: len(backlogs()) >= 2, "two backlogs", 40)
        fleet.stop_all()
    finally:
        fleet.stop_all()
    warnings = backlogs()
    assert all("its event loop was blocked for" in line for line in warnings), warnings
    assert all("by job 'tick'" in line for line in warnings), warnings


async def test_behind_counts_only_what_the_frozen_instance_recorded(tmp_path: Path) -> None:
    # Two instances, every option at its default; one is stopped 6 s while the other runs every
    # slot. The one that comes back finds those slots run: it records and counts none behind
    # (0.1.0 counted each slot it tried to record).
    db = tmp_path / "anarchon.db"
    fleet = Fleet(f"sqlite:///{db}", tmp_path)
    try:
        frozen, other = fleet.spawn(2, schedule="* * * * * *", seconds=60)
        fleet.wait_ready([frozen, other])
        wait_for(lambda: len(fleet.records("start")) >= 3, "runs before the freeze", 20)
        _freeze(fleet, frozen)
        wait_for(
            lambda: " behind (" in frozen.log.read_text(), "the resumed instance's backlog", 20
        )
        fleet.stop_all()
    finally:
        fleet.stop_all()
    history = await _history(db)
    starts = [r["slot"] for r in fleet.records("start")]
    assert len(starts) == len(set(starts)), "a slot ran twice"
    recorded = dict.fromkeys(("w0", "w1"), 0)
    for run in history:
        if (run.reason or "").startswith("behind: "):
            recorded[run.instance] += 1
    exits = {r["pid"]: r for r in fleet.records("exit")}
    counted = {w: exits[p.pid]["metrics"]["behind"] for w, p in (("w0", frozen), ("w1", other))}
    assert counted == recorded, (counted, recorded, frozen.log.read_text())
