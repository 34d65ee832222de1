"""Backups, fencing and hand-over with real processes: kill -9, SIGSTOP/SIGCONT, SIGTERM.

Each test schedules one slot a few seconds ahead (a fixed time of day, 6 fields, UTC), lets three
instances contend for it, then does something to whichever instance won.
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from anarchon import RunStatus, Scheduler
from tests.conformance.procs import Fleet, Worker
from tests.harness import Harness, Namespace

pytestmark = pytest.mark.slow

LEASE_MS = 3_000


def one_slot(lead_s: float = 6.0) -> tuple[str, int]:
    """A 6-field expression that fires once, ``lead_s`` from now (rounded up), and its slot."""
    moment = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=int(lead_s) + 1)
    return f"{moment.second} {moment.minute} {moment.hour} * * *", int(moment.timestamp() * 1000)


#: How far ahead plan_one_slot plans its slot once every worker is loaded: what is left of a
#: start then (opening the backend, the scheduler's start) takes under a second on an idle
#: machine; the rest is margin for a loaded one.
PLANNED_LEAD_S = 8.0


def plan_one_slot(
    fleet: Fleet, workers: list[Worker], plan: Path, lead_s: float = PLANNED_LEAD_S
) -> int:
    """For ``workers`` spawned with ``schedule_from=plan``: once every one is loaded, write
    them a one-slot schedule ``lead_s`` ahead (:func:`one_slot`); wait until they have started
    and check it is still ahead. Returns the slot. Start-up (imports, under load tens of
    seconds for many processes) does not eat into the lead."""
    fleet.wait_loaded(workers)
    schedule, slot = one_slot(lead_s)
    written = plan.with_name(plan.name + ".tmp")
    written.write_text(schedule)
    written.replace(plan)  # whole, at once
    fleet.wait_ready(workers)
    assert time.time() * 1000 < slot, "workers started too slowly for the planned slot"
    return slot


def wait_for(fleet: Fleet, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in fleet.records():
            if predicate(record):
                return record
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}\n{fleet.logs()}")


def runner_of(fleet: Fleet, record: dict[str, Any]) -> Worker:
    return next(w for w in fleet.workers if w.pid == record["pid"])


def start_three(fleet: Fleet, sleep_ms: int, **options: Any) -> tuple[int, dict[str, Any]]:
    """Three workers of one job whose single slot is planned once all three are loaded
    (:func:`plan_one_slot`: their imports, which took over 10 s on a slow host, do not eat into
    the lead); the slot and its first start."""
    plan = fleet.tmp / "plan"
    workers = fleet.spawn(
        3, schedule_from=plan, seconds=60, sleep_ms=sleep_ms, jitter_ms=0, **options
    )
    slot = plan_one_slot(fleet, workers, plan)
    first = wait_for(fleet, lambda r: r["event"] == "start" and r["slot"] == slot, 30, "a start")
    return slot, first


async def history_of(ns: Namespace, job: str = "tick") -> list[Any]:
    async with Scheduler(ns.make()) as scheduler:
        return await scheduler.history(job, limit=50)


async def kill_9_and_see_it_taken_over(
    harness: Harness, fleet: Fleet, ns: Namespace, slot: int, first: dict[str, Any]
) -> dict[str, Any]:
    """Kill the runner of ``first`` (a start record of ``slot``) with SIGKILL; check that
    another instance runs attempt 2 once the lease ends, with a higher fence, and that the
    history says so. Returns attempt 2's start record."""
    killed_at = time.time()
    runner_of(fleet, first).kill(signal.SIGKILL)
    second = wait_for(
        fleet,
        lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
        LEASE_MS / 1000 + 15,
        "the takeover",
    )
    delay = second["t"] - killed_at
    print(f"\n{harness.name}: takeover {delay:.2f}s after kill -9 (lease {LEASE_MS} ms)")
    assert delay <= LEASE_MS / 1000 + 2, f"takeover took {delay:.2f}s"
    assert second["fence"] > first["fence"] and second["pid"] != first["pid"]
    wait_for(fleet, lambda r: r["event"] == "end" and r["attempt"] == 2, 20, "attempt 2's end")
    fleet.stop_all()
    runs = [r for r in await history_of(ns) if r.slot_ms == slot]
    assert [(r.attempt, r.status, r.reason) for r in runs] == [
        (2, RunStatus.SUCCEEDED, None),
        (1, RunStatus.FAILED, "lease lost"),
    ]
    assert runs[0].fence is not None and runs[1].fence is not None
    assert runs[0].fence > runs[1].fence
    starts = [r for r in fleet.records("start") if r["slot"] == slot]
    assert len(starts) == 2, starts
    return second


