"""Prometheus metrics of a scheduler (``pip install 'anarchon[prometheus]'``, the official
``prometheus-client``, imported only when a collector is built).

Put the scheduler's metrics on the application's own registry::

    import anarchon.prometheus
    anarchon.prometheus.register(scheduler)            # prometheus_client.REGISTRY
    anarchon.prometheus.register(scheduler, registry=my_registry)

or let ``anarchon run app:scheduler --metrics-port 9464`` serve them on ``/metrics``
(:class:`Exposition`: anarchon writes its own samples there, without the client's machinery).

Every value is read from the scheduler at scrape time, so the exporter costs nothing between
scrapes. Names follow Prometheus's conventions (``anarchon_`` prefix, counters end in
``_total``, durations in ``_seconds``); labels are the job (``anarchon_job``: Prometheus gives
the label ``job`` to the scrape job, and would rename ours), and where it helps the backend,
outcome, reason class or status, never a slot or a run id. Every series of every registered job
is there from the start, at zero: 20 per job; the fire lag and handler duration histograms are
the instance's (every job together) unless ``job_histograms=True`` gives each job its own (32
more series per job). docs/metrics.md lists them all with alert rules.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from ._metrics import (
    _COUNTER_AT,
    _DURATION,
    _LAG,
    _LAST_SUCCESS,
    _RUNS_AT,
    _SLOTS_AT,
    DURATION_BUCKETS,
    LAG_BUCKETS,
    RUN_STATUSES,
    SLOT_OUTCOMES,
    Histogram,
    JobMetrics,
    JobRow,
    Metrics,
)
from .errors import InvalidOption, MissingDependency

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from ._scheduler import Scheduler

__all__ = ["AnarchonCollector", "Exposition", "Histogram", "JobMetrics", "register", "render"]

_INSTALL: Final = "pip install 'anarchon[prometheus]'"

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


def _client() -> Any:
    try:
        import prometheus_client.core as core
    except ImportError as exc:
        raise MissingDependency(
            f"Prometheus metrics need the prometheus-client package: {_INSTALL}"
        ) from exc
    return core


# -- the families, as data ---------------------------------------------------------------------

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
    def one(kind: Kind, name: str, help: str, columns: list[tuple[str, Labels, float]]) -> _Family:
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


def _scrape(scheduler: Scheduler) -> tuple[Metrics, Sequence[JobRow]]:
    """What one scrape reads: the instance's snapshot (without per-job figures) and each
    job's row."""
    seen = scheduler.observe(jobs=True)
    # The raw rows: a JobMetrics made per job would cost 82 ms a scrape of 10 000 jobs, not 10.
    return seen.metrics, seen._rows


# -- the text exposition, written here -----------------------------------------------------------


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    """A sample's value as the text format writes it: whole numbers without a fraction."""
    if type(value) is int:
        return str(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class _Numbers(dict[float, str]):
    """Values to their text, each written once per render (most counts are 0 or repeat)."""

    def __missing__(self, value: float) -> str:
        text = self[value] = _number(value)
        return text


def _labels(pairs: Labels) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)


