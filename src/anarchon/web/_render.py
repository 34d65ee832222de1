"""How the dashboard shows what it read: the pages' Jinja environment (its filters, and the
choices the pages offer: timeline ranges, history filters, pause lengths) and the JSON shapes of
a job's row and timeline for JSON clients.

The data itself comes from ``_data``; the routes that render it are ``_app``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape

from .._models import Run, Trigger
from .._readable import iso_exact, ms_of
from .._redact import redact_url
from ..registry import SILENT_HEARTBEATS
from . import _data

__all__ = [
    "FILTERS",
    "PAUSE_FOR",
    "RANGES",
    "filter_runs",
    "iso",
    "row_dict",
    "templates",
    "timeline_dict",
]

TEMPLATES: Final = Path(__file__).resolve().parent / "templates"
#: Timeline ranges offered, by name: span in ms.
RANGES: Final = {
    "1h": 3_600_000,
    "6h": 6 * 3_600_000,
    "24h": 86_400_000,
    "7d": 7 * 86_400_000,
    "30d": 30 * 86_400_000,
    "365d": 365 * 86_400_000,
}
#: "Pause for" choices on the forms, in minutes (0: until resumed).
PAUSE_FOR: Final = (0, 15, 60, 240, 1440)
#: The history filters a job page takes, with the values each allows (``instance`` takes any).
FILTERS: Final = {
    "status": ("succeeded", "failed", "running", "skipped", "missed", "paused", "late"),
    "trigger": tuple(t.value for t in Trigger),
}


def iso(ms: int | None) -> str:
    """A time as the pages show it: UTC with its ``Z``, and its milliseconds when it has some
    (as ``anarchon explain`` and ``history`` print it), so a time copied from a page into a
    slot address, ``explain`` or ``pause --until`` names the same instant; ``-`` for None."""
    return "-" if ms is None else iso_exact(ms)


def templates() -> Environment:
    """The pages' templates, with the filters and the choices they use."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        iso=iso,
        span=_data.span,
        redact=redact_url,
        q=lambda s: quote(str(s), safe=""),
        words=_data.schedule_in_words,
        fate=_data.fate_of,
        ms=lambda d: None if d is None else ms_of(d),
        lastline=lambda s: (s or "").strip().splitlines()[-1] if (s or "").strip() else "",
    )
    env.globals.update(
        FATES=_data.FATES,
        RANGES=RANGES,
        FILTERS=FILTERS,
        PAUSE_FOR=PAUSE_FOR,
        SILENT_HEARTBEATS=SILENT_HEARTBEATS,
    )
    return env


def filter_runs(runs: Sequence[Run], params: Any) -> list[Run]:
    """The runs a job page's history shows: those matching its ``status`` (a fate or a
    status), ``trigger`` and ``instance`` filters (each absent or empty: any)."""
    status, trigger, instance = (params.get(k) for k in ("status", "trigger", "instance"))
    return [
        r
        for r in runs
        if (not status or _data.fate_of(r) == status or r.status.value == status)
        and (not trigger or r.trigger.value == trigger)
        and (not instance or r.instance == instance)
    ]


def row_dict(row: _data.JobRow) -> dict[str, Any]:
    """A job's row as the jobs page's JSON gives it."""
    return {
        "name": row.name,
        "expression": row.definition.expression,
        "zone": row.definition.zone,
        "words": row.words,
        "instances": list(row.instances),
        "next_slot_ms": row.next_slot_ms,
        "last_run": None if row.last_run is None else _data.run_dict(row.last_run),
        "running": [_data.run_dict(r) for r in row.running],
        "paused": None if row.pause is None else row.pause.to_dict(),
        "drift": None if row.drift is None else row.drift.describe(),
        "strip": [{"slot_ms": c.slot_ms, "fate": c.fate} for c in row.strip],
    }


def timeline_dict(line: _data.Timeline) -> dict[str, Any]:
    """A job's timeline as the job page's JSON gives it."""
    return {
        "start_ms": line.start_ms,
        "end_ms": line.end_ms,
        "slots": line.slots,
        "counts": line.counts,
        "capped": line.capped,
        "walked_from_ms": line.walked_from_ms,
        "read_from_ms": line.read_from_ms,
    }
