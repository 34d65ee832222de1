"""Instances whose wall clock is off the backend's when they start, as real processes under
libfaketime (the fault suite's worker and fleet): the timer of a starting instance fires the
slots after its start as measured on the backend's clock, and catch-up decides on those before
it, also on the backend's clock.

* A clock behind (within ``max_late_ms``) must not claim, late, slots due before the fleet
  started: with no history nothing is caught up, and the on-time slots are not pushed out.
* A clock ahead must not catch up a slot still in the future (early), and must not pass over the
  slots between the backend's time and its own: the timer fires them, each deferred until the
  backend's clock reaches it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from anarchon import Run, RunStatus, Scheduler
from tests.chaos.faketime import LIBRARY, ensure_installed
from tests.chaos.fleet import Fleet, Instance
from tests.harness import CHAOS_ONLY, Namespace

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not LIBRARY.exists() and ensure_installed() is not None,
        reason="Debian package faketime cannot be installed",
    ),
]

PERIOD_MS = 5_000
EVERY_5_S = "*/5 * * * * *"
#: How many slots due after every instance had started the tests wait to see run (about 20 s of
#: slots): a wrong instance shows itself at its first slot (a late or early claim, an on-time
#: slot pushed out or passed over), each skew being measured at the start.
SLOTS_AFTER_START = 4
#: How long past the last of those slots the wait goes on before the checks report what is
#: missing (a loaded two-core machine: generous).
SLOTS_LATE_S = 60.0


async def _history(ns: Namespace, job: str) -> list[Run]:
    async with Scheduler(ns.make(), instance_id="reader") as reader:
        return await reader.history(job, limit=500)


def _start(
    fleet: Fleet, instances: list[Instance], url: str, options: dict[str, Any]
) -> tuple[float, float]:
    """Hand every instance its spec at once (they are loaded already); returns when (real),
    and when every one had started."""
    fleet.wait_event(instances, "loaded", 90)
    spec = {
        "url": url,
        "jobs": [{"name": "tick", "schedule": EVERY_5_S, "duration_ms": 1_000, "options": options}],
    }
    began = time.time()
    for instance in instances:
        fleet.go(instance, spec)
    fleet.wait_event(instances, "started", 90)
    return began, time.time()


def _slots_after(after_s: float, count: int) -> list[int]:
    """The first ``count`` slots (ms) of the job due after ``after_s`` (real time, s)."""
    first = (int(after_s * 1000) // PERIOD_MS + 1) * PERIOD_MS
    return [first + n * PERIOD_MS for n in range(count)]


def _await_runs(fleet: Fleet, slots: list[int], late_s: float = SLOTS_LATE_S) -> None:
    """Wait until a handler of the last of ``slots`` has ended on some instance (the earlier
    ones, a period apart and a second long, are decided by then: run, or skipped), or until
    ``late_s`` past its time; the test's checks then say what is missing."""
    last = max(slots)
    deadline = last / 1000 + late_s
    while time.time() < deadline:
        if any(r.get("event") == "end" and r.get("slot") == last for r in fleet.records()):
            return
        time.sleep(0.5)


def _stop(fleet: Fleet, instances: list[Instance]) -> None:
    for instance in instances:
        if instance.alive():
            instance.proc.terminate()
    for instance in instances:
        instance.proc.wait(60)


def _sleep_until(moment_s: float) -> None:
    """Sleep until ``time.time()`` reads ``moment_s``."""
    time.sleep(max(0.0, moment_s - time.time()))


def _described(runs: list[Run]) -> str:
    """One line per run (slot, status, instance, trigger, reason or error), oldest first: a
    message of text, which pytest prints whole (a tuple or list is cut to 240 characters)."""
    return "\n".join(
        f"  {r.slot_ms} {r.status.value} {r.instance} {r.trigger.value} attempt {r.attempt}"
        f"{f': {r.reason}' if r.reason else ''}{f' error: {r.error}' if r.error else ''}"
        for r in sorted(runs, key=lambda r: (r.slot_ms or 0, r.attempt))
    )


def _real_start_s(record: dict[str, Any]) -> float:
    """When (real time) a worker's record was written: its monotonic stamp, never faked."""
    return float(record["mono"]) + (time.time() - time.monotonic())


