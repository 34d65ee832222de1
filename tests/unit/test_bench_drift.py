"""The soak's drift rule (bench/drift.py) and its slot arithmetic (bench/soak.py)."""

from __future__ import annotations

import math

import pytest
from bench import drift
from bench.soak import expected_slots
from bench.worker import spread_schedule

from anarchon import CronSchedule

RULE = drift.Rule(abs_tol=2.0, rel_tol=0.05)


def series(values: list[float], every_s: float = 10.0) -> list[tuple[float, float]]:
    return [(i * every_s, v) for i, v in enumerate(values)]


def test_flat_series_passes_with_zero_drift_and_slope() -> None:
    result = drift.drift(series([40.0] * 40), RULE, warmup_s=0)
    assert result is not None
    assert (result.first, result.last, result.change, result.slope_per_h) == (40, 40, 0, 0)
    assert result.ok


def test_growth_above_tolerance_fails() -> None:
    # 40 -> 43 over the run: +3 > max(2, 5 % of 40 = 2)
    values = [40.0] * 10 + [41.0] * 10 + [42.0] * 10 + [43.0] * 10
    result = drift.drift(series(values), RULE, warmup_s=0)
    assert result is not None
    assert result.change == 3.0
    assert result.tolerance == 2.0
    assert not result.ok
    assert result.slope_per_h > 0


def test_relative_tolerance_wins_for_large_values() -> None:
    values = [100.0] * 20 + [104.0] * 20  # +4 <= 5 % of 100
    result = drift.drift(series(values), RULE, warmup_s=0)
    assert result is not None and result.tolerance == 5.0 and result.ok


def test_shrinking_is_not_a_leak() -> None:
    result = drift.drift(series([50.0] * 20 + [30.0] * 20), RULE, warmup_s=0)
    assert result is not None and result.change == -20 and result.ok


def test_warmup_is_dropped() -> None:
    # A pool filling in the first minute: 10 -> 20, then flat.
    values = [10.0] * 6 + [20.0] * 40
    assert not drift.drift(series(values), RULE, warmup_s=0).ok  # type: ignore[union-attr]
    assert drift.drift(series(values), RULE, warmup_s=60).ok  # type: ignore[union-attr]


def test_medians_ignore_a_single_spike() -> None:
    values = [5.0] * 39 + [500.0]
    result = drift.drift(series(values), RULE, warmup_s=0)
    assert result is not None and result.last == 5.0 and result.ok


def test_too_few_samples_gives_no_verdict() -> None:
    few = series([1.0] * (drift.MIN_SAMPLES - 1))
    assert drift.drift(few, RULE, warmup_s=0) is None
    assert drift.drift(series([1.0] * 20), RULE, warmup_s=1000) is None


def test_slope_per_hour() -> None:
    # +1 every minute: 60 per hour
    assert drift.slope_per_hour([(t * 60.0, float(t)) for t in range(10)]) == pytest.approx(60)
    assert drift.slope_per_hour([(0.0, 1.0)]) == 0.0


@pytest.mark.parametrize(
    ("abs_tol", "rel_tol", "word"),
    [(-1.0, 0.1, "abs_tol"), (1.0, -0.1, "rel_tol"), (math.nan, 0.1, "abs_tol")],
)
def test_bad_rules_are_refused(abs_tol: float, rel_tol: float, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        drift.Rule(abs_tol, rel_tol)


def test_bad_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup_s"):
        drift.drift(series([1.0] * 10), RULE, warmup_s=-1)


@pytest.mark.parametrize(("jobs", "period"), [(1000, 5), (120, 1), (7, 2), (300, 15)])
def test_expected_slots_match_the_spread_schedules(jobs: int, period: int) -> None:
    w0, w1 = 1_800_000_007.0, 1_800_000_007.0 + 17 * 60
    lo, hi = int(w0 * 1000) - 1, int(w1 * 1000) - 1
    # anarchon's own cron arithmetic is the oracle: slots in [w0, w1) = (w0 - 1 ms, w1 - 1 ms]
    want = {
        (f"s{n}", slot)
        for n in range(jobs)
        for slot in CronSchedule(spread_schedule(n, period)).slots(lo, hi)
    }
    got = expected_slots(jobs, period, w0, w1)
    assert len(got) == len(set(got))
    assert set(got) == want
