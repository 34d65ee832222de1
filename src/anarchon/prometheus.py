"""Prometheus metrics of a scheduler (``pip install 'anarchon[prometheus]'``, the official
``prometheus-client``, imported only when a collector is built).

Put the scheduler's metrics on the application's own registry::

    import anarchon.prometheus
    anarchon.prometheus.register(scheduler)            # prometheus_client.REGISTRY
    anarchon.prometheus.register(scheduler, registry=my_registry)

or let ``anarchon run app:scheduler --metrics-port 9464`` serve them on ``/metrics``.

Every value is read from :meth:`Scheduler.metrics() <anarchon.Scheduler.metrics>` at scrape
time, so the exporter costs nothing between scrapes. Names follow Prometheus's conventions
(``anarchon_`` prefix, counters end in ``_total``, durations in ``_seconds``); labels are the job
(``anarchon_job``: Prometheus gives the label ``job`` to the scrape job, and would rename ours),
and where it helps the backend, outcome, reason class or status, never a slot or a run id.
Every series of every registered job is there from the start, at zero. docs/metrics.md lists
them all with alert rules.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from ._metrics import SLOT_OUTCOMES, Histogram, JobMetrics, Metrics
from .errors import InvalidOption, MissingDependency

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from ._scheduler import Scheduler

__all__ = ["AnarchonCollector", "Histogram", "JobMetrics", "register", "render"]

_INSTALL: Final = "pip install 'anarchon[prometheus]'"
# Flat counters of Metrics: (metric name without _total, help, field).
_FLAT_COUNTERS: Final = (
    (
        "anarchon_slots_without_thread",
        "Slots of plain handlers not claimed because every handler thread was busy.",
        "no_thread",
    ),
    (
        "anarchon_slots_deferred_early",
        "Slots due by this host's clock but early by the backend's, put back to wait.",
        "early_slots_deferred",
    ),
    (
        "anarchon_threads_timed_out",
        "Plain handlers whose thread was still running at their timeout.",
        "timed_out_threads",
    ),
    (
        "anarchon_cancellations_ignored",
        "Async handlers that ignored their cancellation on stop.",
        "cancel_ignored",
    ),
    ("anarchon_clock_steps", "Wall-clock steps the timer saw.", "clock_steps"),
    (
        "anarchon_clock_skew_warnings",
        "Warnings that this host's clock is off the backend's.",
        "clock_skew_warnings",
    ),
    (
        "anarchon_retries_scheduled",
        "Retries stored after a handler failed (the job's retries).",
        "retries_scheduled",
    ),
    (
        "anarchon_requests_run",
        "Run requests (triggers, retries) this instance won and ran.",
        "requests_run",
    ),
    (
        "anarchon_failure_hook_errors",
        "Calls of a job's on_failure hook that raised.",
        "failure_hook_errors",
    ),
)
# Per-job counters of JobMetrics: (metric name without _total, help, field).
_JOB_COUNTERS: Final = (
    ("anarchon_takeovers", "Runs of dead instances this instance took over.", "taken_over"),
    ("anarchon_handovers", "Runs this instance released on stop for a backup.", "handed_over"),
    ("anarchon_leases_lost", "Runs of this instance whose lease was lost.", "lease_lost"),
    (
        "anarchon_results_refused",
        "Results the backend refused because the lease had moved on.",
        "result_refused",
    ),
)
# The backend errors by kind, from the flat counters: (operation, kind, field).
_BACKEND_ERRORS: Final = (
    ("claim", "unavailable", "claim_errors"),
    ("claim", "refused", "claims_refused"),
    ("finish", "refused", "result_errors"),
)


def _client() -> Any:
    try:
        import prometheus_client.core as core
    except ImportError as exc:
        raise MissingDependency(
            f"Prometheus metrics need the prometheus-client package: {_INSTALL}"
        ) from exc
    return core


def _seconds(ms: int | None) -> float:
    """Milliseconds as seconds; NaN (Prometheus's "no value") for None."""
    return math.nan if ms is None else ms / 1000


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if math.isinf(b) else repr(b), n) for b, n in histogram.cumulative()]


