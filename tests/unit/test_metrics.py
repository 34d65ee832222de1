"""The metrics snapshot: every counter named once, present at zero, readable by name."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator

import pytest

from anarchon import MemoryBackend, Metrics, Scheduler
from anarchon._metrics import DURATION_BUCKETS, LAG_BUCKETS, SLOT_OUTCOMES, Counters
from anarchon._models import RunStatus, Trigger
from anarchon._schedule import CronSchedule
from anarchon.backend import Ticket
from anarchon.testing import FakeClock

START = 1_767_225_600_000


def test_the_snapshot_has_every_counter_and_documents_each_field() -> None:
    counters = [f.name for f in dataclasses.fields(Counters)]
    names = [f.name for f in dataclasses.fields(Metrics)]
    assert names[: len(counters)] == counters, "Metrics has every counter, in order"
    for name in names:
        assert f":ivar {name}:" in (Metrics.__doc__ or ""), f"Metrics.{name} is not documented"


def test_the_snapshot_reads_by_attribute_and_by_name_and_is_frozen() -> None:
    counters = Counters()
    counters.claims_won += 2
    counters.count_run(RunStatus.SUCCEEDED)
    counters.count_run(RunStatus.FAILED)
    snapshot = Metrics.of(counters, jobs=3, clock_offset_ms=None)
    assert snapshot.claims_won == snapshot["claims_won"] == snapshot.get("claims_won") == 2
    assert (snapshot.runs_succeeded, snapshot.runs_failed, snapshot.jobs) == (1, 1, 3)
    assert snapshot.get("no_such_counter") is None and "no_such_counter" not in snapshot
    with pytest.raises(KeyError):
        snapshot["no_such_counter"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.claims_won = 0
    as_dict = snapshot.as_dict()
    assert as_dict == dict(snapshot) and list(as_dict) == list(snapshot)
    assert json.loads(json.dumps(as_dict))["claims_won"] == 2
    counters.claims_won += 1
    assert snapshot["claims_won"] == 2, "a snapshot does not follow the counters"


async def test_every_counter_is_zero_from_the_start() -> None:
    scheduler = Scheduler(MemoryBackend(clock=FakeClock(START)), clock=FakeClock(START))
    scheduler.add("a", "* * * * *", lambda ctx: None)
    metrics = scheduler.metrics()
    assert metrics["claims_won"] == 0 and metrics.get("too_late") == 0
    assert metrics["jobs"] == 1 and metrics["clock_offset_ms"] is None


def test_per_job_figures_reach_the_snapshot_each_in_its_own_place() -> None:
    counters = Counters()
    ticket = Ticket(
        job="a",
        slot=START,
        slot_key=str(START),
        run_id="r",
        token="t",
        instance="i",
        trigger=Trigger.SCHEDULE,
        attempt=1,
        fence=1,
        started_at_ms=START,
        lease_ms=30_000,
    )
    counters.handler_started(ticket, START + 30)  # a fire lag of 30 ms
    counters.handler_ended("a", 2_000)
    counters.handler_ended("a", 5)
    counters.count_run(RunStatus.SUCCEEDED, "a", START + 2_030)
    counters.count_run(RunStatus.FAILED, "a")
    counters.count("a", "taken_over")
    counters.count("a", "lease_lost")
    counters.count("a", "lease_lost")
    counters.missed("a", 3)
    counters.handler_ended("b", 50)
    snapshot = Metrics.of(counters)
    a, b = snapshot.by_job["a"], snapshot.by_job["b"]
    assert a.slots == {**dict.fromkeys(SLOT_OUTCOMES, 0), "missed": 3}
    assert (
        a.runs == {"succeeded": 1, "failed": 1, "skipped": 0} and a.last_success_ms == START + 2_030
    )
    assert (a.taken_over, a.handed_over, a.lease_lost, a.result_refused) == (1, 0, 2, 0)
    assert (snapshot.taken_over, snapshot.lease_lost, snapshot.slots_missed) == (1, 2, 3)
    assert a.fire_lag.counts[LAG_BUCKETS.index(0.05)] == 1 and a.fire_lag.count == 1
    assert a.fire_lag.sum == pytest.approx(0.03)
    assert a.handler_duration.counts[DURATION_BUCKETS.index(5.0)] == 1
    assert a.handler_duration.counts[0] == 1 and a.handler_duration.count == 2
    assert a.handler_duration.sum == pytest.approx(2.005)
    assert b.last_success_ms is None and b.handler_duration.count == 1 and b.fire_lag.count == 0
    assert all(isinstance(n, int) for n in [*a.slots.values(), *a.fire_lag.counts])
    # The instance's histograms: every job's observations together.
    assert snapshot.fire_lag == a.fire_lag
    assert snapshot.handler_duration.counts == [
        x + y for x, y in zip(a.handler_duration.counts, b.handler_duration.counts, strict=True)
    ]
    assert snapshot.handler_duration.sum == pytest.approx(2.055)
    counters.count_run(RunStatus.SUCCEEDED, "a", START + 9_000)
    assert snapshot.by_job["a"].runs["succeeded"] == 1, "a snapshot does not follow the counters"


def test_the_next_slots_are_walked_once_a_slot_and_stay_right() -> None:
    """A scrape of 10 000 jobs walked each one's schedule twice (some 0.5 s); the walk is
    remembered per schedule until its next slot, and asked again at any other time it answers
    what a fresh walk does."""
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    for n in range(50):
        scheduler.add(f"every-{n}", "*/10 * * * * *", lambda ctx: None)
    scheduler.add("daily", "30 6 * * *", lambda ctx: None, timezone="Europe/Paris")
    walks = 0
    walk = CronSchedule._walk

    def counted(self: CronSchedule, after_ms: int) -> Iterator[int]:
        nonlocal walks
        walks += 1
        return walk(self, after_ms)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CronSchedule, "_walk", counted)
        for now in (START, START + 1, START + 9_999, START - 5_000, START + 10_000, START + 10_001):
            clock.step(now - clock.now_ms())
            rows = {row.name: row for row in scheduler._job_rows()}
            for name in ("every-7", "daily"):
                fresh = [
                    s * 1000 for s in itertools.islice(walk(scheduler._jobs[name].schedule, now), 2)
                ]
                assert (rows[name].next_slot_ms, rows[name].interval_ms) == (
                    fresh[0],
                    fresh[1] - fresh[0],
                ), (name, now)
            walks -= 2  # the two fresh walks above
    # Two schedules; walked again when the time went back, and at each passed slot.
    assert walks <= 2 * 4, walks
