"""The fault suite's counts on made-up records: each count can fail, and legitimate recoveries
(a takeover after kill -9, a hand-over, a frozen runner's last step) count as nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.faults import FAULTS, Trial, _tick_slots
from tests.chaos.fleet import Fleet
from tests.chaos.measure import Counts, measure
from tests.chaos.run import BEGIN, END, SHORT, plan, table, write_docs

SLOT = 1_800_000_000_000


class Run:
    """Writes the records one attempt's handler would write (times in seconds, monotonic)."""

    def __init__(self, run_id: str, attempt: int, start: float, pid: int = 1) -> None:
        self.base = {
            "job": "work",
            "slot": SLOT,
            "run_id": run_id,
            "attempt": attempt,
            "fence": attempt,
            "instance": f"i{pid}",
            "pid": pid,
        }
        self.records: list[dict[str, Any]] = [self._at("start", start)]
        self.steps = 0

    def _at(self, event: str, mono: float, **fields: Any) -> dict[str, Any]:
        return {"event": event, "mono": mono, "wall": mono, **self.base, **fields}

    def step(self, begin: float, end: float | None = None, ms: int = 1000) -> Run:
        i = self.steps
        self.steps += 1
        self.records.append(self._at("step", begin, i=i, ms=ms))
        if end is not None:
            self.records.append(self._at("step_end", end, i=i))
        return self

    def work(self, begin: float, count: int) -> Run:
        for k in range(count):
            self.step(begin + k, begin + k + 1)
        return self

    def end(self, mono: float, outcome: str = "ok") -> Run:
        self.records.append(self._at("end", mono, outcome=outcome))
        return self

    def accepted(self, mono: float) -> Run:
        self.records.append({**self._at("log", mono), "action": "run_succeeded"})
        return self


def counts(
    *runs: Run,
    history: list[dict[str, Any]] | None = None,
    expected: bool = True,
    deaths: dict[int, float] | None = None,
    broker: bool = False,
) -> Counts:
    records = [r for run in runs for r in run.records]
    return measure(
        records,
        {"work": history or []},
        {"work": {SLOT}} if expected else {},
        deaths or {},
        broker,
    )


def test_a_takeover_after_kill_9_is_no_duplicate() -> None:
    a = Run("a", 1, 0.0, pid=1).work(0.0, 3).step(3.0)  # killed 3.5 s in, mid-step
    b = Run("b", 2, 16.0, pid=2).work(16.0, 5).end(21.0)
    c = counts(a, b, deaths={1: 3.5})
    assert (c.duplicates, c.concurrent, c.missed, c.stale) == (0, 0, 0, 0)
    assert c.slots == 1 and c.failures(broker=False) == []


def test_a_runner_that_drains_past_its_lease_is_a_duplicate_and_concurrent() -> None:
    a = Run("a", 1, 0.0).work(0.0, 24).end(24.0)  # SIGTERM at 3 s: drains, never told
    b = Run("b", 2, 16.0, pid=2).work(16.0, 5).end(21.0)
    c = counts(a, b)
    assert (c.duplicates, c.concurrent) == (1, 1)
    assert c.failures(broker=False) == ["duplicate starts: 1", "concurrent executions: 1"]


def test_a_hand_over_is_no_duplicate() -> None:
    a = Run("a", 1, 0.0).work(0.0, 30).step(30.0, 30.2)  # cancelled 0.2 s into its step
    b = Run("b", 2, 30.5, pid=2).work(30.5, 5).end(35.5)
    c = counts(a, b)
    assert (c.duplicates, c.concurrent, c.missed) == (0, 0, 0)


def test_a_frozen_runner_finishing_its_step_is_not_counted_but_a_new_step_is() -> None:
    # SIGSTOP 2.5 s in, SIGCONT at 23: the step begun at 2 ends (late) and the handler returns.
    a = Run("a", 1, 0.0).work(0.0, 2).step(2.0, 23.0).end(23.0)
    b = Run("b", 2, 16.0, pid=2).work(16.0, 8).end(24.0)
    c = counts(a, b)
    assert (c.duplicates, c.concurrent) == (0, 0)
    # The same, but after SIGCONT it begins another step although its lease is gone.
    a2 = Run("a", 1, 0.0).work(0.0, 2).step(2.0, 23.0).step(23.0, 24.0).end(24.0)
    c = counts(a2, b)
    assert (c.duplicates, c.concurrent) == (1, 1)