def _text(families: Sequence[_Family], jobs: Sequence[str]) -> str:
    """The text format (0.0.4) of ``families``, ``jobs`` naming the per-job values."""
    job_labels = [f'anarchon_job="{_escape(name)}"' for name in jobs]
    numbers = _Numbers()
    parts: list[str] = []
    add = parts.append
    for family in families:
        exposed = family.name + ("_total" if family.kind == "counter" else "")
        if family.kind == "info":
            exposed, kind = family.name + "_info", "gauge"
        else:
            kind = family.kind
        help = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        add(f"# HELP {exposed} {help}\n# TYPE {exposed} {kind}\n")
        if family.per_job and family.kind == "histogram":
            # A histogram's series stay together, job after job.
            heads = [
                (f"{family.name}{suffix}{{", ("," + _labels(labels) if labels else "") + "} ")
                for suffix, labels, _ in family.columns
            ]
            written = [[numbers[v] for v in values] for _, _, values in family.columns]
            for n, job in enumerate(job_labels):
                for (head, tail), texts in zip(heads, written, strict=True):
                    add(f"{head}{job}{tail}{texts[n]}\n")
        elif family.per_job:
            for suffix, labels, column in family.columns:
                rest = "," + _labels(labels) if labels else ""
                head = f"{family.name}{suffix}{{"
                tail = rest + "} "
                parts.extend(
                    [
                        f"{head}{job}{tail}{numbers[v]}\n"
                        for job, v in zip(job_labels, column, strict=True)
                    ]
                )
        else:
            for suffix, labels, column in family.columns:
                inner = f"{{{_labels(labels)}}}" if labels else ""
                add(f"{family.name}{suffix}{inner} {_number(column[0])}\n")
    return "".join(parts)


# -- prometheus_client's side --------------------------------------------------------------------


class AnarchonCollector:
    """A ``prometheus_client`` collector of one scheduler's metrics, read at each scrape.

    Register it with :func:`register` (or ``registry.register(AnarchonCollector(s))``).
    ``job_histograms=True`` gives each job its own fire lag and handler duration histograms
    (32 more series per job) instead of the instance's. Raises
    :class:`~anarchon.errors.MissingDependency` when ``prometheus-client`` is not installed.
    """

    def __init__(self, scheduler: Scheduler, *, job_histograms: bool = False) -> None:
        if not isinstance(job_histograms, bool):
            raise InvalidOption(f"job_histograms={job_histograms!r} must be True or False")
        self._core = _client()
        self.scheduler = scheduler
        self.job_histograms = job_histograms
        self._muted = threading.local()

    def describe(self) -> list[Metric]:
        """The metric families without samples: lets a registry refuse duplicate names."""
        families = _families(self.scheduler, None, [], self.job_histograms)
        return [self._metric(family, []) for family in families]

    def collect(self) -> Iterator[Metric]:
        """Every metric family with its samples, read from the scheduler now (nothing on a
        thread where an :class:`Exposition` writes them itself)."""
        if getattr(self._muted, "on", False):
            return iter(())
        m, rows = _scrape(self.scheduler)
        jobs = [row.name for row in rows]
        families = _families(self.scheduler, m, rows, self.job_histograms)
        return iter([self._metric(family, jobs) for family in families])

    def _metric(self, family: _Family, jobs: Sequence[str]) -> Metric:
        metric: Metric = self._core.Metric(family.name, family.help, family.kind)
        add = metric.add_sample
        for suffix, labels, values in family.columns:
            sample = family.name + suffix
            if family.per_job:
                for job, value in zip(jobs, values, strict=True):
                    add(sample, {"anarchon_job": job, **dict(labels)}, value)
            else:
                add(sample, dict(labels), values[0])
        return metric


_lock = threading.Lock()
# Each registry (held weakly: a registry dropped takes its entry with it) to the anarchon
# collector registered on it by register().
_registered: weakref.WeakKeyDictionary[CollectorRegistry, AnarchonCollector] = (
    weakref.WeakKeyDictionary()
)