@pytest.mark.parametrize(
    ("harness", "behind_s"),
    # make test runs Redis and NATS 400 s behind; make chaos every case.
    [
        ("redis", 40),
        pytest.param("postgres", 40, marks=CHAOS_ONLY),
        pytest.param("nats", 40, marks=CHAOS_ONLY),
        ("nats", 400),
    ],
    indirect=["harness"],
)
async def test_an_instance_behind_claims_no_slot_from_before_the_fleet_started(
    ns: Namespace, tmp_path: Path, behind_s: int
) -> None:
    # Every option at its default (catch_up latest on lease backends, none on NATS; max_late
    # 60 s). Three instances start together, one behind: it must not claim the slots of the
    # time before the fleet existed (nobody else did). 40 s behind it won and ran them, late,
    # its runs then pushing out on-time slots as overlaps; 400 s behind (past max_late_ms) it
    # recorded them `skipped: too late`.
    assert ns.url is not None
    fleet = Fleet(tmp_path)
    instances = fleet.spawn(3, faked=True)
    try:
        assert instances[1].clock is not None
        instances[1].clock.set(-behind_s)
        began, ready = _start(fleet, instances, ns.url, {})
        awaited = _slots_after(ready, SLOTS_AFTER_START)
        _await_runs(fleet, awaited)  # the processes run on
        _stop(fleet, instances)
        ended = time.time()
    finally:
        fleet.kill_all()
    runs = await _history(ns, "tick")
    early = [r for r in runs if r.slot_ms is not None and r.slot_ms < began * 1000 - 1_000]
    assert not early, f"slots from before the fleet started were claimed: {early}\n{fleet.logs()}"
    unsucceeded = [r for r in runs if r.status is not RunStatus.SUCCEEDED]
    assert not unsucceeded, (
        f"runs not succeeded:\n{_described(unsucceeded)}\nall runs:\n{_described(runs)}\n"
        f"{fleet.logs()}"
    )
    slots = {r.slot_ms for r in runs}
    # The on-time instances ran the slots after they had all started.
    expected = range((int(ready * 1000) // PERIOD_MS + 1) * PERIOD_MS, int(ended * 1000) - 8_000)
    missing = sorted({s for s in [*expected[::PERIOD_MS], *awaited] if s not in slots})
    assert not missing, f"slots never run: {missing}\n{_described(runs)}\n{fleet.logs()}"


@pytest.mark.parametrize(
    "harness", ["redis", pytest.param("postgres", marks=CHAOS_ONLY)], indirect=True
)
async def test_an_instance_ahead_catches_up_no_future_slot_and_skips_none(
    ns: Namespace, tmp_path: Path
) -> None:
    # Every option at its default (catch_up latest). The job has history; its instances come
    # back after a pause with their clocks 90 s ahead. Catch-up must look at the backend's time:
    # the newest slot missed by it is caught up, none still in the future; and the slots from
    # then on run each at its time (deferred by the timer while early), none passed over.
    assert ns.url is not None
    fleet = Fleet(tmp_path)
    first = fleet.spawn(2)
    try:
        _, first_ready = _start(fleet, first, ns.url, {})
        _await_runs(fleet, _slots_after(first_ready, 2))  # history: a few slots run
        _stop(fleet, first)
        # Slots missed while no instance runs: two fall due, and a second goes by.
        _sleep_until(_slots_after(time.time(), 2)[-1] / 1000 + 1)
        second = fleet.spawn(2, faked=True)
        for instance in second:
            assert instance.clock is not None
            instance.clock.set(+90)
        _, ready = _start(fleet, second, ns.url, {})
        awaited = _slots_after(ready, SLOTS_AFTER_START)
        _await_runs(fleet, awaited)
        _stop(fleet, second)
        ended = time.time()
    finally:
        fleet.kill_all()
    starts = [r for r in fleet.records() if r.get("event") == "start"]
    early = [
        (r["slot"], r["trigger"], round(r["slot"] / 1000 - _real_start_s(r), 1))
        for r in starts
        if _real_start_s(r) < r["slot"] / 1000 - 2
    ]
    assert not early, f"runs started before their slot (slot, trigger, s early): {early}"
    runs = await _history(ns, "tick")
    by_slot = Counter(r.slot_ms for r in runs if r.status is RunStatus.SUCCEEDED)
    assert all(n == 1 for n in by_slot.values()), f"slots run twice: {by_slot}\n{_described(runs)}"
    expected = range((int(ready * 1000) // PERIOD_MS + 1) * PERIOD_MS, int(ended * 1000) - 6_000)
    missing = sorted({s for s in [*expected[::PERIOD_MS], *awaited] if s not in by_slot})
    # A live slot that comes while the caught-up run still holds its lease is skipped for
    # overlap, as documented (catch-up runs count for overlap="skip"); none may be passed over.
    overlapped = {
        r.slot_ms for r in runs if r.status is RunStatus.SKIPPED and "overlap" in (r.reason or "")
    }
    assert len(overlapped) <= 1, f"slots skipped for overlap: {overlapped}\n{_described(runs)}"
    missing = [s for s in missing if s not in overlapped]
    assert not missing, f"slots after the restart never ran: {missing}\n{_described(runs)}"
