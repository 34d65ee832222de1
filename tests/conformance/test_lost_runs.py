"""Runs whose runner lost its lease while its process lived on, with real processes and every
option at its default (lease_ms 15 s): someone always takes the slot over.

Found by a QA probe: an instance that ran (or lost) an earlier attempt did not watch later ones,
so a second runner stopped past its lease was never taken over; and a handler's own
``ctx.check_lease()`` raising :class:`~anarchon.errors.LeaseLost` was recorded as the slot's
``failed`` result, its attempts left unused.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from anarchon import RunStatus
from anarchon.backend import LEASE_LOST
from tests.conformance import procs
from tests.conformance.procs import Fleet, Worker
from tests.conformance.test_failover import history_of, plan_one_slot, runner_of, wait_for
from tests.harness import Harness, Namespace, in_chaos_only

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_S = 15  # the default lease_ms
STOPPED_S = LEASE_S + 5


def start_of(slot: int, attempt: int) -> Any:
    return lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == attempt


def logged(worker: Worker, text: str, timeout: float, what: str) -> None:
    """Wait until ``worker``'s log holds ``text``."""
    procs.wait_for(lambda: text in worker.log.read_text(), what, timeout, every_s=0.05)


def stopped_until(fleet: Fleet, worker: Worker, predicate: Any, timeout: float, what: str) -> Any:
    """SIGSTOP ``worker`` until a record matches ``predicate`` (SIGCONT after, whatever)."""
    fleet.freeze(worker)
    try:
        return wait_for(fleet, predicate, timeout, what)
    finally:
        worker.kill(signal.SIGCONT)


@pytest.fixture
def sqlite_here_all_in_chaos(lease_harness: Harness) -> Harness:
    """The lease harness; ``make test`` runs these long fault runs on SQLite only, ``make
    chaos`` on every lease backend."""
    if lease_harness.name != "sqlite":
        in_chaos_only(lease_harness.name)
    return lease_harness


async def test_the_runner_of_a_lost_attempt_takes_over_the_next(
    sqlite_here_all_in_chaos: Harness, fleet: Fleet, ns: Namespace
) -> None:
    # Attempt 1's runner is stopped past its lease: the other instance takes attempt 2. Then
    # attempt 2's runner is stopped past its lease: only attempt 1's instance is left to take
    # attempt 3, which it can only do if it watches the slot since it lost its own attempt.
    plan = fleet.tmp / "plan"
    workers = fleet.spawn(2, schedule_from=plan, seconds=240, sleep_ms=200_000)
    slot = plan_one_slot(fleet, workers, plan)
    first = wait_for(fleet, start_of(slot, 1), 60, "attempt 1's start")
    stale = runner_of(fleet, first)
    second = stopped_until(fleet, stale, start_of(slot, 2), LEASE_S + 30, "attempt 2's start")
    assert second["pid"] != stale.pid
    # The resumed instance learns its attempt was taken over (its keeper's renewal, at once on
    # resuming, is refused: it logs lease_lost and follows the slot from then on).
    logged(stale, f"attempt 1: {LEASE_LOST}", 30, "the resumed runner to see its lease lost")
    other = runner_of(fleet, second)
    third = stopped_until(fleet, other, start_of(slot, 3), STOPPED_S + 30, "attempt 3's start")
    assert third["pid"] == stale.pid and third["fence"] > second["fence"]
    # Attempt 3's handler sleeps on (200 s): a graceful stop would wait out the 30 s grace.
    fleet.kill_all()


async def test_a_handler_that_sees_its_lease_lost_leaves_the_slot_to_run_again(
    sqlite_here_all_in_chaos: Harness, fleet: Fleet, ns: Namespace
) -> None:
    # One instance, no other to take over: its handler calls ctx.check_lease() in steps. Stopped
    # past its lease, it raises LeaseLost when it resumes; the slot must not end failed with
    # attempts left: the instance itself takes the run over (its periodic adoption at worst).
    plan = fleet.tmp / "plan"
    [worker] = fleet.spawn(
        1, schedule_from=plan, seconds=240, sleep_ms=30_000, handler_mode="check"
    )
    slot = plan_one_slot(fleet, [worker], plan)
    wait_for(fleet, start_of(slot, 1), 60, "attempt 1's start")
    await asyncio.sleep(2)
    worker.kill(signal.SIGSTOP)
    await asyncio.sleep(STOPPED_S)
    worker.kill(signal.SIGCONT)
    # Up to a minute until the periodic adoption, then the lease's end (it may have been
    # renewed on resuming), with a generous margin.
    second = wait_for(fleet, start_of(slot, 2), 60 + LEASE_S + 45, "attempt 2's start")
    assert second["pid"] == worker.pid
    # Attempt 2's handler has 30 s to go: a graceful stop would wait out the 30 s grace for it.
    # Attempt 1's record, asked about below, was written when attempt 2 took the slot over.
    fleet.kill_all()
    runs = [r for r in await history_of(ns) if r.slot_ms == slot]
    assert runs[-1].attempt == 1 and runs[-1].status is RunStatus.FAILED, runs
    assert "LeaseLost" not in (runs[-1].reason or "") + (runs[-1].error or ""), runs
