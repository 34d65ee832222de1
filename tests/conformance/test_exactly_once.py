"""Exactly one run per slot, with several real processes contending for every slot."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import pytest

from anarchon import RunStatus, Scheduler
from tests.conformance.procs import Fleet
from tests.harness import Harness, Namespace

pytestmark = pytest.mark.slow


def test_three_processes_one_run_per_slot(fleet: Fleet, ns: Namespace) -> None:
    workers = fleet.spawn(3, seconds=30, jitter_ms=300)
    fleet.wait_ready(workers)
    began = time.time()
    time.sleep(9)
    ended = time.time()
    fleet.stop_all()

    starts = fleet.starts_per_slot()
    # Every slot from a second after all were ready to a second before the stop ran.
    expected = {s * 1000 for s in range(int(began) + 1, int(ended) - 1)}
    assert len(expected) >= 6
    duplicates = {slot: n for slot, n in starts.items() if n > 1}
    missed = sorted(expected - set(starts))
    assert duplicates == {}, fleet.logs()
    assert missed == [], fleet.logs()
    runners = {r["instance"] for r in fleet.records("start")}
    assert len(runners) >= 2, f"one instance won every slot: {runners}"
    ran = sum(starts[slot] for slot in expected)
    print(
        f"\n{ns.url}: 3 processes, {len(expected)} slots, {ran} runs, duplicates: "
        f"{len(duplicates)}, missed: {len(missed)}, runners: {len(runners)}"
    )


async def test_history_agrees_with_what_ran(fleet: Fleet, ns: Namespace) -> None:
    workers = fleet.spawn(3, seconds=30, jitter_ms=200)
    fleet.wait_ready(workers)
    await asyncio.sleep(5)
    fleet.stop_all()
    ran = {(r["slot"], r["run_id"]) for r in fleet.records("end")}
    assert len(ran) >= 3

    scheduler = Scheduler(ns.make())
    async with scheduler:
        history = await scheduler.history("tick", limit=1000)
        last = await scheduler.last_run("tick")
    recorded = {(r.slot_ms, r.run_id) for r in history if r.status is RunStatus.SUCCEEDED}
    assert ran <= recorded
    assert len({r.slot_ms for r in history}) == len(history), "two records for one slot"
    assert last == history[0]
    assert [r.started_at for r in history] == sorted((r.started_at for r in history), reverse=True)
    fences = [r.fence or 0 for r in sorted(history, key=lambda r: r.started_at)]
    assert fences == sorted(fences) and len(set(fences)) == len(fences), fences


def test_instances_starting_together_catch_up_once(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    [seed] = fleet.spawn(1, seconds=30, jitter_ms=0, catch_up="none")
    fleet.wait_ready([seed])
    time.sleep(2.5)
    seed.kill(signal.SIGTERM)  # a graceful stop
    seed.wait()
    last_seeded = max(r["slot"] for r in seed.records() if r["event"] == "start")
    time.sleep(4.0)  # nobody runs: about four slots are missed
    restarted = time.time()
    workers = fleet.spawn(3, seconds=30, jitter_ms=200, catch_up="all")
    fleet.wait_ready(workers)
    time.sleep(3.0)
    fleet.stop_all()

    records = [r for w in workers for r in w.records() if r["event"] == "start"]
    caught = sorted(r["slot"] for r in records if r["trigger"] == "catch-up")
    assert Counter(r["slot"] for r in records).most_common(1)[0][1] == 1, records
    missed = {s * 1000 for s in range(last_seeded // 1000 + 1, int(restarted) - 1)}
    assert missed <= set(caught), (sorted(missed), caught)
    assert all(slot > last_seeded for slot in caught)
