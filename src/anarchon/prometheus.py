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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

from ._metrics import SLOT_OUTCOMES, Histogram, JobMetrics, Metrics
from .errors import InvalidOption, MissingDependency

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from ._scheduler import Scheduler

__all__ = ["AnarchonCollector", "Histogram", "JobMetrics", "register", "render"]

_INSTALL: Final = "pip install 'anarchon[prometheus]'"

S = TypeVar("S", JobMetrics, Metrics)


@dataclass(frozen=True, slots=True)
class _Series(Generic[S]):
    """One metric family whose single value per label set is one figure of a snapshot: of a
    job's :class:`JobMetrics` (labelled ``anarchon_job``) or of the instance's :class:`Metrics`
    (no labels)."""

    kind: Literal["counter", "gauge", "histogram"]
    name: str
    """The family's name (a counter's without ``_total``: the client adds it)."""
    help: str
    read: Callable[[S], float | Histogram]
    """The figure, from the snapshot."""


def _seconds(ms: int | None) -> float:
    """Milliseconds as seconds; NaN (Prometheus's "no value") for None."""
    return math.nan if ms is None else ms / 1000


def _count(n: int | None) -> float:
    """A count as a sample; NaN for None (not measured yet)."""
    return math.nan if n is None else float(n)


# Per job, after the slots and runs by outcome, in this order.
_JOB_SERIES: Final[tuple[_Series[JobMetrics], ...]] = (
    _Series(
        "counter",
        "anarchon_takeovers",
        "Runs of dead instances this instance took over.",
        lambda f: f.taken_over,
    ),
    _Series(
        "counter",
        "anarchon_handovers",
        "Runs this instance released on stop for a backup.",
        lambda f: f.handed_over,
    ),
    _Series(
        "counter",
        "anarchon_leases_lost",
        "Runs of this instance whose lease was lost.",
        lambda f: f.lease_lost,
    ),
    _Series(
        "counter",
        "anarchon_results_refused",
        "Results the backend refused because the lease had moved on.",
        lambda f: f.result_refused,
    ),
    _Series(
        "histogram",
        "anarchon_fire_lag_seconds",
        "From a scheduled slot's time to its handler's start (first attempts; jitter included).",
        lambda f: f.fire_lag,
    ),
    _Series(
        "histogram",
        "anarchon_handler_duration_seconds",
        "How long handlers ran (every attempt).",
        lambda f: f.handler_duration,
    ),
    _Series(
        "gauge",
        "anarchon_running_runs",
        "Runs in progress on this instance.",
        lambda f: float(f.running),
    ),
    _Series(
        "gauge",
        "anarchon_job_last_success_timestamp_seconds",
        "When this instance last recorded a success of the job (0: never).",
        lambda f: (f.last_success_ms or 0) / 1000,
    ),
    _Series(
        "gauge",
        "anarchon_job_seconds_since_last_success",
        "Seconds since this instance last recorded a success of the job, or since it started "
        "if it has recorded none (take the min over instances).",
        lambda f: _seconds(f.since_success_ms),
    ),
    _Series(
        "gauge",
        "anarchon_job_next_slot_timestamp_seconds",
        "The job's next slot.",
        lambda f: _seconds(f.next_slot_ms),
    ),
    _Series(
        "gauge",
        "anarchon_job_interval_seconds",
        "The gap between the job's next slot and the one after it.",
        lambda f: _seconds(f.interval_ms),
    ),
)
# Of the instance, after the claims, backend errors and claim latency, in this order.
_INSTANCE_SERIES: Final[tuple[_Series[Metrics], ...]] = (
    _Series(
        "counter",
        "anarchon_slots_without_thread",
        "Slots of plain handlers not claimed because every handler thread was busy.",
        lambda m: m.no_thread,
    ),
    _Series(
        "counter",
        "anarchon_slots_deferred_early",
        "Slots due by this host's clock but early by the backend's, put back to wait.",
        lambda m: m.early_slots_deferred,
    ),
    _Series(
        "counter",
        "anarchon_threads_timed_out",
        "Plain handlers whose thread was still running at their timeout.",
        lambda m: m.timed_out_threads,
    ),
    _Series(
        "counter",
        "anarchon_cancellations_ignored",
        "Async handlers that ignored their cancellation on stop.",
        lambda m: m.cancel_ignored,
    ),
    _Series(
        "counter",
        "anarchon_clock_steps",
        "Wall-clock steps the timer saw.",
        lambda m: m.clock_steps,
    ),
    _Series(
        "counter",
        "anarchon_clock_skew_warnings",
        "Warnings that this host's clock is off the backend's.",
        lambda m: m.clock_skew_warnings,
    ),
    _Series(
        "counter",
        "anarchon_retries_scheduled",
        "Retries stored after a handler failed (the job's retries).",
        lambda m: m.retries_scheduled,
    ),
    _Series(
        "counter",
        "anarchon_requests_run",
        "Run requests (triggers, retries) this instance won and ran.",
        lambda m: m.requests_run,
    ),
    _Series(
        "counter",
        "anarchon_failure_hook_errors",
        "Calls of a job's on_failure hook that raised.",
        lambda m: m.failure_hook_errors,
    ),
    _Series("gauge", "anarchon_jobs", "Jobs this instance carries.", lambda m: float(m.jobs)),
    _Series(
        "gauge",
        "anarchon_watched_runs",
        "Runs of other instances watched.",
        lambda m: float(m.watched),
    ),
    _Series(
        "gauge",
        "anarchon_handler_threads_busy",
        "Handler threads running a plain handler.",
        lambda m: float(m.handler_threads_busy),
    ),
    _Series(
        "gauge",
        "anarchon_instances_seen",
        "Live instances in the backend's registry at this instance's last heartbeat.",
        lambda m: _count(m.instances_seen),
    ),
    _Series(
        "gauge",
        "anarchon_clock_offset_seconds",
        "The backend's clock minus this host's, as last measured.",
        lambda m: _seconds(m.clock_offset_ms),
    ),
    _Series(
        "gauge",
        "anarchon_clock_skew_budget_seconds",
        "How far this clock may drift from the backend's before a slot could run twice (the "
        "tightest of the jobs; +Inf: unbounded).",
        lambda m: math.inf if m.clock_skew_budget_ms is None else m.clock_skew_budget_ms / 1000,
    ),
    _Series(
        "gauge",
        "anarchon_event_loop_lag_seconds",
        "The event loop's lag, last measured.",
        lambda m: _seconds(m.loop_lag_ms),
    ),
    _Series(
        "gauge",
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


def _client() -> Any:
    try:
        import prometheus_client.core as core
    except ImportError as exc:
        raise MissingDependency(
            f"Prometheus metrics need the prometheus-client package: {_INSTALL}"
        ) from exc
    return core


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if math.isinf(b) else repr(b), n) for b, n in histogram.cumulative()]


