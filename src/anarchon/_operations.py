"""The operator's side of the :class:`~anarchon.Scheduler`: what it answers and what it is told.

Queries (history, last run), manual runs, steering (pause, resume and trigger:
:mod:`anarchon.steering`), the cluster's picture, metrics and health. None of it fires a slot:
``_scheduler`` reads as a slot's life, and these sit beside it as :class:`Operations`, a mixin of
:class:`~anarchon.Scheduler` that declares the scheduler's attributes it reads.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, cast

from . import steering
from ._active import ActiveRun
from ._clock import Clock
from ._heartbeat import read_cluster
from ._job import Job, check_name
from ._metrics import Counters, JobRow, Metrics, NextSlots, job_rows, jobs_now
from ._models import Run, Trigger
from ._observation import Observation
from ._options import HISTORY_LIMIT, check_int
from ._services import Services
from .backend import Backend, ClaimStatus
from .control import ALL_JOBS, Pause, RunRequest
from .errors import (
    BackendUnavailable,
    InvalidOption,
    JobNotFound,
    SchedulerStateError,
    UnsupportedFeature,
)
from .health import DEFAULT_TIMEOUT_S, Health, check
from .registry import ClusterView

# The names of Operations' annotations are imported at run time (above), where
# typing.get_type_hints(Scheduler) looks them up; Scheduler itself would be an import cycle.
if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["Operations", "State"]

MANUAL_CLAIM_TIMEOUT_S: Final = 10.0


class State(Enum):
    """Where a scheduler is in its life; the operations need it running."""

    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _until_ms(until: datetime | None) -> int | None:
    if until is None:
        return None
    if not isinstance(until, datetime) or until.tzinfo is None:
        raise InvalidOption(
            f"until={until!r} must be an aware datetime (with a time zone, e.g. "
            "datetime.now(timezone.utc) + timedelta(hours=1)) or None"
        )
    return round(until.timestamp() * 1000)


# What a scheduler no longer running did: "this one {...}".
ENDED: Final = {State.STOPPING: "is stopping (stop() was called)", State.STOPPED: "has stopped"}


class Operations:
    """The scheduler's queries, steering, metrics and health (a mixin of ``Scheduler``)."""

    # What they read of the scheduler (set by Scheduler.__init__ and start()).
    backend: Backend
    max_workers: int
    _state: State
    _jobs: dict[str, Job]
    _clock: Clock
    _counters: Counters
    _services: Services
    _started_ms: int | None
    _next_slots: NextSlots

    # -- queries ----------------------------------------------------------------------------

    def _require_started(self, call: str) -> None:
        """Raise :class:`SchedulerStateError` unless the scheduler runs, saying what ``call``
        (``"history"``) needs and what can be done in the scheduler's state."""
        state = self._state
        if state is State.RUNNING:
            return
        if state is State.NEW:
            raise SchedulerStateError(
                f"{call}() needs a running scheduler and this one is not started yet; call "
                "'await scheduler.start()' (or use 'async with scheduler') first"
            )
        ended = ENDED.get(state, f"is {state.value}")
        raise SchedulerStateError(
            f"{call}() needs a running scheduler and this one {ended}; a scheduler "
            f"starts only once, so make a new Scheduler (and start it) to call {call}() again"
        )

    def _require_job(self, name: str) -> Job:
        job = self._jobs.get(name)
        if job is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")
        return job

    async def history(self, name: str, limit: int = 100) -> list[Run]:
        """Runs of job ``name``, newest first, at most ``limit`` (0 to 100 000); works for any
        job the backend has records of. A name no job can have raises
        :class:`~anarchon.errors.InvalidJobName` on every backend, a bad ``limit``
        :class:`~anarchon.errors.InvalidOption`."""
        self._require_started("history")
        check_name(name)
        limit = check_int("limit", limit, HISTORY_LIMIT, "Scheduler.history")
        return await self.backend.history(name, limit)

    async def last_run(self, name: str) -> Run | None:
        """The newest run of job ``name``, or None; a name no job can have raises
        :class:`~anarchon.errors.InvalidJobName` on every backend."""
        self._require_started("last_run")
        check_name(name)
        return await self.backend.last_run(name)

    async def run_now(self, name: str) -> Run:
        """Run job ``name`` now on this instance (trigger ``manual``) and return the finished run.

        The run is claimed like a slot of its own, so it gets a fence and, on lease backends,
        respects ``overlap='skip'``: if the previous run still holds its lease the manual run is
        recorded ``skipped`` and returned as such. A plain handler needs a free thread: if none
        frees up within 10 s, :class:`~anarchon.errors.SchedulerStateError` is raised.
        """
        self._require_started("run_now")
        job = self._require_job(name)
        claims = self._services.claims
        reserved = False
        if not job.is_async:
            reserved = await claims.reserve_thread(MANUAL_CLAIM_TIMEOUT_S)
            if not reserved:
                raise SchedulerStateError(
                    f"job {name!r} has a plain handler and every handler thread is busy "
                    f"(max_workers={self.max_workers}); try again later or raise max_workers"
                )
        request = claims.request(job, None, Trigger.MANUAL)
        try:
            claimed = await claims.claim([request], deadline_s=MANUAL_CLAIM_TIMEOUT_S)
            if not claimed:
                raise BackendUnavailable(
                    f"could not claim a manual run of {name!r}: {self.backend.name} is unavailable"
                )
            _, outcome, sent = claimed[0]
            if isinstance(outcome, Exception):
                raise outcome
            if outcome.status is not ClaimStatus.WON:
                return outcome.run
            assert outcome.ticket is not None
            active = self._services.executor.start(
                job, outcome.ticket, reserved=reserved, sent_ms=sent
            )
            reserved = False
        finally:
            if reserved:
                self._services.threads.unreserve()
        run = await active.result
        if run is not None:
            return run
        for recorded in await self.backend.history(name, limit=100):
            if recorded.run_id == request.run_id:
                return recorded
        return outcome.run

    # -- steering (anarchon.steering) ---------------------------------------------------------

    async def pause(
        self, job: str, *, until: datetime | None = None, by: str | None = None
    ) -> Pause:
        """Pause ``job`` on every instance (it need not be registered here) until :meth:`resume`
        or ``until`` (an aware datetime in the future, at most ten years ahead); return the
        stored pause. Each instance records the job's slots ``skipped`` (``paused by <by>``)
        instead of running them; runs already running go on, and manual runs (:meth:`trigger`,
        :meth:`run_now`) still run. ``by`` defaults to ``user@host``; given, it is a non-empty,
        printable string of at most 256 characters (:func:`anarchon.steering.check_by`)."""
        self._require_started("pause")
        until_ms = _until_ms(until)
        return await steering.pause(self.backend, job, until_ms=until_ms, by=by)

    async def pause_all(self, *, until: datetime | None = None, by: str | None = None) -> Pause:
        """Pause every job of the cluster (:data:`~anarchon.control.ALL_JOBS`); see
        :meth:`pause`. A job's own pause outlives :meth:`resume_all`."""
        self._require_started("pause_all")
        return await steering.pause(self.backend, ALL_JOBS, until_ms=_until_ms(until), by=by)

    async def resume(self, job: str) -> bool:
        """End the pause of ``job`` on every instance; False if it was not paused (or its pause
        had already ended by itself)."""
        self._require_started("resume")
        return await self._resume(job)

    async def resume_all(self) -> bool:
        """End the whole-cluster pause (:meth:`pause_all`); jobs paused on their own stay
        paused. False if the cluster was not paused."""
        self._require_started("resume_all")
        return await self._resume(ALL_JOBS)

    async def _resume(self, job: str) -> bool:
        return await steering.resume(self.backend, job) is not None

    async def paused(self) -> list[Pause]:
        """The pauses that hold now (by job name; ``"*"`` is the whole-cluster one)."""
        self._require_started("paused")
        return await steering.pauses(self.backend)

    async def trigger(self, job: str, *, by: str | None = None) -> RunRequest:
        """Ask the cluster to run ``job`` once now; return the stored request. It needs no
        handler here: an instance that carries the job claims it within about a second
        (``control_poll_ms``) and exactly one runs it, with trigger ``manual``, the request's
        id as run id and ``by`` (default ``user@host``) as ``requested_by``. Unlike
        :meth:`run_now`, it does not wait for the run."""
        self._require_started("trigger")
        return await steering.trigger(self.backend, job, by=by)

    async def cluster(self) -> ClusterView:
        """Read the backend's registry: every live instance, the jobs each carries, and the jobs
        whose definitions differ between instances (:mod:`anarchon.registry`)."""
        self._require_started("cluster")
        beat = self._services.heartbeat
        if beat is None:
            raise UnsupportedFeature(f"the {self.backend.name} backend keeps no registry")
        return await read_cluster(beat.store, beat.backend_now_ms())

    def _job_rows(self) -> list[JobRow]:
        """Each registered job's figures as a scrape reads them (any thread)."""
        running = [a.job.name for a in list(self._services.executor.active.values())]
        return job_rows(
            self._counters,
            list(self._jobs.values()),
            running,
            self._clock.now_ms(),
            self._started_ms,
            self._next_slots,
        )

    def _snapshot(self, by_job: dict[str, Any]) -> Metrics:
        """:meth:`metrics` with ``by_job`` as given (any thread: a scrape calls it)."""
        jobs = list(self._jobs.values())
        budgets = [b for j in jobs if (b := self.backend.skew_budget_ms(j.policy)) is not None]
        services = self._services
        watchdog, beat, watcher = services.watchdog, services.heartbeat, services.watcher
        pending = self._counters.pending_requests
        return Metrics.of(
            self._counters,
            by_job=by_job,
            instances_seen=beat.instances_seen if beat else None,
            clock_skew_budget_ms=min(budgets) if budgets else None,
            started_ms=self._started_ms,
            jobs=len(jobs),
            running=len(services.executor.active),
            watched=len(watcher) if watcher is not None else 0,
            handler_threads_busy=len(services.threads.busy()),
            clock_offset_ms=services.backend_clock.offset_ms,
            loop_lag_ms=watchdog.lag_ms if watchdog is not None else None,
            loop_lag_max_ms=watchdog.max_lag_ms if watchdog is not None else None,
            loop_blocked_ms=watchdog.blocked_ms if watchdog is not None else None,
            requests_pending=None if pending is None else sum(pending.values()),
            pending_requests={} if pending is None else dict(pending),
        )

    def observe(self, *, jobs: bool = False) -> Observation:
        """What this scheduler shows of itself now (:class:`~anarchon.Observation`): its life
        state as :attr:`running` sees it, its loops, what blocks its event loop, its leases and
        heartbeat, and its :meth:`metrics` without the per-job figures; with ``jobs``, each
        job's figures too (a walk of every job). Safe from any thread: health probes and
        metrics scrapes read it while the event loop may be blocked."""
        services = self._services
        watchdog, host, beat = services.watchdog, services.keeper_thread, services.heartbeat
        loops = {t.get_name().removeprefix("anarchon "): not t.done() for t in services.loops.tasks}
        if host is not None:
            loops["keeper thread"] = host.alive
        age = None
        if beat is not None and beat.last_beat_ms is not None:
            age = max(0, self._clock.monotonic_ms() - beat.last_beat_ms)
        rows = tuple(self._job_rows()) if jobs else ()
        return Observation(
            state=self._state.value,
            loops=loops,
            blocked_by=watchdog.blocker if watchdog is not None else None,
            leases_held=sum(1 for a in self._active() if a.ticket.lease_expires_at_ms is not None),
            heartbeat_age_ms=age,
            shared_with=None if beat is None else beat.shared_with,
            event_loop=services.loop,
            metrics=self._snapshot({}),
            _rows=rows,
        )

    def _active(self) -> list[ActiveRun]:
        """The runs of this instance now, copied (from any thread: the dict may change while
        it is copied)."""
        for _ in range(3):
            try:
                return list(self._services.executor.active.values())
            except RuntimeError:
                continue
        return []

    def metrics(self) -> Metrics:
        """Counters since start (claims won and lost, runs by status, skips, takeovers, slots not
        claimed for want of a thread ...), jobs, running and watched runs, busy handler threads,
        the last measured clock offset from the backend, and the event loop's lag (ms, as the
        watchdog measured it; None without the scheduler's thread). Each field is described in
        :class:`~anarchon.Metrics`; ``metrics()["claims_won"]`` reads it by name too."""
        return self._snapshot(jobs_now(self._job_rows()))

    async def health(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> Health:
        """Is this scheduler well (:class:`~anarchon.health.Health`)? Asks the backend its
        clock (waiting up to ``timeout_s``, above 0 and at most 3600) and looks at the loops,
        the event loop's lag, the clock offset against the jobs' skew budget, the leases held
        and the last heartbeat."""
        return await check(cast("Scheduler", self), timeout_s)
