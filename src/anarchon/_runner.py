"""Running attempts: :class:`RunExecutor` starts a task per won ticket, calls its handler
(:mod:`._handler`) and has the result recorded by :mod:`._results` (batched, held while a burst
starts, retried); on stop it drains and hands over (:mod:`._drain`). The run in progress is an
:class:`~anarchon._active.ActiveRun`.

A run costs one task. Its lease is renewed by the scheduler's single
:class:`~anarchon._keeper.LeaseKeeper` (on a thread of its own when the backend allows), so ten
thousand jobs sharing a slot do not start ten thousand renewal loops, and a handler that blocks
the event loop does not stop renewals. When the keeper finds a lease lost, :meth:`RunExecutor.lose`
tells the handler and stops waiting for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import otel
from ._active import ActiveRun, new_active
from ._active import log_run as _log
from ._clock import Clock
from ._context import new_context
from ._drain import LEFT_TO_EXPIRE, Drain
from ._handler import HandlerCalls, Outcome
from ._job import Job
from ._metrics import Counters
from ._models import Run, RunStatus, ms_to_datetime
from ._results import ResultRecorder
from ._retry import backoff
from ._retrying import Failures, retry_number
from ._threads import HandlerThreads
from .backend import HANDED_OVER, LEASE_LOST, Backend, LeaseBackend, Ticket
from .errors import BackendError, LeaseLost
from .logs import Action

if TYPE_CHECKING:
    from ._keeper import LeaseKeeper

__all__ = ["RunExecutor"]

logger = logging.getLogger("anarchon.scheduler")


@dataclass(eq=False)
class RunExecutor(HandlerCalls, Drain):
    """Runs won tickets: calls the handler (:class:`~anarchon._handler.HandlerCalls`), has its
    result recorded (:attr:`results`), drains and hands over on stop
    (:class:`~anarchon._drain.Drain`)."""

    backend: Backend
    clock: Clock
    threads: HandlerThreads
    counters: Counters
    grace_ms: int
    active: dict[str, ActiveRun] = field(default_factory=dict, init=False)
    keeper: LeaseKeeper | None = field(default=None, init=False)
    """Set by the scheduler when it starts (lease backends)."""
    closed: bool = field(default=False, init=False)
    """After the grace period: a run won now is handed over at once instead of started."""
    failures: Failures | None = field(default=None, init=False)
    """Set by the scheduler: retries (sent with a failed result) and the ``on_failure`` hook
    (see :mod:`._retrying`); awaited in the run's task, so a drain waits for it too."""
    results: ResultRecorder = field(init=False)
    """Records the runs' results (:class:`Claims` holds them back while a burst starts)."""
    abandoned: list[ActiveRun] = field(default_factory=list, init=False)
    """Runs whose task was cancelled from outside while their handler ran (the event loop
    ending under a running scheduler: ``asyncio.run()`` cancels every task): no result, the
    lease held and no longer renewed. :meth:`drain` hands them over; a plain handler's thread
    that still works keeps its lease renewed and is waited for first, within the grace. One
    whose thread returns before the stop has its result recorded then (:meth:`_settle_orphan`),
    not its lease renewed until the stop."""
    _settling: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    """The recordings of orphaned threads' results (:meth:`_settle_orphan`) under way."""
    _hurried: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _monotonic_ms: Callable[[], int] = field(init=False)
    _callbacks: contextvars.Context = field(init=False)

    def __post_init__(self) -> None:
        self.results = ResultRecorder(self.backend, self.clock, self.counters)
        # One bound method for every run's context, not one made per run.
        self._monotonic_ms = self.clock.monotonic_ms
        self._callbacks = contextvars.Context()

    def start(
        self, job: Job, ticket: Ticket, *, reserved: bool = False, sent_ms: int | None = None
    ) -> ActiveRun:
        """Begin running ``ticket`` in a task; return its handle.

        ``reserved``: a handler thread was reserved for this run (plain handlers); the executor
        uses it or gives it back. ``sent_ms``: when the claim or takeover that gave the ticket
        was sent (monotonic), to place the lease's local deadline conservatively.
        """
        ctx = new_context(
            job.name,
            ms_to_datetime(ticket.slot),
            ticket.run_id,
            ticket.attempt,
            ticket.fence,
            ticket.trigger,
            ticket.instance,
            self._monotonic_ms,
            retry_number(ticket.slot_key),
        )
        active = new_active(job, ticket, ctx, reserved=reserved, executor=self)
        if ticket.lease_expires_at_ms is not None:
            sent = sent_ms if sent_ms is not None else self.clock.monotonic_ms()
            active.set_deadline(sent + _lease_left(ticket))
        self.active[ticket.run_id] = active
        active.task = task = asyncio.get_running_loop().create_task(
            otel.traced_run(active, self._execute(active)),
            name=f"anarchon run of {job.name} ({ticket.run_id[:8]})",
        )
        # In the executor's own context, not a copy of the current one made per run: the
        # callback reads no context variable.
        task.add_done_callback(active, context=self._callbacks)
        return active

    def running(self, task: asyncio.Task[Any] | None) -> ActiveRun | None:
        """The run whose task is ``task`` (any thread: used by the loop watchdog)."""
        if task is None:
            return None
        for active in list(self.active.values()):
            if active.task is task:
                return active
        return None

    async def _execute(self, active: ActiveRun) -> Run | None:
        """The run's task, one coroutine (ten thousand runs of a slot wait at once): the
        handler, then its result recorded; the run recorded, or None if none was (handed over,
        lease lost, result refused). What happens when it ends: :meth:`ActiveRun.ended`."""
        ticket, job = active.ticket, active.job
        if self.closed:
            # Won after the grace period (a claim or takeover that was in flight): hand it
            # over at once rather than start a handler nobody will wait for.
            return await self._release(active)
        leased = self.keeper is not None and ticket.lease_expires_at_ms is not None
        if leased and not _fresh(ticket) and not await self._renew_stale_lease(active):
            return None
        if logger.isEnabledFor(logging.INFO):
            _log(
                logging.INFO,
                Action.RUN_STARTED,
                ticket,
                "running %s attempt %d (fence %s)",
                job.name,
                ticket.attempt,
                ticket.fence,
            )
        if leased:
            assert self.keeper is not None
            self.keeper.add(active)
        try:
            outcome = await self._run_handler(active)
        finally:
            if _orphaned(active):
                # Its lease stays kept while the thread works: its result is recorded when it
                # returns, or the stop waits for it (drain).
                self._watch_orphan(active)
            else:
                if leased:
                    assert self.keeper is not None
                    self.keeper.discard(active)
                active.ctx._deadline = None  # the handler is over: only a real loss counts now
        otel.handler_done(outcome)
        if outcome is not None:
            return await self._record(active, outcome)
        ticket = active.ticket  # renewed by the keeper meanwhile
        if active.cancel_reason == HANDED_OVER and active.thread_running:
            # A thread cannot be stopped: releasing now would let a backup start the slot while
            # it still works. The lease is left to expire (the process exits meanwhile).
            active.fate = LEFT_TO_EXPIRE
            _log(
                logging.WARNING,
                Action.LEFT_TO_EXPIRE,
                ticket,
                "job %s attempt %d: its thread still runs after the grace period; not handed "
                "over: a backup takes the run over when its lease expires",
                job.name,
                ticket.attempt,
            )
        elif active.cancel_reason == HANDED_OVER:
            return await self._release(active)
        else:
            # The lease is lost: a backup takes the run over (or has); recording our own
            # cancellation as the run's result would end the slot without running it.
            _log(
                logging.INFO,
                Action.LEFT_TO_BACKUP,
                ticket,
                "left %s attempt %d to a backup",
                job.name,
                ticket.attempt,
            )
        return None

    async def _record(self, active: ActiveRun, outcome: Outcome) -> Run | None:
        """Record the handler's ``outcome`` (with a failed run's retry) and call the failure
        hook; the run recorded, or None if the backend refused it (logged)."""
        job, ticket = active.job, active.ticket  # the ticket renewed by the keeper meanwhile
        status, error, exc = outcome
        # The first try here rather than in finish: one coroutine fewer per waiting run.
        results, failures = self.results, self.failures
        # A failed run's retry goes with its result, stored in the same step.
        retry = None
        if failures is not None and status is RunStatus.FAILED:
            retry = failures.retry_for(job, ticket)
        run: Run | None
        try:
            run = await results.submit(active, ticket, status, error, retry)
        except BackendError as failed:
            run = await results.finish(active, status, error, exc, failed, retry)
        else:
            results.recorded(ticket, status, error, exc)
        if run is not None and status is RunStatus.FAILED and failures is not None:
            await failures.failed(job, active.ticket, run, retry)
        return run

    async def _renew_stale_lease(self, active: ActiveRun) -> bool:
        """Renew a lease with less than a third left (not :func:`_fresh`) before the handler
        starts; False if the backend says it is lost (the handler does not start).

        A claim retried with the same token (its first answer was lost) comes back with the
        lease it took then, possibly expired by now.
        """
        ticket = active.ticket
        assert isinstance(self.backend, LeaseBackend)
        started = self.clock.monotonic_ms()
        for delay in backoff():
            sent = self.clock.monotonic_ms()
            try:
                renewed = await self.backend.renew(ticket)
            except LeaseLost as exc:
                self._lease_lost(
                    active,
                    f"its lease ran out before the handler could start ({exc}); not starting it",
                )
                active.ctx._mark_lost(f"{LEASE_LOST}: {exc}")
                return False
            except BackendError as exc:
                left = active.deadline - self.clock.monotonic_ms()
                if left > 0:
                    return True  # some lease is left: start, the keeper retries at once
                if self.clock.monotonic_ms() - started > ticket.lease_ms:
                    _log(
                        logging.WARNING,
                        Action.LEFT_TO_BACKUP,
                        ticket,
                        "job %s attempt %d: its lease ran out and cannot be renewed (%s); left "
                        "to a backup",
                        ticket.job,
                        ticket.attempt,
                        exc,
                    )
                    return False
                await self.clock.sleep(delay)
                continue
            active.ticket = renewed
            active.set_deadline(sent + _lease_left(renewed))
            return True
        raise AssertionError("unreachable")  # pragma: no cover

    def lose(self, active: ActiveRun, reason: str) -> None:
        """The keeper found the lease lost: tell the handler and stop waiting for it."""
        if active.task is None or active.task.done():
            return
        self._lease_lost(active, reason)
        self._cancel(active, reason)

    def _lease_lost(self, active: ActiveRun, why: str) -> None:
        """Count and log (``lease_lost``) that ``active``'s lease is gone, ``why`` in words."""
        self.counters.count(active.job.name, "lease_lost")
        _log(
            logging.WARNING,
            Action.LEASE_LOST,
            active.ticket,
            "job %s attempt %d: %s",
            active.job.name,
            active.ticket.attempt,
            why,
        )

    def _cancel(self, active: ActiveRun, reason: str) -> None:
        """Stop waiting for the handler of ``active`` for ``reason`` (once): tell it, cancel it."""
        if active.cancel_reason is not None:
            return
        active.cancel_reason = reason
        active.ctx._mark_lost(reason)
        if active.in_handler and active.task is not None:
            active.task.cancel()


def _orphaned(active: ActiveRun) -> bool:
    """The run's task was cancelled from outside (not by the scheduler) while its plain
    handler's thread still works: the stop waits for that thread (:meth:`RunExecutor.drain`)."""
    return active.thread_running and active.cancel_reason is None


def _fresh(ticket: Ticket) -> bool:
    """More than a third of the lease was left when the backend answered."""
    return _lease_left(ticket) > ticket.lease_ms // 3


def _lease_left(ticket: Ticket) -> int:
    """How much of the lease the backend said was left when it answered (ms)."""
    if ticket.lease_expires_at_ms is None or ticket.backend_now_ms is None:
        return ticket.lease_ms
    return ticket.lease_expires_at_ms - ticket.backend_now_ms
