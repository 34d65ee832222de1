"""The metric families of one scrape, as data: every family of the exporter with its samples,
built from a scheduler's snapshot and job rows (:mod:`anarchon._series` says which), for the
text writer (:mod:`anarchon._exposition`) and the ``prometheus_client`` collector alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._metrics import _RUNS_AT, _SLOTS_AT, RUN_STATUSES, SLOT_OUTCOMES, Histogram, JobRow, Metrics
from ._series import (
    _BACKEND_ERRORS,
    _CLAIMS_HELP,
    _ERRORS_HELP,
    _HISTOGRAMS,
    _INFO_HELP,
    _INSTANCE_SERIES,
    _JOB_COUNTERS,
    _JOB_GAUGES,
    _LATENCY_HELP,
    _PENDING_HELP,
    _RANKS,
    _RANKS_HELP,
    _RUNNING_HELP,
    _RUNS_HELP,
    _SLOTS_HELP,
    Kind,
    _Series,
)

if TYPE_CHECKING:
    from ._scheduler import Scheduler

Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class _Family:
    """One metric family's samples. Per job (``per_job``), each column holds one value per job
    (in the order of the scrape's job names) under ``anarchon_job`` and the column's labels;
    else one value. A column is ``(sample name suffix, labels, values)``."""

    kind: Kind
    name: str
    help: str
    per_job: bool
    columns: list[tuple[str, Labels, Sequence[float]]]


def _histogram_columns(
    bounds: tuple[float, ...], counts: Sequence[Sequence[float]], sums: Sequence[float]
) -> list[tuple[str, Labels, Sequence[float]]]:
    """The columns of a histogram: cumulative ``_bucket`` per ``le``, ``_sum``, ``_count``;
    ``counts`` holds, per bucket (``len(bounds) + 1``), a sequence of values (one per job)."""
    columns: list[tuple[str, Labels, Sequence[float]]] = []
    total: list[float] = [0.0] * len(sums)
    for bound, column in zip((*bounds, math.inf), counts, strict=True):
        total = [a + b for a, b in zip(total, column, strict=True)]
        le = "+Inf" if math.isinf(bound) else repr(bound)
        columns.append(("_bucket", (("le", le),), total))
    columns.append(("_sum", (), sums))
    columns.append(("_count", (), total))
    return columns


def _families(
    scheduler: Scheduler, m: Metrics | None, rows: Sequence[JobRow], job_histograms: bool
) -> list[_Family]:
    """Every family of one scrape (without samples when ``m`` is None: the names)."""
    figures = [row.figures for row in rows]
    out = [
        _Family(
            "counter",
            "anarchon_slots",
            _SLOTS_HELP,
            True,
            [
                ("_total", (("outcome", outcome), ("reason", reason)), [f[n] for f in figures])
                for (outcome, reason), n in zip(
                    SLOT_OUTCOMES.values(), _SLOTS_AT.values(), strict=True
                )
            ],
        ),
        _Family(
            "counter",
            "anarchon_runs",
            _RUNS_HELP,
            True,
            [
                ("_total", (("status", status),), [f[_RUNS_AT[status]] for f in figures])
                for status in sorted(RUN_STATUSES)
            ],
        ),
    ]
    out.extend(_per_job(series, rows) for series in _JOB_COUNTERS)
    for name, help, bounds, at, field in _HISTOGRAMS:
        if job_histograms:
            counts = [[f[at + b] for f in figures] for b in range(len(bounds) + 1)]
            sums = [f[at + len(bounds) + 1] for f in figures]
            out.append(
                _Family("histogram", name, help, True, _histogram_columns(bounds, counts, sums))
            )
        else:
            columns = []
            if m is not None:
                fleet: Histogram = getattr(m, field)
                columns = _histogram_columns(bounds, [[n] for n in fleet.counts], [fleet.sum])
            out.append(_Family("histogram", name, help, False, columns))
    out.extend(_per_job(series, rows) for series in _JOB_GAUGES)
    out.extend(_instance_families(scheduler, m))
    return out


def _per_job(series: _Series, rows: Sequence[JobRow]) -> _Family:
    """The family of a figure each job has one of."""
    suffix = "_total" if series.kind == "counter" else ""
    return _Family(
        series.kind, series.name, series.help, True, [(suffix, (), [series.read(r) for r in rows])]
    )


def _instance_families(scheduler: Scheduler, m: Metrics | None) -> list[_Family]:
    """The instance's families (its snapshot's figures; without samples when ``m`` is None)."""

    def one(kind: Kind, name: str, help: str, columns: list[tuple[str, Labels, float]]) -> _Family:
        """A family of the instance, one value per column."""
        return _Family(kind, name, help, False, [(s, labels, [v]) for s, labels, v in columns])

    backend = scheduler.backend.name
    if m is None:
        return [
            one("counter", "anarchon_claims", _CLAIMS_HELP, []),
            one("counter", "anarchon_claim_ranks", _RANKS_HELP, []),
            one("counter", "anarchon_backend_errors", _ERRORS_HELP, []),
            one("histogram", "anarchon_claim_latency_seconds", _LATENCY_HELP, []),
            *(one(s.kind, s.name, s.help, []) for s in _INSTANCE_SERIES),
            one("gauge", "anarchon_scheduler_running", _RUNNING_HELP, []),
            one("gauge", "anarchon_requests_pending", _PENDING_HELP, []),
            one("info", "anarchon_instance", _INFO_HELP, []),
        ]
    from . import __version__

    latency = m.claim_latency
    out = [
        one(
            "counter",
            "anarchon_claims",
            _CLAIMS_HELP,
            [
                ("_total", (("result", "won"),), m.claims_won),
                ("_total", (("result", "lost"),), m.claims_lost),
            ],
        ),
        one(
            "counter",
            "anarchon_claim_ranks",
            _RANKS_HELP,
            [("_total", (("rank", name),), getattr(m, f"claims_{name}")) for name in _RANKS],
        ),
        one(
            "counter",
            "anarchon_backend_errors",
            _ERRORS_HELP,
            [
                (
                    "_total",
                    (("backend", backend), ("operation", operation), ("kind", kind)),
                    getattr(m, field),
                )
                for operation, kind, field in _BACKEND_ERRORS
            ],
        ),
        _Family(
            "histogram",
            "anarchon_claim_latency_seconds",
            _LATENCY_HELP,
            False,
            [
                (suffix, (("backend", backend), *labels), values)
                for suffix, labels, values in _histogram_columns(
                    latency.bounds, [[n] for n in latency.counts], [latency.sum]
                )
            ],
        ),
    ]
    for series in _INSTANCE_SERIES:
        suffix = "_total" if series.kind == "counter" else ""
        out.append(one(series.kind, series.name, series.help, [(suffix, (), series.read(m))]))
    out.append(
        one(
            "gauge",
            "anarchon_scheduler_running",
            _RUNNING_HELP,
            [("", (), 1.0 if scheduler.running else 0.0)],
        )
    )
    pending: list[tuple[str, Labels, float]] = [
        ("", (("anarchon_job", job), ("kind", kind)), float(count))
        for (job, kind), count in sorted(m.pending_requests.items())
    ]
    out.append(one("gauge", "anarchon_requests_pending", _PENDING_HELP, pending))
    info = (("backend", backend), ("instance_id", scheduler.instance_id), ("version", __version__))
    out.append(one("info", "anarchon_instance", _INFO_HELP, [("_info", info, 1.0)]))
    return out


def _scrape(scheduler: Scheduler) -> tuple[Metrics, Sequence[JobRow]]:
    """What one scrape reads: the instance's snapshot (without per-job figures) and each
    job's row."""
    seen = scheduler.observe(jobs=True)
    # The raw rows: a JobMetrics made per job would cost 82 ms a scrape of 10 000 jobs, not 10.
    return seen.metrics, seen._rows