async def test_kill_9_runner_is_taken_over(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    slot, first = start_three(fleet, sleep_ms=4_000, lease_ms=LEASE_MS)
    await kill_9_and_see_it_taken_over(lease_harness, fleet, ns, slot, first)


async def test_an_instance_started_after_the_run_began_takes_it_over(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    # A restart or a rolling deploy: no instance lost the slot's claim (the runner was alone),
    # so only one that starts later can take the run over, by watching it from its start.
    plan = fleet.tmp / "plan"
    options: dict[str, Any] = {"seconds": 60, "sleep_ms": 10_000, "jitter_ms": 0}
    [runner] = fleet.spawn(1, schedule_from=plan, lease_ms=LEASE_MS, **options)
    slot = plan_one_slot(fleet, [runner], plan)
    schedule = plan.read_text()
    first = wait_for(fleet, lambda r: r["event"] == "start" and r["slot"] == slot, 30, "a start")
    [later] = fleet.spawn(1, schedule=schedule, lease_ms=LEASE_MS, **options)
    fleet.wait_ready([later])
    assert not [r for r in runner.records() if r["event"] == "end"], "the run ended too soon"
    second = await kill_9_and_see_it_taken_over(lease_harness, fleet, ns, slot, first)
    assert second["pid"] == later.pid


async def test_stale_runner_is_fenced_off(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    slot, first = start_three(fleet, sleep_ms=5_000, lease_ms=LEASE_MS)
    stale = runner_of(fleet, first)
    fleet.freeze(stale)
    try:
        second = wait_for(
            fleet,
            lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
            LEASE_MS / 1000 + 15,
            "the takeover",
        )
    finally:
        stale.kill(signal.SIGCONT)
    wait_for(fleet, lambda r: r["event"] == "end" and r["attempt"] == 2, 20, "attempt 2's end")
    await asyncio.sleep(1.0)  # the stale runner's renewal and result reach the backend: refused
    fleet.stop_all()
    runs = [r for r in await history_of(ns) if r.slot_ms == slot]
    assert [(r.attempt, r.status) for r in runs] == [
        (2, RunStatus.SUCCEEDED),
        (1, RunStatus.FAILED),
    ], runs
    assert runs[1].reason == "lease lost" and runs[1].run_id == first["run_id"]
    assert runs[0].run_id == second["run_id"]
    assert second["fence"] > first["fence"]
    stale_end = [r for r in stale.records() if r["event"] == "end" and r["slot"] == slot]
    assert all(r["lost"] for r in stale_end), "the stale runner was not told it lost its lease"


async def test_graceful_stop_hands_over(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    # A long lease: a takeover that waited for expiry would take 20 s; hand-over must not.
    slot, first = start_three(fleet, sleep_ms=6_000, lease_ms=20_000, grace_ms=300)
    stopped_at = time.time()
    runner_of(fleet, first).kill(signal.SIGTERM)
    second = wait_for(
        fleet,
        lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
        15,
        "the hand-over",
    )
    delay = second["t"] - stopped_at
    print(f"\n{lease_harness.name}: hand-over {delay:.2f}s after SIGTERM (grace 0.3 s)")
    assert delay < 3.0, f"hand-over took {delay:.2f}s"
    wait_for(fleet, lambda r: r["event"] == "end" and r["attempt"] == 2, 20, "attempt 2's end")
    fleet.stop_all()
    runs = [r for r in await history_of(ns) if r.slot_ms == slot]
    assert [(r.attempt, r.status, r.reason) for r in runs] == [
        (2, RunStatus.SUCCEEDED, None),
        (1, RunStatus.FAILED, "handed over"),
    ]
