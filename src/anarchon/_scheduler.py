"""The scheduler: registers jobs, fires their slots, claims through the backend, runs winners."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from enum import Enum
from types import TracebackType
from typing import Any, Final, TypeVar

from ._catchup import missed_slots
from ._clock import Clock, SystemClock
from ._job import Handler, Job, JobOptions, Timezone, build_job
from ._models import CatchUp, Overlap, Run, RunStatus, Trigger
from ._retry import backoff
from ._runner import ActiveRun, RunExecutor
from ._timer import Due, SlotTimer
from ._watcher import BackupWatcher
from .backend import Backend, ClaimOutcome, ClaimRequest, ClaimStatus, LeaseBackend, Ticket
from .errors import (
    BackendUnavailable,
    DuplicateJob,
    InvalidOption,
    JobNotFound,
    SchedulerStateError,
)

__all__ = ["Scheduler"]

logger = logging.getLogger("anarchon.scheduler")

H = TypeVar("H", bound=Handler)

DEFAULT_GRACE_MS: Final = 30_000
SKEW_CHECK_S: Final = 60.0
MANUAL_CLAIM_TIMEOUT_S: Final = 10.0
CATCH_UP_POLL_S: Final = 0.25


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


async def _cancel_and_wait(tasks: list[asyncio.Future[Any]], limit_s: float = 5.0) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again while any is left: a library that
    swallows a cancellation (some drivers' timeouts do) must not make stop() hang."""
    deadline = time.monotonic() + limit_s
    pending = {t for t in tasks if not t.done()}
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.25)
    if pending:
        logger.warning("%d internal task(s) did not stop", len(pending), extra={"action": "stop"})


def _new_id() -> str:
    """A random 128-bit id in hex, for run ids and tokens."""
    return os.urandom(16).hex()


