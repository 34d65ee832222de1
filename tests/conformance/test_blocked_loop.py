"""A handler that blocks the event loop (time.sleep in async def) past its lease, with real
processes on every lease backend: the lease is kept from the scheduler's own thread (with the
backend's clone() connection), so the slot starts exactly once, and the log names the handler."""

from __future__ import annotations

import asyncio

import pytest

from anarchon import RunStatus
from tests.conformance.procs import Fleet
from tests.conformance.test_failover import history_of, runner_of, start_three, wait_for
from tests.harness import Harness, Namespace

pytestmark = pytest.mark.slow

LEASE_MS = 2_000


async def test_a_handler_that_blocks_the_loop_past_its_lease_runs_once(
    lease_harness: Harness, fleet: Fleet, ns: Namespace
) -> None:
    slot, first = start_three(
        fleet, sleep_ms=int(LEASE_MS * 1.5), lease_ms=LEASE_MS, handler_mode="block"
    )
    wait_for(fleet, lambda r: r["event"] == "end" and r["slot"] == slot, 20, "the run's end")
    await asyncio.sleep(LEASE_MS / 1000)  # a backup that took over would have started by now
    fleet.stop_all()
    starts = [r for r in fleet.records("start") if r["slot"] == slot]
    assert len(starts) == 1, f"the slot started {len(starts)} times:\n{fleet.logs()}"
    [end] = [r for r in fleet.records("end") if r["slot"] == slot]
    assert end["lost"] is False
    runs = [r for r in await history_of(ns) if r.slot_ms == slot]
    assert [(r.attempt, r.status) for r in runs] == [(1, RunStatus.SUCCEEDED)]
    log = runner_of(fleet, first).log.read_text()
    assert "event loop has been blocked" in log and "job 'tick'" in log, log
    assert "ran again after being blocked" in log, log