class AnarchonCollector:
    """A ``prometheus_client`` collector of one scheduler's metrics, read at each scrape.

    Register it with :func:`register` (or ``registry.register(AnarchonCollector(s))``). Raises
    :class:`~anarchon.errors.MissingDependency` when ``prometheus-client`` is not installed.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self._core = _client()
        self.scheduler = scheduler

    def describe(self) -> list[Metric]:
        """The metric families without samples: lets a registry refuse duplicate names."""
        return list(self._families(None))

    def collect(self) -> Iterator[Metric]:
        """Every metric family with its samples, read from ``scheduler.metrics()`` now."""
        return self._families(self.scheduler.metrics())

    def _families(self, m: Metrics | None) -> Iterator[Metric]:
        yield from self._job_families(m)
        yield from self._instance_families(m)

    def _job_families(self, m: Metrics | None) -> Iterator[Metric]:
        core = self._core
        jobs: Sequence[tuple[str, JobMetrics]] = sorted(m.by_job.items()) if m else ()
        slots = core.CounterMetricFamily(
            "anarchon_slots",
            "Slots by outcome: ran (won and started here), missed (recorded when this instance "
            "started), skipped (skip record written here) by reason class. Summed over the "
            "instances, each equals history.",
            labels=["anarchon_job", "outcome", "reason"],
        )
        runs = core.CounterMetricFamily(
            "anarchon_runs",
            "Runs whose result this instance recorded, by status (retries and manual runs too).",
            labels=["anarchon_job", "status"],
        )
        counters = [
            (core.CounterMetricFamily(name, text, labels=["anarchon_job"]), field)
            for name, text, field in _JOB_COUNTERS
        ]
        lag = core.HistogramMetricFamily(
            "anarchon_fire_lag_seconds",
            "From a scheduled slot's time to its handler's start (first attempts; jitter "
            "included).",
            labels=["anarchon_job"],
        )
        duration = core.HistogramMetricFamily(
            "anarchon_handler_duration_seconds",
            "How long handlers ran (every attempt).",
            labels=["anarchon_job"],
        )
        gauges: list[tuple[Any, Callable[[JobMetrics], float]]] = [
            (
                core.GaugeMetricFamily(
                    "anarchon_running_runs",
                    "Runs in progress on this instance.",
                    labels=["anarchon_job"],
                ),
                lambda f: float(f.running),
            ),
            (
                core.GaugeMetricFamily(
                    "anarchon_job_last_success_timestamp_seconds",
                    "When this instance last recorded a success of the job (0: never).",
                    labels=["anarchon_job"],
                ),
                lambda f: (f.last_success_ms or 0) / 1000,
            ),
            (
                core.GaugeMetricFamily(
                    "anarchon_job_seconds_since_last_success",
                    "Seconds since this instance last recorded a success of the job, or since "
                    "it started if it has recorded none (take the min over instances).",
                    labels=["anarchon_job"],
                ),
                lambda f: _seconds(f.since_success_ms),
            ),
            (
                core.GaugeMetricFamily(
                    "anarchon_job_next_slot_timestamp_seconds",
                    "The job's next slot.",
                    labels=["anarchon_job"],
                ),
                lambda f: _seconds(f.next_slot_ms),
            ),
            (
                core.GaugeMetricFamily(
                    "anarchon_job_interval_seconds",
                    "The gap between the job's next slot and the one after it.",
                    labels=["anarchon_job"],
                ),
                lambda f: _seconds(f.interval_ms),
            ),
        ]
        for job, figures in jobs:
            for key, (outcome, reason) in SLOT_OUTCOMES.items():
                slots.add_metric([job, outcome, reason], figures.slots.get(key, 0))
            for status, count in sorted(figures.runs.items()):
                runs.add_metric([job, status], count)
            for family, field in counters:
                family.add_metric([job], getattr(figures, field))
            lag.add_metric([job], _buckets(figures.fire_lag), figures.fire_lag.sum)
            duration.add_metric(
                [job], _buckets(figures.handler_duration), figures.handler_duration.sum
            )
            for gauge, value in gauges:
                gauge.add_metric([job], value(figures))
        yield slots
        yield runs
        for family, _ in counters:
            yield family
        yield lag
        yield duration
        for gauge, _ in gauges:
            yield gauge

    def _instance_families(self, m: Metrics | None) -> Iterator[Metric]:
        core = self._core
        scheduler = self.scheduler
        backend = scheduler.backend.name
        claims = core.CounterMetricFamily(
            "anarchon_claims",
            "Claims answered: won (this instance runs), lost (another instance won).",
            labels=["result"],
        )
        errors = core.CounterMetricFamily(
            "anarchon_backend_errors",
            "Backend errors by operation and kind: unavailable (retried), refused (for good).",
            labels=["backend", "operation", "kind"],
        )
        latency = core.HistogramMetricFamily(
            "anarchon_claim_latency_seconds",
            "Latency of claim calls the backend answered (one call may carry many slots).",
            labels=["backend"],
        )
        flat = [
            (core.CounterMetricFamily(name, text), field) for name, text, field in _FLAT_COUNTERS
        ]
        gauge = core.GaugeMetricFamily
        gauges = [
            (gauge("anarchon_jobs", "Jobs this instance carries."), "jobs", 1),
            (gauge("anarchon_watched_runs", "Runs of other instances watched."), "watched", 1),
            (
                gauge("anarchon_handler_threads_busy", "Handler threads running a plain handler."),
                "handler_threads_busy",
                1,
            ),
            (
                gauge(
                    "anarchon_instances_seen",
                    "Live instances in the backend's registry at this instance's last heartbeat.",
                ),
                "instances_seen",
                1,
            ),
            (
                gauge(
                    "anarchon_clock_offset_seconds",
                    "The backend's clock minus this host's, as last measured.",
                ),
                "clock_offset_ms",
                1000,
            ),
            (
                gauge(
                    "anarchon_clock_skew_budget_seconds",
                    "How far this clock may drift from the backend's before a slot could run "
                    "twice (the tightest of the jobs; +Inf: unbounded).",
                ),
                "clock_skew_budget_ms",
                1000,
            ),
            (
                gauge("anarchon_event_loop_lag_seconds", "The event loop's lag, last measured."),
                "loop_lag_ms",
                1000,
            ),
            (
                gauge(
                    "anarchon_scheduler_start_time_seconds",
                    "When the scheduler started (0: not yet).",
                ),
                "started_ms",
                1000,
            ),
        ]
        running = gauge(
            "anarchon_scheduler_running", "1 while the scheduler runs (started, not stopping)."
        )
        info = core.InfoMetricFamily(
            "anarchon_instance", "This instance: its id, backend and anarchon's version."
        )
        if m is not None:
            from . import __version__

            claims.add_metric(["won"], m.claims_won)
            claims.add_metric(["lost"], m.claims_lost)
            for operation, kind, field in _BACKEND_ERRORS:
                errors.add_metric([backend, operation, kind], getattr(m, field))
            latency.add_metric([backend], _buckets(m.claim_latency), m.claim_latency.sum)
            for family, field in flat:
                family.add_metric([], getattr(m, field))
            for family, field, scale in gauges:
                value = getattr(m, field)
                if value is None:
                    budget = field == "clock_skew_budget_ms"
                    family.add_metric(
                        [], math.inf if budget else (0.0 if field == "started_ms" else math.nan)
                    )
                else:
                    family.add_metric([], value / scale)
            running.add_metric([], 1.0 if scheduler.running else 0.0)
            info.add_metric(
                [],
                {"instance_id": scheduler.instance_id, "backend": backend, "version": __version__},
            )
        yield claims
        yield errors
        yield latency
        for family, _ in flat:
            yield family
        for family, _, _ in gauges:
            yield family
        yield running
        yield info


_lock = threading.Lock()
_registered: dict[tuple[int, int], AnarchonCollector] = {}


def register(scheduler: Scheduler, registry: CollectorRegistry | None = None) -> AnarchonCollector:
    """Register ``scheduler``'s metrics on ``registry`` (default: ``prometheus_client``'s
    ``REGISTRY``) and return the collector; registering the same pair again returns the same
    collector. One registry holds one scheduler's metrics: a second scheduler needs a registry
    of its own (:class:`~anarchon.errors.InvalidOption` otherwise)."""
    from ._scheduler import Scheduler

    if not isinstance(scheduler, Scheduler):
        raise InvalidOption(f"scheduler={scheduler!r} must be an anarchon Scheduler")
    core = _client()
    if registry is None:
        registry = core.REGISTRY
    key = (id(registry), id(scheduler))
    with _lock:
        found = _registered.get(key)
        if found is not None:
            return found
        collector = AnarchonCollector(scheduler)
        try:
            registry.register(collector)
        except ValueError:
            raise InvalidOption(
                f"registry {registry!r} already holds anarchon metrics (of another scheduler); "
                "one registry holds one scheduler's: give each scheduler a CollectorRegistry of "
                "its own"
            ) from None
        _registered[key] = collector
        return collector


def render(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """The text exposition of ``registry`` (default ``REGISTRY``) and its content type."""
    _client()
    from prometheus_client import exposition

    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    return exposition.generate_latest(registry), exposition.CONTENT_TYPE_LATEST