def test_a_slot_run_to_completion_twice_is_a_duplicate() -> None:
    a = Run("a", 1, 0.0).work(0.0, 1).end(1.0, outcome="exit")  # the scheduler died with it
    b = Run("b", 2, 16.0, pid=2).work(16.0, 1).end(17.0, outcome="exit")
    c = counts(a, b)
    assert (c.duplicates, c.concurrent) == (1, 0)


def test_two_winners_of_one_claim_are_a_duplicate() -> None:
    a = Run("a", 1, 0.0).work(0.0, 1)
    b = Run("b", 1, 5.0, pid=2).work(5.0, 1)  # attempt 1 again, after a killed a
    c = counts(a, b, deaths={1: 1.5})
    assert c.duplicates == 1 and c.concurrent == 0


def test_steps_overlap_is_cut_at_the_process_death() -> None:
    a = Run("a", 1, 0.0).step(0.0, ms=20_000)  # a 20 s step, the process killed at 3 s
    b = Run("b", 2, 5.0, pid=2).work(5.0, 2).end(7.0)
    assert counts(a, b, deaths={1: 3.0}).concurrent == 0
    assert counts(a, b).concurrent == 1  # alive: its 20 s step overlaps b's


def test_on_a_broker_every_second_start_is_a_duplicate_and_stale_does_not_apply() -> None:
    a = Run("a", 1, 0.0).work(0.0, 2).end(2.0)
    b = Run("b", 1, 10.0, pid=2).work(10.0, 2).end(12.0)
    c = counts(a, b, broker=True)
    assert (c.duplicates, c.concurrent, c.stale) == (1, 0, None)
    assert c.failures(broker=True) == ["duplicate starts: 1"]


def test_missed_slots() -> None:
    assert counts().missed == 1  # never started (skipped, too late, never claimed)
    cut_short = Run("a", 1, 0.0).work(0.0, 2)  # lost its lease, nobody took over
    assert counts(cut_short).missed == 1
    assert counts(Run("a", 1, 0.0).work(0.0, 1).end(1.0)).missed == 0
    failed_by_itself = Run("a", 1, 0.0).work(0.0, 1).end(1.0, outcome="exit")
    assert counts(failed_by_itself).missed == 0
    assert counts(expected=False).missed == 0 and counts(expected=False).slots == 0


def history(*rows: tuple[int, str, str | None]) -> list[dict[str, Any]]:
    return [
        {"slot": SLOT, "attempt": attempt, "status": status, "reason": reason}
        for attempt, status, reason in rows
    ]


def test_stale_results_from_history() -> None:
    a = Run("a", 1, 0.0).work(0.0, 2)
    b = Run("b", 2, 16.0, pid=2).work(16.0, 2).end(18.0)
    fine = history((1, "failed", "lease lost"), (2, "succeeded", None))
    assert counts(a, b, history=fine).stale == 0
    stale_success = history((1, "succeeded", None), (2, "running", None))
    assert counts(a, b, history=stale_success).stale == 1
    stale_failure = history((1, "failed", None), (2, "succeeded", None))
    assert counts(a, b, history=stale_failure).stale == 1


def test_stale_results_seen_by_a_worker() -> None:
    a = Run("a", 1, 0.0).work(0.0, 2)
    b = Run("b", 2, 16.0, pid=2).work(16.0, 2).end(18.0)
    assert counts(a.accepted(20.0), b).stale == 1  # accepted after attempt 2 began
    early = Run("a", 1, 0.0).work(0.0, 2).accepted(2.5)
    assert counts(early, b).stale == 0


