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

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ._exposition import _text
from ._families import _families, _Family, _scrape
from ._metrics import Histogram, JobMetrics
from .errors import InvalidOption, MissingDependency

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from ._scheduler import Scheduler

__all__ = ["AnarchonCollector", "Exposition", "Histogram", "JobMetrics", "register", "render"]

_INSTALL: Final = "pip install 'anarchon[prometheus]'"


def _client() -> Any:
    """``prometheus_client.core``, imported now; MissingDependency when it is not installed."""
    try:
        import prometheus_client.core as core
    except ImportError as exc:
        raise MissingDependency(
            f"Prometheus metrics need the prometheus-client package: {_INSTALL}"
        ) from exc
    return core


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
        """``family`` as a ``prometheus_client`` metric, ``jobs`` naming its per-job values."""
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
    """One render of an :class:`Exposition`, kept to serve again while young."""

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
        """A new render: the rest of the registry's exposition, then the scheduler's."""
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