class _Families(Generic[S]):
    """The families of a table of :class:`_Series`, built once per scrape and filled with the
    figures of each snapshot under its labels."""

    def __init__(self, core: Any, table: Sequence[_Series[S]], labels: list[str]) -> None:
        make = {
            "counter": core.CounterMetricFamily,
            "gauge": core.GaugeMetricFamily,
            "histogram": core.HistogramMetricFamily,
        }
        self._filled: list[tuple[Any, Callable[[S], float | Histogram]]] = [
            (make[s.kind](s.name, s.help, labels=labels), s.read) for s in table
        ]

    def add(self, labels: list[str], snapshot: S) -> None:
        """Add the figures of ``snapshot`` under ``labels``."""
        for family, read in self._filled:
            value = read(snapshot)
            if isinstance(value, Histogram):
                family.add_metric(labels, _buckets(value), value.sum)
            else:
                family.add_metric(labels, value)

    def __iter__(self) -> Iterator[Metric]:
        return (family for family, _ in self._filled)


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
            "started), skipped (skip record written here) by reason class; summed over the "
            "instances, each equals history. unclaimed: not claimed here, nothing recorded "
            "(error: the backend unavailable until too late; refused).",
            labels=["anarchon_job", "outcome", "reason"],
        )
        runs = core.CounterMetricFamily(
            "anarchon_runs",
            "Attempts whose end this instance recorded, by status (its results, the attempts "
            "its takeovers ended failed; skipped: run requests); summed, each equals history.",
            labels=["anarchon_job", "status"],
        )
        figures = _Families(core, _JOB_SERIES, ["anarchon_job"])
        for job, of_job in jobs:
            for key, (outcome, reason) in SLOT_OUTCOMES.items():
                slots.add_metric([job, outcome, reason], of_job.slots.get(key, 0))
            for status, count in sorted(of_job.runs.items()):
                runs.add_metric([job, status], count)
            figures.add([job], of_job)
        yield slots
        yield runs
        yield from figures

    def _instance_families(self, m: Metrics | None) -> Iterator[Metric]:
        core = self._core
        scheduler = self.scheduler
        backend = scheduler.backend.name
        claims = core.CounterMetricFamily(
            "anarchon_claims",
            "Claims answered: won (this instance runs), lost (another instance won).",
            labels=["result"],
        )
        ranks = core.CounterMetricFamily(
            "anarchon_claim_ranks",
            "Slots by how this instance came to claim them: preferred (ranked first, at once), "
            "backup (after its rank delay), unranked (random jitter), heard (not claimed: "
            "another instance's win was heard first).",
            labels=["rank"],
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
        figures = _Families(core, _INSTANCE_SERIES, [])
        running = core.GaugeMetricFamily(
            "anarchon_scheduler_running", "1 while the scheduler runs (started, not stopping)."
        )
        info = core.InfoMetricFamily(
            "anarchon_instance", "This instance: its id, backend and anarchon's version."
        )
        if m is not None:
            from . import __version__

            claims.add_metric(["won"], m.claims_won)
            claims.add_metric(["lost"], m.claims_lost)
            for name in ("preferred", "backup", "unranked", "heard"):
                ranks.add_metric([name], getattr(m, f"claims_{name}"))
            for operation, kind, field in _BACKEND_ERRORS:
                errors.add_metric([backend, operation, kind], getattr(m, field))
            latency.add_metric([backend], _buckets(m.claim_latency), m.claim_latency.sum)
            figures.add([], m)
            running.add_metric([], 1.0 if scheduler.running else 0.0)
            info.add_metric(
                [],
                {"instance_id": scheduler.instance_id, "backend": backend, "version": __version__},
            )
        yield claims
        yield ranks
        yield errors
        yield latency
        yield from figures
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