def default_instance_id() -> str:
    """``<hostname>-<pid>-<4 hex>``: unique per process, readable in history."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class Scheduler:
    """Runs cron jobs so that each slot of each job runs on exactly one instance.

    Every instance of the application creates the same scheduler with the same jobs; the backend
    decides who runs each slot. With no backend, a :class:`~anarchon.SQLiteBackend` on
    ``anarchon.db`` in the working directory (``ANARCHON_DB`` overrides the path) serves several
    processes on one host.

    :param backend: where claims, leases and history live.
    :param instance_id: this instance's name in history and logs (default host-pid-random).
    :param grace_ms: on :meth:`stop`, how long running handlers may finish before they are
        cancelled and, on lease backends, handed over to a backup.
    :param clock: the wall clock (tests pass :class:`anarchon.testing.FakeClock`).
    :param max_workers: threads for plain (non-async) handlers.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        instance_id: str | None = None,
        grace_ms: int = DEFAULT_GRACE_MS,
        clock: Clock | None = None,
        max_workers: int = 32,
    ) -> None:
        if backend is None:
            from .backends.sqlite import SQLiteBackend

            backend = SQLiteBackend()
        if not isinstance(backend, Backend):
            raise InvalidOption(f"backend {backend!r} is not an anarchon Backend")
        if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
            raise InvalidOption(f"grace_ms={grace_ms!r} must be an integer >= 0")
        if instance_id is not None and (not isinstance(instance_id, str) or not instance_id):
            raise InvalidOption(f"instance_id={instance_id!r} must be a non-empty string")
        self.backend = backend
        self.instance_id = instance_id or default_instance_id()
        self.grace_ms = grace_ms
        self._clock: Clock = clock or SystemClock()
        self._jobs: dict[str, Job] = {}
        self._generation: dict[str, int] = {}
        self._state = _State.NEW
        self._counters: Counter[str] = Counter()
        self._clock_offset_ms: int | None = None
        self._thread_pool = ThreadPoolExecutor(max_workers, thread_name_prefix="anarchon-job")
        self._timer = SlotTimer(self._clock, self._on_due)
        self._executor = RunExecutor(
            backend, self._clock, self._thread_pool, self._counters, grace_ms
        )
        self._watcher: BackupWatcher | None = None
        if isinstance(backend, LeaseBackend):
            self._watcher = BackupWatcher(
                backend,
                self._clock,
                self.instance_id,
                self._jobs.get,
                self._on_taken,
                self._counters,
            )
        self._tasks: set[asyncio.Future[Any]] = set()
        self._loops: list[asyncio.Future[Any]] = []

    # -- jobs -------------------------------------------------------------------------------

    def job(
        self,
        name: str,
        schedule: str,
        *,
        timezone: Timezone = "UTC",
        jitter_ms: int | None = None,
        max_late_ms: int | None = None,
        history_ttl_ms: int | None = None,
        timeout_ms: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        overlap: Overlap | str | None = None,
        catch_up: CatchUp | str | None = None,
        catch_up_window_ms: int | None = None,
        handover: bool | None = None,
    ) -> Callable[[H], H]:
        """Decorator form of :meth:`add`; returns the handler unchanged."""

        def register(handler: H) -> H:
            self.add(
                name,
                schedule,
                handler,
                timezone=timezone,
                jitter_ms=jitter_ms,
                max_late_ms=max_late_ms,
                history_ttl_ms=history_ttl_ms,
                timeout_ms=timeout_ms,
                lease_ms=lease_ms,
                max_attempts=max_attempts,
                overlap=overlap,
                catch_up=catch_up,
                catch_up_window_ms=catch_up_window_ms,
                handover=handover,
            )
            return handler

        return register

    def add(
        self,
        name: str,
        schedule: str,
        handler: Handler,
        *,
        timezone: Timezone = "UTC",
        jitter_ms: int | None = None,
        max_late_ms: int | None = None,
        history_ttl_ms: int | None = None,
        timeout_ms: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        overlap: Overlap | str | None = None,
        catch_up: CatchUp | str | None = None,
        catch_up_window_ms: int | None = None,
        handover: bool | None = None,
    ) -> None:
        """Register a job; allowed while the scheduler runs.

        Options left as None take the backend's default (see the options table in the README).
        Raises a :class:`~anarchon.errors.ConfigurationError` naming the value and the rule.
        """
        if name in self._jobs:
            raise DuplicateJob(f"job name {name!r} is already registered; job names are unique")
        options = JobOptions(
            timezone=timezone,
            jitter_ms=jitter_ms,
            max_late_ms=max_late_ms,
            history_ttl_ms=history_ttl_ms,
            timeout_ms=timeout_ms,
            lease_ms=lease_ms,
            max_attempts=max_attempts,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window_ms=catch_up_window_ms,
            handover=handover,
        )
        job = build_job(name, schedule, handler, options, self.backend)
        self._jobs[name] = job
        self._generation[name] = self._generation.get(name, 0) + 1
        if self._state is _State.RUNNING:
            self._schedule_next(job, self._clock.now_ms())
            self._spawn(self._catch_up([job]))

    def remove(self, name: str) -> None:
        """Unregister a job; its running attempt, if any, finishes normally."""
        if self._jobs.pop(name, None) is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")

    @property
    def jobs(self) -> dict[str, str]:
        """Registered jobs: name to cron expression."""
        return {name: job.schedule.expression for name, job in self._jobs.items()}

    def _require_job(self, name: str) -> Job:
        job = self._jobs.get(name)
        if job is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")
        return job

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the backend, catch up missed slots, and begin firing. A scheduler starts once."""
        if self._state is not _State.NEW:
            raise SchedulerStateError(f"scheduler is {self._state.value}; it can start only once")
        await self.backend.start()
        self._state = _State.RUNNING
        if self._watcher is not None:
            assert isinstance(self.backend, LeaseBackend)
            loop = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            watcher = self._watcher

            def poke(job: str, slot_key: str, released: bool = True) -> None:
                # call_soon_threadsafe writes a byte to the loop's self-pipe per call: thousands
                # of results heard at once would fill it, and the byte that delivers SIGTERM to
                # the loop would be dropped. Only a call from another thread needs it.
                if threading.get_ident() == loop_thread:
                    loop.call_soon(watcher.poke, job, slot_key, released)
                else:
                    loop.call_soon_threadsafe(watcher.poke, job, slot_key, released)

            await self.backend.subscribe(poke)
            self._loops.append(asyncio.ensure_future(watcher.run()))
        now = self._clock.now_ms()
        for job in list(self._jobs.values()):
            self._schedule_next(job, now)
        self._loops.append(asyncio.ensure_future(self._timer.run()))
        if self._executor.keeper is not None:
            self._loops.append(asyncio.ensure_future(self._executor.keeper.run()))
        self._loops.append(asyncio.ensure_future(self._watch_clock()))
        self._spawn(self._catch_up(list(self._jobs.values())))
        logger.info(
            "scheduler %s started with %d jobs on %s",
            self.instance_id,
            len(self._jobs),
            self.backend.name,
            extra={"action": "started"},
        )

    async def stop(self) -> None:
        """Stop claiming, let running handlers finish up to ``grace_ms``, hand over the rest.

        On a lease backend a run still going after the grace period is cancelled and its lease
        released at once, so a backup takes it over without waiting for expiry.
        """
        if self._state in (_State.STOPPING, _State.STOPPED):
            return
        if self._state is _State.NEW:
            self._state = _State.STOPPED
            self._thread_pool.shutdown(wait=False)
            return
        self._state = _State.STOPPING
        for loop_task in self._loops:
            loop_task.cancel()
        if self._watcher is not None:
            self._watcher.clear()
        # Claims already sent finish (a won slot is then run or handed over); give them a moment.
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for task in self._tasks:
            task.cancel()
        await self._executor.stop(self.grace_ms)
        await _cancel_and_wait(self._loops)
        await self.backend.stop()
        self._thread_pool.shutdown(wait=False)
        self._state = _State.STOPPED
        logger.info("scheduler %s stopped", self.instance_id, extra={"action": "stopped"})

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run(self) -> None:
        """Run until SIGINT or SIGTERM, then stop gracefully. Blocks."""
        asyncio.run(self.serve())

    async def serve(self, stop_event: asyncio.Event | None = None) -> None:
        """Start, wait for SIGINT/SIGTERM (or ``stop_event``), stop: :meth:`run` for async code."""
        event = stop_event or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, event.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            await self.start()
            await event.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._state is _State.RUNNING

    # -- queries ----------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._state is not _State.RUNNING:
            raise SchedulerStateError(
                f"scheduler is {self._state.value}; call 'await scheduler.start()' (or use "
                "'async with scheduler') first"
            )

    async def history(self, name: str, limit: int = 100) -> list[Run]:
        """Runs of job ``name``, newest first; works for any job the backend has records of."""
        self._require_started()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidOption(f"limit={limit!r} must be an integer >= 0")
        return await self.backend.history(name, limit)

    async def last_run(self, name: str) -> Run | None:
        """The newest run of job ``name``, or None."""
        self._require_started()
        return await self.backend.last_run(name)

    async def run_now(self, name: str) -> Run:
        """Run job ``name`` now on this instance (trigger ``manual``) and return the finished run.

        The run is claimed like a slot of its own, so it gets a fence and, on lease backends,
        respects ``overlap='skip'``: if the previous run still holds its lease the manual run is
        recorded ``skipped`` and returned as such.
        """
        self._require_started()
        job = self._require_job(name)
        request = self._request(job, None, Trigger.MANUAL)
        outcomes = await self._claim([request], deadline_s=MANUAL_CLAIM_TIMEOUT_S)
        if not outcomes:
            raise BackendUnavailable(
                f"could not claim a manual run of {name!r}: {self.backend.name} is unavailable"
            )
        outcome = outcomes[0]
        if outcome.status is not ClaimStatus.WON:
            return outcome.run
        assert outcome.ticket is not None
        run = await self._executor.start(job, outcome.ticket).result
        if run is not None:
            return run
        for recorded in await self.backend.history(name, limit=100):
            if recorded.run_id == request.run_id:
                return recorded
        return outcome.run

    def metrics(self) -> dict[str, int | None]:
        """Counters since start (claims won and lost, runs by status, skips, takeovers ...),
        jobs, running and watched runs, and the last measured clock offset from the backend."""
        out: dict[str, int | None] = dict(self._counters)
        out["jobs"] = len(self._jobs)
        out["running"] = len(self._executor.active)
        out["watched"] = len(self._watcher) if self._watcher is not None else 0
        out["clock_offset_ms"] = self._clock_offset_ms
        return out

    # -- firing -----------------------------------------------------------------------------

    def _schedule_next(self, job: Job, after_ms: int) -> None:
        slot = job.schedule.next_slot(after_ms)
        jitter = random.randint(0, job.policy.jitter_ms) if job.policy.jitter_ms else 0
        self._timer.push(job.name, slot, slot + jitter, self._generation[job.name])

    def _on_due(self, batch: list[Due]) -> None:
        now = self._clock.now_ms()
        requests: list[ClaimRequest] = []
        fired: list[tuple[Job, int]] = []
        for due in batch:
            job = self._jobs.get(due.job)
            if job is None or self._generation.get(due.job) != due.generation:
                continue
            fired.append((job, due.slot))
            requests.append(self._request(job, due.slot, Trigger.SCHEDULE, now))
        if requests and self._state is _State.RUNNING:
            self._spawn(self._fire(requests))
        if fired:
            # After the claim is on its way: a batch of thousands would otherwise hold it back.
            self._spawn(self._reschedule(fired, now))

    async def _reschedule(self, fired: list[tuple[Job, int]], now: int) -> None:
        """Put each fired job's next slot on the timer. Slots that are already too late are
        passed over without a claim (the process was frozen, or the clock jumped)."""
        for n, (job, slot) in enumerate(fired):
            if self._jobs.get(job.name) is job:
                self._schedule_next(job, max(slot, now - job.policy.max_late_ms))
            if n % 512 == 511:
                await asyncio.sleep(0)

    def _request(
        self, job: Job, slot: int | None, trigger: Trigger, now: int | None = None
    ) -> ClaimRequest:
        skip_reason = None
        if slot is not None and now is not None and trigger is Trigger.SCHEDULE:
            late = now - slot
            if late > job.policy.max_late_ms:
                self._counters["too_late"] += 1
                skip_reason = (
                    f"too late: {self.instance_id} reached the slot {late} ms after "
                    f"it (max_late_ms={job.policy.max_late_ms})"
                )
                logger.warning(
                    "job %s slot %s: %s",
                    job.name,
                    slot,
                    skip_reason,
                    extra={"job": job.name, "slot": slot, "action": "too_late"},
                )
        policy = job.policy
        return ClaimRequest(
            job=job.name,
            slot=slot,
            run_id=_new_id(),
            token=_new_id(),
            instance=self.instance_id,
            trigger=trigger,
            lease_ms=policy.lease_ms,
            overlap=policy.overlap,
            history_ttl_ms=policy.history_ttl_ms,
            skip_reason=skip_reason,
        )

    async def _fire(self, requests: list[ClaimRequest]) -> None:
        outcomes = await self._claim(requests)
        for outcome in outcomes:
            self._handle(outcome)

    async def _claim(
        self, requests: Sequence[ClaimRequest], deadline_s: float | None = None
    ) -> list[ClaimOutcome]:
        """Claim with retries while the backend is unavailable; fail closed.

        A scheduled request is retried only until its slot becomes too late; a manual or
        catch-up request until ``deadline_s`` (if given). Dropped requests are logged, not run.
        """
        pending = list(requests)
        started = self._clock.now_ms()
        error: BackendUnavailable | None = None
        for delay in backoff():
            try:
                return await self.backend.claim(pending)
            except BackendUnavailable as exc:
                self._counters["claim_errors"] += 1
                if error is None:
                    logger.warning(
                        "claiming %d slot(s) failed, retrying until they are too late: %s",
                        len(pending),
                        exc,
                        extra={"action": "claim_retry", "job": pending[0].job},
                    )
                error = exc
            if self._state is not _State.RUNNING:
                return []
            await self._clock.sleep(delay)
            # Re-check after the pause: a slot that became too late meanwhile is not claimed.
            now = self._clock.now_ms()
            keep: list[ClaimRequest] = []
            dropped_now: list[ClaimRequest] = []
            for request in pending:
                expired = self._expired(request, now, started, deadline_s)
                (dropped_now if expired else keep).append(request)
            for dropped in dropped_now:
                logger.warning(
                    "job %s slot %s not claimed: %s unavailable (%s); nobody runs it on a guess",
                    dropped.job,
                    dropped.slot,
                    self.backend.name,
                    error,
                    extra={"job": dropped.job, "slot": dropped.slot, "action": "claim_failed"},
                )
            pending = keep
            if not pending:
                return []
        return []  # pragma: no cover

    def _expired(
        self, request: ClaimRequest, now: int, started: int, deadline_s: float | None
    ) -> bool:
        if deadline_s is not None and now - started > deadline_s * 1000:
            return True
        if request.trigger is Trigger.SCHEDULE and request.slot is not None:
            job = self._jobs.get(request.job)
            limit = job.policy.max_late_ms if job else 0
            return now - request.slot > limit
        return False

    def _handle(self, outcome: ClaimOutcome) -> ActiveRun | None:
        """Act on a claim's outcome: run what was won, log the rest, watch runs others hold."""
        run = outcome.run
        extra = {
            "job": run.job,
            "slot": run.slot_ms,
            "action": "claim_" + outcome.status.value,
            "holder": run.instance,
        }
        job = self._jobs.get(run.job)
        if outcome.status is ClaimStatus.WON:
            assert outcome.ticket is not None
            self._counters["claims_won"] += 1
            logger.debug("won %s slot %s", run.job, run.slot_ms, extra=extra)
            if job is not None:
                return self._executor.start(job, outcome.ticket)
            error = "the job was removed before its claimed slot could run"
            self._spawn(self.backend.finish(outcome.ticket, RunStatus.FAILED, error))
        elif outcome.status is ClaimStatus.SKIPPED:
            self._counters["skipped"] += 1
            logger.info(
                "job %s slot %s skipped: %s",
                run.job,
                run.slot_ms,
                run.reason,
                extra={**extra, "reason": run.reason},
            )
        else:
            self._counters["claims_lost"] += 1
            logger.debug("lost %s slot %s to %s", run.job, run.slot_ms, run.instance, extra=extra)
            if self._watcher is not None and run.status == "running" and job is not None:
                slot_key = str(run.slot_ms) if run.slot_ms is not None else f"manual-{run.run_id}"
                self._watcher.watch(
                    run.job, slot_key, outcome.lease_expires_at_ms, outcome.backend_now_ms
                )
        return None

    def _on_taken(self, job: Job, ticket: Ticket) -> None:
        if self._state is _State.RUNNING:
            self._executor.start(job, ticket)

    async def _catch_up(self, jobs: list[Job]) -> None:
        """Look up the last recorded slot of every job that catches up, in one backend call, and
        start a catch-up for each job that missed slots."""
        backend = self.backend
        wanted = [j for j in jobs if j.policy.catch_up != CatchUp.NONE]
        if not wanted or not isinstance(backend, LeaseBackend):
            return
        try:
            last_slots = await backend.last_slots([j.name for j in wanted])
        except BackendUnavailable as exc:
            logger.warning("catch-up skipped: %s", exc, extra={"action": "catch_up_failed"})
            return
        now = self._clock.now_ms()
        for job in wanted:
            policy = job.policy
            slots, left_out = missed_slots(
                job.schedule,
                last_slots.get(job.name),
                now,
                policy.catch_up_window_ms,
                CatchUp(policy.catch_up),
            )
            if slots:
                logger.info(
                    "catching up %d missed slot(s) of %s (%d older left out, catch_up=%s)",
                    len(slots),
                    job.name,
                    left_out,
                    policy.catch_up,
                    extra={"job": job.name, "action": "catch_up"},
                )
                self._spawn(self._catch_up_slots(job, slots))

    async def _catch_up_slots(self, job: Job, slots: list[int]) -> None:
        policy = job.policy
        # One slot at a time, oldest first. Before each claim an instance waits until no run of
        # the job is going (instances that start together may have read different last slots),
        # so catch-up runs do not overlap; the claim itself allows overlap, because a missed
        # slot must not be recorded skipped for overlapping another missed slot.
        idle_limit_s = policy.lease_ms * 2 / 1000
        for slot in slots:
            if self._state is not _State.RUNNING or not await self._until_idle(job, idle_limit_s):
                return
            request = replace(self._request(job, slot, Trigger.CATCH_UP), overlap=Overlap.ALLOW)
            outcomes = await self._claim([request], deadline_s=policy.max_late_ms / 1000)
            if not outcomes:
                return
            active = self._handle(outcomes[0])
            if active is not None:
                await active.result

    async def _until_idle(self, job: Job, limit_s: float) -> bool:
        """Wait up to ``limit_s`` until the job's newest run has ended; False if stopping."""
        waited = 0.0
        while self._state is _State.RUNNING:
            try:
                last = await self.backend.last_run(job.name)
            except BackendUnavailable:
                last = None
            if last is None or last.status.finished or waited >= limit_s:
                return True
            await self._clock.sleep(CATCH_UP_POLL_S)
            waited += CATCH_UP_POLL_S
        return False

    # -- clock skew -------------------------------------------------------------------------

    async def _watch_clock(self) -> None:
        while True:
            await self._measure_skew()
            await self._clock.sleep(SKEW_CHECK_S)

    async def _measure_skew(self) -> None:
        before = self._clock.now_ms()
        try:
            server = await self.backend.server_time_ms()
        except BackendUnavailable:
            return
        after = self._clock.now_ms()
        if server is None:
            return
        offset = server - (before + after) // 2
        self._clock_offset_ms = offset
        budgets = [b for j in self._jobs.values() if (b := self.backend.skew_budget_ms(j.policy))]
        # Warn long before skew is unsafe: at a tenth of the tightest budget, and above 5 s anyway.
        threshold = min([5_000, *(b // 10 for b in budgets)])
        if abs(offset) > max(threshold, 250):
            self._counters["clock_skew_warnings"] += 1
            logger.warning(
                "clock of %s is %+d ms off the %s backend's clock; slots fire off time, and past "
                "%s ms a slot could run twice. Synchronise clocks (NTP).",
                self.instance_id,
                offset,
                self.backend.name,
                min(budgets) if budgets else "unbounded",
                extra={"action": "clock_skew", "offset_ms": offset},
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "internal task failed",
                exc_info=task.exception(),
                extra={"action": "internal_error"},
            )
