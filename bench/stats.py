"""Small statistics: percentiles, and counting runs per slot against the slots that were due."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SlotTally", "percentile", "tally"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


@dataclass
class SlotTally:
    """What happened to the slots that were due."""

    expected: int = 0
    ran: int = 0
    missed: int = 0
    duplicates: int = 0
    lags_ms: list[float] = field(default_factory=list)
    """First start minus slot, per slot that ran."""
    by_pid: dict[int, int] = field(default_factory=dict)

    def p(self, q: float) -> float | None:
        return percentile(self.lags_ms, q)


def tally(expected: Iterable[tuple[str, int]], starts: Iterable[dict[str, Any]]) -> SlotTally:
    """Count runs of each expected ``(job, slot_ms)`` among start records (keys j, s, t, p).

    Starts of attempts after the first (takeovers) are not duplicates; any other second start
    of a slot is. Starts of slots that were not expected are ignored.
    """
    want = set(expected)
    seen: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in starts:
        key = (record["j"], record["s"])
        if key in want and record.get("a", 1) == 1:
            seen[key].append(record)
    result = SlotTally(expected=len(want))
    by_pid: dict[int, int] = defaultdict(int)
    for key in want:
        runs = seen.get(key, [])
        if not runs:
            result.missed += 1
            continue
        result.ran += 1
        result.duplicates += len(runs) - 1
        first = min(runs, key=lambda r: r["t"])
        result.lags_ms.append(first["t"] * 1000 - key[1])
        by_pid[first["p"]] += 1
    result.by_pid = dict(by_pid)
    return result
