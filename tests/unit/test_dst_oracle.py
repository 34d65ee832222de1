"""anarchon's DST rule against a simulation of Debian cron's own main loop, on every 2027 change.

Every IANA zone (``zoneinfo.available_timezones()``) whose UTC offset changes in 2027 is taken,
each change found by probing and bisection. For each change, Debian's loop
(``tests/oracles/debian_loop.py``) runs minute by minute from 6 hours before it to 26 hours after
it, and each expression below is compared with ``CronSchedule.slots`` over the same minutes, as
sets of instants: Debian runs a fixed-time job once per matching minute of a gap, all at the same
wake-up, and anarchon has one slot there (the multiplicity is left aside, as issue 11 says).

The expressions: a common set (wildcard hours and minutes, steps, fixed times, 6-field forms) and,
per change, fixed times and wildcard-hour times at the edges and the middle of its gap or repeat,
so a zone that changes at 00:00, 02:00 or 02:30 is probed where it matters.
``ANARCHON_CHAOS=1`` (``make chaos``) probes every minute around each change and every minute of
the hour as a wildcard-hour job. Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

import pytest

from anarchon import CronSchedule
from tests.oracles import vixie
from tests.oracles.debian_loop import Loop, Transition, simulate, transitions

CHAOS = os.environ.get("ANARCHON_CHAOS") == "1"
YEAR = 2027
BEFORE_MIN = 6 * 60
AFTER_MIN = 26 * 60

COMMON = [
    "30 * * * *",
    "0,15,45 * * * *",
    "*/15 * * * *",
    "*/7 * * * *",
    "* 23 * * *",
    "* 0 * * *",
    "0 */2 * * *",
    "0 1-23/2 * * *",
    "15 0-4 * * *",
    "45 23 * * *",
    "@hourly",
    "@daily",
    "10 2 * * SUN",
    "0 */20 * * * *",
    "30 15 * * * *",
    "*/30 30 1 * * *",
    "0 0,30 2 * * *",
    "20 30 2 * * *",
]


def _hm(local_minute: int) -> tuple[int, int]:
    hour, minute = divmod(local_minute % 1440, 60)
    return hour, minute


def local_expressions(change: Transition) -> list[str]:
    """Fixed and wildcard-hour times at the edges and middle of the change's gap or repeat."""
    walls = sorted((change.at // 60 + change.before, change.at // 60 + change.after))
    low, high = walls  # the gap (forward) or the repeat (backward), in local minutes
    if CHAOS:
        points = set(range(low - 30, high + 31))
    else:
        points = {low - 1, low, (low + high) // 2, high - 1, high}
    out: list[str] = []
    for point in sorted(points):
        hour, minute = _hm(point)
        out += [f"{minute} {hour} * * *", f"0 {minute} {hour} * * *", f"*/20 {minute} {hour} * * *"]
        out.append(f"{minute} * * * *")
    for hour in sorted({_hm(low)[0], _hm(high - 1)[0]}):
        out.append(f"* {hour} * * *")
    if CHAOS:
        out += [f"{minute} * * * *" for minute in range(60)]
    return list(dict.fromkeys(out))


@cache
def _spec(expression: str) -> vixie.Spec:
    return vixie.parse(expression)


def _iso(epoch_s: int, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(epoch_s, zone).isoformat()


@dataclass
class Outcome:
    """What a run of the oracle compared and found."""

    zones: set[str] = field(default_factory=set)
    transitions: int = 0
    expressions: set[str] = field(default_factory=set)
    comparisons: int = 0
    mismatches: list[str] = field(default_factory=list)
    bad_zones: set[str] = field(default_factory=set)

    def summary(self) -> str:
        return (
            f"zones {len(self.zones)}, transitions {self.transitions}, "
            f"expressions {len(self.expressions)}, comparisons {self.comparisons}, "
            f"mismatches {len(self.mismatches)} (zones {sorted(self.bad_zones)})"
        )


Slots = Callable[[CronSchedule, int, int], list[int]]


def run_oracle(slots: Slots = CronSchedule.slots) -> Outcome:
    """Compare anarchon with Debian's loop around every 2027 change of every zone."""
    changes = transitions(sorted(available_timezones()), YEAR)
    outcome = Outcome(zones={c.zone for c in changes}, transitions=len(changes))
    schedules: dict[tuple[str, str], CronSchedule] = {}
    for change in changes:
        zone = ZoneInfo(change.zone)
        at_minute = change.at // 60
        first, last = at_minute - BEFORE_MIN, at_minute + AFTER_MIN
        loop = simulate(zone, first, last)
        # Debian re-reads GMToff only when tm_isdst flips; every 2027 change does.
        assert (
            datetime.fromtimestamp(change.at - 1, zone).dst()
            != datetime.fromtimestamp(change.at, zone).dst()
        ), f"{change} does not flip tm_isdst: Debian cron would not see it"
        after_ms, until_ms = (first + 1) * 60_000 - 1, last * 60_000 + 59_999
        for expression in [*COMMON, *local_expressions(change)]:
            outcome.expressions.add(expression)
            key = (expression, change.zone)
            if key not in schedules:
                schedules[key] = CronSchedule(expression, change.zone)
            want = loop.fires(_spec(expression))
            got = {slot // 1000 for slot in slots(schedules[key], after_ms, until_ms)}
            outcome.comparisons += 1
            if got != want:
                outcome.bad_zones.add(change.zone)
                missing, extra = sorted(want - got)[:4], sorted(got - want)[:4]
                outcome.mismatches.append(
                    f"{change.zone} change at {_iso(change.at, zone)} ({change.shift:+d} min), "
                    f"{expression!r}: Debian only {[_iso(s, zone) for s in missing]}, "
                    f"anarchon only {[_iso(s, zone) for s in extra]}"
                )
    return outcome


@pytest.mark.timeout(900)  # CPU-bound: 402 changes; on a loaded 2-core machine it takes minutes
def test_every_2027_change_matches_debian_cron() -> None:
    began = time.monotonic()
    outcome = run_oracle()
    assert outcome.transitions > 300, "no zone database? fewer DST changes in 2027 than expected"
    print(f"\nDebian-loop oracle {YEAR}: {outcome.summary()}, {time.monotonic() - began:.1f} s")
    assert not outcome.mismatches, "\n".join(outcome.mismatches[:30])


def _fires(loop: Loop, expression: str, zone: ZoneInfo) -> list[str]:
    return [_iso(s, zone)[11:] for s in sorted(loop.fires(vixie.parse(expression)))]


def test_the_loop_runs_new_york_as_debian_documents() -> None:
    """The oracle itself, by hand, on New York's two changes: it can tell right from wrong."""
    zone = ZoneInfo("America/New_York")
    spring, autumn = transitions(["America/New_York"], YEAR)
    assert _iso(spring.at, zone) == "2027-03-14T03:00:00-04:00"
    loop = simulate(zone, spring.at // 60 - 120, spring.at // 60 + 120)  # 00:00 EST to 05:00 EDT
    # Fixed times in the gap run at the wake-up right after it, once per matching minute.
    assert _fires(loop, "30 2 * * *", zone) == ["03:00:00-04:00"]
    assert _fires(loop, "0,30 2 * * *", zone) == ["03:00:00-04:00"]
    assert _fires(loop, "0 30 2 * * *", zone) == ["03:00:00-04:00"]
    assert _fires(loop, "15 30 2 * * *", zone) == ["03:00:15-04:00"]
    # Wildcard jobs run in real time: nothing for the wall-clock times the gap skips.
    assert _fires(loop, "30 * * * *", zone) == [
        "00:30:00-05:00", "01:30:00-05:00", "03:30:00-04:00", "04:30:00-04:00"
    ]  # fmt: skip
    assert _fires(loop, "* 2 * * *", zone) == []
    assert _iso(autumn.at, zone) == "2027-11-07T01:00:00-05:00"
    loop = simulate(zone, autumn.at // 60 - 120, autumn.at // 60 + 120)  # 00:00 EDT to 03:00 EST
    # A fixed time that occurs twice runs at the first; a wildcard-hour job at both.
    assert _fires(loop, "30 1 * * *", zone) == ["01:30:00-04:00"]
    assert _fires(loop, "30 * * * *", zone) == [
        "00:30:00-04:00", "01:30:00-04:00", "01:30:00-05:00", "02:30:00-05:00"
    ]  # fmt: skip
    assert len(_fires(loop, "* 1 * * *", zone)) == 120


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "zone", ["America/New_York", "Australia/Lord_Howe", "Pacific/Chatham", "Antarctica/Troll"]
)
@pytest.mark.parametrize(
    "expression",
    ["30 * * * *", "*/20 * * * *", "* 3 * * *", "* 23 * * *", "15 2 * * *", "0 30 1 * * *",
     "*/45 * 1-4 * * *"],
)  # fmt: skip
def test_next_slot_from_any_moment_near_a_change_is_debians_next_run(
    zone: str, expression: str
) -> None:
    """Asked from inside a gap, from either pass of a repeat or from near them, ``next_slot``
    answers Debian's next run, on a fresh schedule and on one walked forward alike."""
    spec = _spec(expression)
    for change in transitions([zone], YEAR):
        at = change.at * 1000
        loop = simulate(ZoneInfo(zone), change.at // 60 - 6 * 60, change.at // 60 + 30 * 60)
        runs = sorted(run * 1000 for run in loop.fires(spec))
        walked = CronSchedule(expression, zone)
        for moment in range(at - 4 * 3600_000, at + 4 * 3600_000, 193_001):  # off the second
            want = next(run for run in runs if run > moment)
            asked_at = _iso(moment // 1000, ZoneInfo(zone))
            assert CronSchedule(expression, zone).next_slot(moment) == want, asked_at
            assert walked.next_slot(moment) == want, asked_at
