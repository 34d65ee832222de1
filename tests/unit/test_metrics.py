"""The metrics snapshot: every counter named once, present at zero, readable by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from anarchon import MemoryBackend, Metrics, Scheduler
from anarchon._metrics import Counters
from anarchon._models import RunStatus
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
