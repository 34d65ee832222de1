"""The series table of the Prometheus exporter: each metric family whose value is one figure of
a job's row or of the instance's snapshot (name, help, kind and how to read it), the histograms'
layout and the help texts of the families built by hand in :mod:`anarchon._families`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._metrics import (
    _COUNTER_AT,
    _DURATION,
    _LAG,
    _LAST_SUCCESS,
    DURATION_BUCKETS,
    LAG_BUCKETS,
    JobRow,
)

Kind = Literal["counter", "gauge", "histogram", "info"]


@dataclass(frozen=True, slots=True)
class _Series:
    """One metric family whose single value per label set is one figure: of a job's
    :class:`JobRow` (labelled ``anarchon_job``) or of the instance's :class:`Metrics` (no
    labels)."""

    kind: Kind
    name: str
    """The family's name (a counter's without ``_total``)."""
    help: str
    read: Callable[[Any], float]
    """The figure, from the row or the snapshot."""


def _counter(name: str, help: str, read: Callable[[Any], float]) -> _Series:
    """A counter family (``name`` without ``_total``) and how to read its figure."""
    return _Series("counter", name, help, read)


def _gauge(name: str, help: str, read: Callable[[Any], float]) -> _Series:
    """A gauge family and how to read its figure."""
    return _Series("gauge", name, help, read)


def _seconds(ms: int | float | None) -> float:
    """Milliseconds as seconds; NaN (Prometheus's "no value") for None."""
    return math.nan if ms is None else ms / 1000


def _count(n: int | None) -> float:
    """A count as a sample; NaN for None (not measured yet)."""
    return math.nan if n is None else float(n)


def _job_count(key: str) -> Callable[[JobRow], float]:
    """A job's counter ``key`` (a key of ``_COUNTER_AT``), from its row's figures."""
    at = _COUNTER_AT[key]
    return lambda row: row.figures[at]


def _last_success(row: JobRow) -> float:
    """When the job last succeeded here (s), 0.0 if it never has."""
    last = row.figures[_LAST_SUCCESS]
    return 0.0 if math.isnan(last) else last / 1000


# Per job, after the slots and runs by outcome, in this order (the histograms, when per job,
# come between the counters and the gauges).
_JOB_COUNTERS: Final[tuple[_Series, ...]] = (
    _counter(
        "anarchon_takeovers",
        "Runs of dead instances this instance took over.",
        _job_count("taken_over"),
    ),
    _counter(
        "anarchon_handovers",
        "Runs this instance released on stop for a backup.",
        _job_count("handed_over"),
    ),
    _counter(
        "anarchon_leases_lost",
        "Runs of this instance whose lease was lost.",
        _job_count("lease_lost"),
    ),
    _counter(
        "anarchon_results_refused",
        "Results the backend refused because the lease had moved on.",
        _job_count("result_refused"),
    ),
)
_JOB_GAUGES: Final[tuple[_Series, ...]] = (
    _gauge(
        "anarchon_running_runs",
        "Runs in progress on this instance.",
        lambda row: float(row.running),
    ),
    _gauge(
        "anarchon_job_last_success_timestamp_seconds",
        "When this instance last recorded a success of the job (0: never).",
        _last_success,
    ),
    _gauge(
        "anarchon_job_seconds_since_last_success",
        "Seconds since this instance last recorded a success of the job, or since it started "
        "if it has recorded none (take the min over instances).",
        lambda row: _seconds(row.since_success_ms),
    ),
    _gauge(
        "anarchon_job_next_slot_timestamp_seconds",
        "The job's next slot.",
        lambda row: _seconds(row.next_slot_ms),
    ),
    _gauge(
        "anarchon_job_interval_seconds",
        "The gap between the job's next slot and the one after it.",
        lambda row: _seconds(row.interval_ms),
    ),
)
_SLOTS_HELP: Final = (
    "Slots by outcome: ran (won and started here), missed (recorded when this instance "
    "started), skipped (skip record written here) by reason class; summed over the instances, "
    "each equals history. unclaimed: not claimed here, nothing recorded (error: the backend "
    "unavailable until too late; refused)."
)
_RUNS_HELP: Final = (
    "Attempts whose end this instance recorded, by status (its results, the attempts its "
    "takeovers ended failed; skipped: run requests); summed, each equals history."
)
# The histograms of the fire lag and the handler duration: (name, help, bounds, where each
# job's are laid out in its figures, the instance's in the snapshot).
_HISTOGRAMS: Final = (
    (
        "anarchon_fire_lag_seconds",
        "From a scheduled slot's time to its handler's start (first attempts; jitter included).",
        LAG_BUCKETS,
        _LAG,
        "fire_lag",
    ),
    (
        "anarchon_handler_duration_seconds",
        "How long handlers ran (every attempt).",
        DURATION_BUCKETS,
        _DURATION,
        "handler_duration",
    ),
)
# Of the instance, after the claims, backend errors and claim latency, in this order.
_INSTANCE_SERIES: Final[tuple[_Series, ...]] = (
    _counter(
        "anarchon_slots_without_thread",
        "Slots of plain handlers not claimed because every handler thread was busy.",
        lambda m: m.no_thread,
    ),
    _counter(
        "anarchon_slots_deferred_early",
        "Slots due by this host's clock but early by the backend's, put back to wait.",
        lambda m: m.early_slots_deferred,
    ),
    _counter(
        "anarchon_threads_timed_out",
        "Plain handlers whose thread was still running at their timeout.",
        lambda m: m.timed_out_threads,
    ),
    _counter(
        "anarchon_cancellations_ignored",
        "Async handlers that ignored their cancellation on stop.",
        lambda m: m.cancel_ignored,
    ),
    _counter("anarchon_clock_steps", "Wall-clock steps the timer saw.", lambda m: m.clock_steps),
    _counter(
        "anarchon_clock_skew_warnings",
        "Warnings that this host's clock is off the backend's.",
        lambda m: m.clock_skew_warnings,
    ),
    _counter(
        "anarchon_retries_scheduled",
        "Retries stored after a handler failed (the job's retries).",
        lambda m: m.retries_scheduled,
    ),
    _counter(
        "anarchon_requests_run",
        "Run requests (triggers, retries) this instance won and ran.",
        lambda m: m.requests_run,
    ),
    _counter(
        "anarchon_failure_hook_errors",
        "Calls of a job's on_failure hook that raised.",
        lambda m: m.failure_hook_errors,
    ),
    _gauge("anarchon_jobs", "Jobs this instance carries.", lambda m: float(m.jobs)),
    _gauge("anarchon_watched_runs", "Runs of other instances watched.", lambda m: float(m.watched)),
    _gauge(
        "anarchon_handler_threads_busy",
        "Handler threads running a plain handler.",
        lambda m: float(m.handler_threads_busy),
    ),
    _gauge(
        "anarchon_instances_seen",
        "Live instances in the backend's registry at this instance's last heartbeat.",
        lambda m: _count(m.instances_seen),
    ),
    _gauge(
        "anarchon_clock_offset_seconds",
        "The backend's clock minus this host's, as last measured.",
        lambda m: _seconds(m.clock_offset_ms),
    ),
    _gauge(
        "anarchon_clock_skew_budget_seconds",
        "How far this clock may drift from the backend's before a slot could run twice (the "
        "tightest of the jobs; +Inf: unbounded).",
        lambda m: math.inf if m.clock_skew_budget_ms is None else m.clock_skew_budget_ms / 1000,
    ),
    _gauge(
        "anarchon_event_loop_lag_seconds",
        "The event loop's lag, last measured.",
        lambda m: _seconds(m.loop_lag_ms),
    ),
    _gauge(
        "anarchon_scheduler_start_time_seconds",
        "When the scheduler started (0: not yet).",
        lambda m: (m.started_ms or 0) / 1000,
    ),
)
# The backend errors by kind, from the flat counters: (operation, kind, field).
_BACKEND_ERRORS: Final = (
    ("claim", "unavailable", "claim_errors"),
    ("claim", "refused", "claims_refused"),
    ("finish", "refused", "result_errors"),
)
_RANKS: Final = ("preferred", "backup", "unranked", "heard")
# The help texts of the instance's families built by hand (_instance_families).
_CLAIMS_HELP: Final = "Claims answered: won (this instance runs), lost (another instance won)."
_RANKS_HELP: Final = (
    "Slots by how this instance came to claim them: preferred (ranked first, at once), backup "
    "(after its rank delay), unranked (random jitter), heard (not claimed: another instance's "
    "win was heard first)."
)
_ERRORS_HELP: Final = (
    "Backend errors by operation and kind: unavailable (retried), refused (for good)."
)
_LATENCY_HELP: Final = (
    "Latency of claim calls the backend answered (one call may carry many slots)."
)
_RUNNING_HELP: Final = "1 while the scheduler runs (started, not stopping)."
_INFO_HELP: Final = "This instance: its id, backend and anarchon's version."
_PENDING_HELP: Final = (
    "Run requests (triggers, retries) stored and not claimed yet, by job and kind, of every job "
    "in the backend as this instance last read them (the same on every instance; none: no series)."
)