def register(
    scheduler: Scheduler,
    registry: CollectorRegistry | None = None,
    *,
    job_histograms: bool = False,
) -> AnarchonCollector:
    """Register ``scheduler``'s metrics on ``registry`` (default: ``prometheus_client``'s
    ``REGISTRY``) and return the collector; registering the same pair again returns the same
    collector. One registry holds one scheduler's metrics: a second scheduler needs a registry
    of its own (:class:`~anarchon.errors.InvalidOption` otherwise). ``job_histograms``: see
    :class:`AnarchonCollector`."""
    from ._scheduler import Scheduler

    if not isinstance(scheduler, Scheduler):
        raise InvalidOption(f"scheduler={scheduler!r} must be an anarchon Scheduler")
    core = _client()
    if registry is None:
        registry = core.REGISTRY
    with _lock:
        found = _registered.get(registry)
        if found is not None and found.scheduler is scheduler:
            if found.job_histograms != job_histograms:
                raise InvalidOption(
                    f"job_histograms={job_histograms!r}: this scheduler's metrics are already "
                    f"on {registry!r} with job_histograms={found.job_histograms!r}; register "
                    "them once, with one setting"
                )
            return found
        collector = AnarchonCollector(scheduler, job_histograms=job_histograms)
        try:
            registry.register(collector)
        except ValueError:
            raise InvalidOption(
                f"registry {registry!r} already holds anarchon metrics (of another scheduler); "
                "one registry holds one scheduler's: give each scheduler a CollectorRegistry of "
                "its own"
            ) from None
        _registered[registry] = collector
        return collector


def render(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """The text exposition of ``registry`` (default ``REGISTRY``) and its content type, written
    by ``prometheus_client`` (see :class:`Exposition` for the faster one)."""
    _client()
    from prometheus_client import exposition

    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    return exposition.generate_latest(registry), exposition.CONTENT_TYPE_LATEST


# -- the exposition anarchon writes --------------------------------------------------------------

REUSE_FACTOR: Final = 10
"""A render is served again while younger than this many times what it took to make ..."""
REUSE_MAX_S: Final = 5.0
"""... and at most this long (s)."""


@dataclass(frozen=True, slots=True)
class _Rendered:
    body: bytes
    began: float  # time.monotonic() when the render began
    took: float  # s
    state: str  # the scheduler's state (Scheduler.state) it was made in


class Exposition:
    """The ``/metrics`` answer of ``anarchon run --metrics-port``: the text exposition of one
    scheduler's metrics, which anarchon writes itself (some 20 times faster than
    ``prometheus_client``'s machinery), followed by what the rest of ``registry`` (default
    ``REGISTRY``: the process's ``process_*`` and ``python_*`` metrics, the application's
    own) holds, written by ``prometheus_client``.

    The scheduler's metrics are registered on ``registry`` (:func:`register`, with
    ``job_histograms``) so that its other users see them too. One render at a time: scrapes
    that arrive while one is made wait for it and share it; a render is served again while it
    is younger than ``REUSE_FACTOR`` times what it took (at most ``REUSE_MAX_S``), never
    once the scheduler has started or stopped since. So scrapes cost the scheduler at most
    about a tenth of a core, however many and however often.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: CollectorRegistry | None = None,
        *,
        job_histograms: bool = False,
    ) -> None:
        core = _client()
        self.registry: CollectorRegistry = core.REGISTRY if registry is None else registry
        self.collector = register(scheduler, self.registry, job_histograms=job_histograms)
        self.scheduler = scheduler
        self._lock = threading.Lock()
        self._last: _Rendered | None = None
        from prometheus_client import exposition

        self._generate = exposition.generate_latest
        self.content_type: str = getattr(
            exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST
        )
        """The content type of :meth:`render`'s body."""

    def render(self) -> bytes:
        """The exposition now (or as of a render at most a few moments old, see above)."""
        with self._lock:
            last = self._last
            state = self.scheduler.state
            if last is not None and last.state == state:
                age = time.monotonic() - last.began
                if age <= min(REUSE_MAX_S, REUSE_FACTOR * last.took):
                    return last.body
            began = time.monotonic()
            body = self._render()
            self._last = _Rendered(body, began, time.monotonic() - began, state)
            return body

    def _render(self) -> bytes:
        collector = self.collector
        m, rows = _scrape(self.scheduler)
        ours = _text(
            _families(self.scheduler, m, rows, collector.job_histograms), [row.name for row in rows]
        )
        collector._muted.on = True
        try:
            others = self._generate(self.registry)
        finally:
            collector._muted.on = False
        return others + ours.encode()