def test_counts_add_up() -> None:
    total = Counts()
    one = Counts(trials=1, slots=3, duplicates=1, missed=2, stale=1, stuck=1)
    one.notes["taken over"] += 2
    total.add(one)
    total.add(Counts(trials=1, slots=2, concurrent=1, stale=0, errors=1))
    assert (total.trials, total.slots, total.duplicates, total.concurrent) == (2, 5, 1, 1)
    assert (total.missed, total.stale, total.stuck, total.errors) == (2, 1, 1, 1)
    assert total.notes == {"taken over": 2}
    total.add(Counts(trials=1, stale=None))
    assert total.stale is None
    assert Counts.from_json(json.loads(json.dumps(total.to_json()))) == total


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def _trial(tmp_path: Path, backend: str = "redis") -> Trial:
    fleet = Fleet(tmp_path)
    fleet.instances = [_Named("w0"), _Named("w1")]  # type: ignore[list-item]
    trial = Trial(FAULTS["clock-back"], backend, tmp_path, fleet, None)  # type: ignore[arg-type]
    trial.wall_minus_mono = 1_000_000.0  # wall = mono + 1e6
    return trial


def test_tick_slots_follow_each_instance_clock(tmp_path: Path) -> None:
    assert _tick_slots(1.0, 9.0) == {3000, 6000, 9000}
    trial = _trial(tmp_path)
    trial.expect_ticks(0.0, 30.0, {})
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_030)
    # w0 stepped back 60 s at 12: its clock reads earlier slots again (not expected), w1 goes on.
    trial.expect_ticks(0.0, 30.0, {"w0": [(12.0, -60)]})
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_030)
    # Both stepped back (SQLite: the host's clock): from 12 on, slots before the trial only, and
    # the slots due just before the step wait until the clock reads them again ...
    both_back = {"w0": [(12.0, -60)], "w1": [(12.0, -60)]}
    trial.expect_ticks(0.0, 30.0, both_back)
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_009)
    # ... which it does 60 s later.
    trial.expect_ticks(0.0, 90.0, both_back)
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_030)
    # SQLite, both stepped forward 60 s at 12 (the host's clock): slots passed over are not
    # expected, later ones are (every instance fires by the stepped clock).
    on_one_host = _trial(tmp_path, "sqlite")
    on_one_host.expect_ticks(0.0, 30.0, {"w0": [(12.0, 60)], "w1": [(12.0, 60)]})
    assert on_one_host.expected["tick"] == _tick_slots(1_000_000, 1_000_012) | _tick_slots(
        1_000_075, 1_000_090
    )
    # Only w0 stepped forward (a network backend): it waits for the backend's time, so the
    # slots its clock reads ahead are not due yet; w1 still expects every slot of the trial.
    trial.expect_ticks(0.0, 30.0, {"w0": [(12.0, 60)]})
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_030)
    # An outage excuses the slots due during it.
    trial.expect_ticks(0.0, 30.0, {}, excused=(10.0, 20.0))
    assert trial.expected["tick"] == _tick_slots(1_000_000, 1_000_030) - _tick_slots(
        1_000_010, 1_000_020
    )


def test_the_table_and_the_docs_section(tmp_path: Path) -> None:
    lease = Counts(trials=2, slots=4, duplicates=1)
    lease.sigterm_exits = [21.2, 22.6]
    broker = Counts(trials=1, slots=3, missed=1, stale=None)
    text = table({("sigterm", "redis"): lease, ("kill-9", "nats"): broker})
    assert (
        "| sigterm | redis | 2 | 4 | **1** | 0 | 0 | 0 | 0 | exit 21-23 s after SIGTERM |" in text
    )
    assert "| kill-9 | nats | 1 | 3 | 0 | 0 | (1) | n/a | (0) |  |" in text
    doc = tmp_path / "guarantees.md"
    doc.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    write_docs(doc, "new table")
    assert doc.read_text() == f"before\n{BEGIN}\nnew table\n{END}\nafter\n"
    doc.write_text("no markers")
    with pytest.raises(SystemExit):
        write_docs(doc, "x")


def test_the_plan_covers_every_fault_and_the_short_form_each_once() -> None:
    cells = plan(FAULTS, ("sqlite", "postgres", "redis", "nats"))
    assert {f for f, _ in cells} == set(FAULTS)
    assert ("restart", "sqlite") not in cells and ("block-loop", "nats") not in cells
    assert {f for f, _ in SHORT} == set(FAULTS)
    assert all(cell in cells for cell in SHORT)
    assert {b for _, b in SHORT} == {"sqlite", "postgres", "redis", "nats"}
