"""Times and durations as people read them: one ladder of units for the command line,
``explain`` and the dashboard, which differ only in how they spell a duration."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Final

from ._schedule import load_timezone
from .errors import ConfigurationError

DAY_MS: Final = 86_400_000
_LADDER: Final = (
    (1_000, 1),
    (60_000, 1_000),
    (3_600_000, 60_000),
    (2 * DAY_MS, 3_600_000),
    (math.inf, DAY_MS),
)
"""Below this many ms, count in this unit (ms, s, minutes, hours); from two days on, in days."""


@dataclass(frozen=True, slots=True)
class Spelling:
    """How :func:`span` writes each unit of the ladder (ms, s, minutes, hours, days)."""

    names: tuple[str, str, str, str, str]
    decimals: tuple[int, int, int, int, int]
    sep: str
    truncate: bool
    """Whole units round down (``90s`` is ``1m``) rather than to the nearest."""


COMPACT: Final = Spelling(("ms", "s", "m", "h", "d"), (0, 1, 0, 0, 0), "", truncate=True)
"""The command line's: ``850ms``, ``4.2s``, ``3m``, ``5h``, ``2d``."""
SPACED: Final = Spelling(("ms", "s", "min", "h", "d"), (0, 1, 0, 1, 0), " ", truncate=False)
"""The dashboard's: ``850 ms``, ``4.2 s``, ``3 min``, ``5.0 h``, ``2 d``."""


def span(ms: float, spelling: Spelling = COMPACT) -> str:
    """A duration at a glance, in the largest unit it reaches (a negative one reads as 0)."""
    ms = max(ms, 0)
    n, unit = next((n, unit) for n, (below, unit) in enumerate(_LADDER) if ms < below)
    decimals = spelling.decimals[n]
    value = ms // unit if spelling.truncate and not decimals else ms / unit
    return f"{value:.{decimals}f}{spelling.sep}{spelling.names[n]}"


def ms_of(at: datetime) -> int:
    """Epoch ms of an aware datetime."""
    return round(at.timestamp() * 1000)


def iso(ms: int | None) -> str:
    """Epoch ms as ISO 8601 in UTC to the second (``2026-01-02T03:04:05Z``), or ``-``."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_in(ms: int, zone: tzinfo) -> str:
    """Epoch ms as ISO 8601 in ``zone`` with its offset (``2026-03-29T03:30:00+03:00``; the
    milliseconds only when there are some): a time that reads back as the same instant."""
    spec = "milliseconds" if ms % 1000 else "seconds"
    return datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec=spec)


def iso_exact(ms: int) -> str:
    """Epoch ms as ISO 8601 in UTC (``2026-03-29T00:30:00Z``, ``…00:30:00.250Z``): what
    :func:`iso_in` gives, ``Z`` for ``+00:00``."""
    return iso_in(ms, UTC).replace("+00:00", "Z")


def iso_local(ms: int, zone: str) -> str | None:
    """Epoch ms in the job's ``zone`` with its offset (:func:`iso_in`), shown beside the UTC
    time; None for UTC itself, or a zone this host does not know."""
    if zone == "UTC":
        return None
    try:
        return iso_in(ms, load_timezone(zone))
    except ConfigurationError:
        return None
