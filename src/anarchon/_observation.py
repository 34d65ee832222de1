"""What a scheduler shows of itself at one moment (:meth:`Scheduler.observe
<anarchon.Scheduler.observe>`): one read, from any thread, for what judges it from outside (its
health, a metrics scrape) so that none of them reads the scheduler's private attributes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from ._metrics import JobMetrics, JobRow, Metrics, jobs_now

__all__ = ["Observation", "ObservedState"]

ObservedState: TypeAlias = Literal["new", "running", "stopping", "stopped"]
"""Where a scheduler is in its life as :meth:`Scheduler.observe <anarchon.Scheduler.observe>`
reads it (:attr:`Observation.state`): :attr:`Scheduler.state <anarchon.Scheduler.state>`
without ``"starting"``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """A scheduler at one moment, as :meth:`Scheduler.observe <anarchon.Scheduler.observe>`
    read it (from any thread: the HTTP server's ``/healthz`` and ``/metrics`` read it while the
    event loop may be blocked). Times are milliseconds; None where not measured."""

    state: ObservedState
    """``"new"``, ``"running"``, ``"stopping"`` or ``"stopped"``. Unlike
    :attr:`Scheduler.state <anarchon.Scheduler.state>`, a start is ``"running"`` from the moment
    its services run (while it catches up missed slots too), as :attr:`Scheduler.running
    <anarchon.Scheduler.running>` is: a slow catch-up is not a scheduler that is down."""
    loops: Mapping[str, bool] = field(default_factory=dict)
    """Each of the scheduler's loops (timer, clock, watcher, run requests, heartbeat, lease
    keeper) and the lease keeper's thread when it has one: alive or not. Empty before start."""
    blocked_by: str | None = None
    """What blocks the event loop (the job and its handler), as the watchdog logged it."""
    leases_held: int = 0
    """Runs of this instance holding a lease now."""
    heartbeat_age_ms: int | None = None
    """Since this instance last recorded itself in the registry (None: never, or no registry)."""
    shared_with: str | None = None
    """Another process that records itself under this instance id (its host and pid), as the
    registry told; None when none does."""
    event_loop: asyncio.AbstractEventLoop | None = None
    """The event loop the scheduler runs on (None before its start)."""
    metrics: Metrics
    """The instance's counters and gauges (:meth:`Scheduler.metrics
    <anarchon.Scheduler.metrics>`) without the per-job figures (``by_job`` empty)."""
    _rows: tuple[JobRow, ...] = field(default=(), repr=False)
    # Each job's figures as the Prometheus scrape reads them (raw: no JobMetrics made), when
    # observed with jobs=True; :attr:`jobs` makes them public.

    @property
    def jobs(self) -> dict[str, JobMetrics]:
        """Each registered job's figures by job name, as :attr:`Metrics.by_job
        <anarchon.Metrics.by_job>` gives them, when asked (``observe(jobs=True)``: it costs a
        walk of every job); else empty. Made on each read."""
        return jobs_now(self._rows)
