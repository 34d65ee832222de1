"""The soak's drift rule: did a series (RSS, CPU, connections ...) grow over a long run?

A series is a list of ``(seconds since the start, value)`` samples. The first ``warmup_s``
seconds are dropped (pools fill, caches warm, the first slots run); the rest is cut into
quarters by sample count. The **drift** is the median of the last quarter minus the median
of the first: medians, so one busy sample (a handler running, a GC pause) does not decide.
The series passes when the drift is at most its tolerance, ``max(abs_tol, rel_tol * first
quarter's median)``. Only growth fails: a series that shrinks is not leaking. The least-squares
slope per hour is given beside it, as a second reading, but does not decide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_SAMPLES", "Drift", "Rule", "drift", "slope_per_hour"]

MIN_SAMPLES = 8
"""Fewer samples after the warm-up than this: no verdict (two per quarter at least)."""


@dataclass(frozen=True)
class Rule:
    """How much growth a series may show and still count as flat (noise)."""

    abs_tol: float
    """Growth always allowed, in the series' unit."""
    rel_tol: float
    """Growth allowed as a share of the first quarter's median (0.05: 5 %)."""

    def __post_init__(self) -> None:
        if not (self.abs_tol >= 0 and math.isfinite(self.abs_tol)):
            raise ValueError(f"abs_tol {self.abs_tol!r} must be a finite number >= 0")
        if not (self.rel_tol >= 0 and math.isfinite(self.rel_tol)):
            raise ValueError(f"rel_tol {self.rel_tol!r} must be a finite number >= 0")

    def tolerance(self, first: float) -> float:
        """The growth allowed for a series whose first quarter's median is ``first``."""
        return max(self.abs_tol, self.rel_tol * abs(first))

    def describe(self, unit: str) -> str:
        """The rule in words, for the report."""
        return f"max({self.abs_tol:g} {unit}, {self.rel_tol * 100:g} % of the first quarter)"


@dataclass(frozen=True)
class Drift:
    """One series' verdict."""

    first: float
    """Median of the first quarter after the warm-up."""
    last: float
    """Median of the last quarter."""
    change: float
    """``last - first``."""
    slope_per_h: float
    """Least-squares slope over the samples after the warm-up, per hour."""
    tolerance: float
    samples: int
    """Samples after the warm-up."""

    @property
    def ok(self) -> bool:
        """Whether the growth is within the tolerance."""
        return self.change <= self.tolerance


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def slope_per_hour(samples: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``value`` against ``seconds``, times 3600 (0 if undefined)."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 3600


def drift(samples: Sequence[tuple[float, float]], rule: Rule, warmup_s: float) -> Drift | None:
    """The drift of ``samples`` (``(seconds, value)``, in time order) after ``warmup_s``.

    None when fewer than :data:`MIN_SAMPLES` samples are left after the warm-up: too short a
    run to say.
    """
    if warmup_s < 0 or not math.isfinite(warmup_s):
        raise ValueError(f"warmup_s {warmup_s!r} must be a finite number of seconds >= 0")
    kept = [(t, v) for t, v in samples if t >= warmup_s and math.isfinite(v)]
    if len(kept) < MIN_SAMPLES:
        return None
    quarter = len(kept) // 4
    first = _median([v for _, v in kept[:quarter]])
    last = _median([v for _, v in kept[-quarter:]])
    return Drift(
        first=first,
        last=last,
        change=last - first,
        slope_per_h=slope_per_hour(kept),
        tolerance=rule.tolerance(first),
        samples=len(kept),
    )
