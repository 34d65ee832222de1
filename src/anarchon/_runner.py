"""Running attempts: the handler, its timeout, a lost lease, draining and hand-over. The
result is recorded by :mod:`._results` (batched, held while a burst starts, retried).

A run costs one task. Its lease is renewed by the scheduler's single
:class:`~anarchon._keeper.LeaseKeeper` (on a thread of its own when the backend allows), so ten
thousand jobs sharing a slot do not start ten thousand renewal loops, and a handler that blocks
the event loop does not stop renewals.

Plain (non-async) handlers run on :class:`~anarchon._threads.HandlerThreads`: a thread is
reserved before the slot is claimed, and a thread that runs past ``timeout_ms`` keeps its run's
lease until it really returns (a thread cannot be stopped from outside).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from . import otel
from ._clock import Clock
from ._context import RunContext, new_context
from ._job import Job
from ._metrics import Counters
from ._models import Run, RunStatus, ms_to_datetime
from ._results import ResultRecorder
from ._retry import backoff
from ._retrying import Failures, retry_number
from ._supervisor import consume
from ._threads import HandlerThreads, NoThreadFree
from .backend import HANDED_OVER, LEASE_LOST, Backend, LeaseBackend, Ticket
from .errors import BackendError, LeaseLost
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._keeper import LeaseKeeper

__all__ = ["ActiveRun", "RunExecutor"]

logger = logging.getLogger("anarchon.scheduler")

STOPPED: Final = "stopped"
# The fates of a run that recorded no result on stop (ActiveRun.fate), named as their log actions.
HANDED_OVER_FATE: Final = Action.HANDED_OVER.value
LEFT_TO_EXPIRE: Final = Action.LEFT_TO_EXPIRE.value
# After the grace period, cancelled handlers and their hand-over calls get this long (s).
CANCEL_GRACE_S: Final = 10.0

Outcome = tuple[RunStatus, str | None, BaseException | None]
"""(status, error text, the exception to log with its traceback). The text is raw: secrets in
it are masked where it becomes a result (:class:`~anarchon._results.ResultRecorder`)."""
# A handler's success, the one outcome of nearly every run: one object, not one per run (and
# no read of RunStatus.SUCCEEDED, which costs 0.15-0.2 us on Python 3.11: EnumType.__getattr__).
_SUCCEEDED: Final[Outcome] = (RunStatus.SUCCEEDED, None, None)


@dataclass(eq=False, slots=True)
class ActiveRun:
    """An attempt this instance is running."""

    job: Job
    ticket: Ticket
    ctx: RunContext
    task: asyncio.Task[Run | None] | None = None
    in_handler: bool = False
    cancel_reason: str | None = None
    reserved: bool = False
    """A handler thread is reserved for this run (plain handlers) and not yet used."""
    thread_running: bool = False
    """The run stopped waiting for its handler's thread, which still runs (plain handlers)."""
    thread: concurrent.futures.Future[Any] | None = None
    """The call on its handler's thread (plain handlers), once submitted: waited for by the
    stop when the run's task was cancelled from outside while it ran (see
    :attr:`RunExecutor.abandoned`)."""
    fate: str | None = None
    """What became of a run that recorded no result on stop: ``handed_over``,
    ``handover_failed`` or ``left_to_expire`` (what its span says)."""
    # Lease bookkeeping, on the monotonic clock (ms): when to renew next (the keeper's), when
    # the lease surely ends unless renewed, and whether the keeper renews it.
    renew_at: int = 0
    deadline: int = 0
    kept: bool = False
    executor: RunExecutor | None = field(default=None, repr=False)
    """The executor running it: the run leaves its runs in progress when its task is done."""
    _result: asyncio.Future[Run | None] | None = field(default=None, repr=False)

    @property
    def result(self) -> asyncio.Future[Run | None]:
        """The recorded run (None if none was recorded: handed over, lease lost, refused), or
        what the run's task raised. Made when first asked for: a burst's runs need none."""
        future = self._result
        if future is None:
            future = self._result = asyncio.get_running_loop().create_future()
            if self.task is not None and self.task.done():
                _settle(future, self.task)
        return future

    def ended(self, task: asyncio.Task[Run | None]) -> None:
        """The run's task is done (a done callback): leave the executor's runs in progress,
        give back an unused thread reservation, settle :attr:`result` if it was asked for.

        Here rather than in the task's own ``finally``: a task cancelled before its first step
        never runs its coroutine. The run itself is the callback (``__call__``): no object made
        per run for it (a closure makes three, a bound method one), and ten thousand runs of
        one slot are all alive at once."""
        executor = self.executor
        if executor is not None:
            executor.active.pop(self.ticket.run_id, None)
            if self.reserved:
                self.reserved = False
                executor.threads.unreserve()
        if self._result is not None and not self._result.done():
            _settle(self._result, task)

    __call__ = ended

    def set_deadline(self, deadline: int) -> None:
        """The lease surely ends at ``deadline`` (monotonic ms) unless renewed; any thread."""
        self.deadline = deadline
        self.ctx._deadline = deadline


_blank: Final = object.__new__


def new_active(
    job: Job, ticket: Ticket, ctx: RunContext, reserved: bool, executor: RunExecutor
) -> ActiveRun:
    """``ActiveRun(job=job, ticket=ticket, ctx=ctx, reserved=reserved, executor=executor)``,
    the same object, built by plain stores of every slot (one per run, thousands at once: the
    dataclass's keyword call took about twice as long; tests/unit/test_run_context.py checks
    every slot against the constructor's)."""
    active: ActiveRun = _blank(ActiveRun)
    active.job = job
    active.ticket = ticket
    active.ctx = ctx
    active.task = None
    active.in_handler = False
    active.cancel_reason = None
    active.reserved = reserved
    active.thread_running = False
    active.thread = None
    active.fate = None
    active.renew_at = 0
    active.deadline = 0
    active.kept = False
    active.executor = executor
    active._result = None
    return active


def _settle(future: asyncio.Future[Run | None], task: asyncio.Task[Run | None]) -> None:
    """Give ``future`` the outcome of the done ``task``.

    An exception reaches whoever awaits ``future``; the task still reports it as the loop does
    for a task nobody awaited (taking it from the task marks it retrieved)."""
    if task.cancelled():
        future.cancel()
        return
    exc = task.exception()
    if exc is None:
        future.set_result(task.result())
        return
    future.set_exception(exc)
    future.exception()  # retrieved: reported below, once
    task.get_loop().call_exception_handler(
        {"message": "Task exception was never retrieved", "exception": exc, "future": task}
    )


@dataclass(eq=False)
class RunExecutor:
    """Runs won tickets: calls the handler, has its result recorded (:attr:`results`), drains
    and hands over on stop."""

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
        active = new_active(job, ticket, ctx, reserved, self)
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

    async def _run_handler(self, active: ActiveRun) -> Outcome | None:
        """Call the handler; return its outcome, or None if we cancelled it ourselves."""
        active.in_handler = True
        self.counters.handler_started(active.ticket, self.clock.now_ms())
        began = self.clock.monotonic_ms()
        pid = os.getpid()
        try:
            job = active.job
            if job.is_async and job.timeout_ms is None:
                # The common case, without a coroutine of its own (see _run_async).
                await job.handler(active.ctx)
                _leave_if_forked(pid, None)
                return _SUCCEEDED
            if job.is_async:
                outcome = await self._run_async(active)
                _leave_if_forked(pid, None)
                return outcome
            return await self._run_thread(active)
        except asyncio.CancelledError as exc:
            # Told apart by the scheduler's own marks, not by the exception's type: a
            # cancellation the scheduler asked for (stop, lease lost) sets cancel_reason; one
            # from outside the run cancels its task. A CancelledError with neither is the
            # handler's own (it awaited something it cancelled): its run's failure.
            task = asyncio.current_task()
            if active.cancel_reason is not None:
                if task is not None:
                    task.uncancel()
                return None
            if task is not None and task.cancelling() > 0:
                # Not ours: the loop ends under the scheduler (see abandoned), or the scheduler
                # abandons the run. A stop hands it over; a plain handler's thread that still
                # works is waited for first, within the grace, its lease kept (see drain).
                self.abandoned.append(active)
                raise
            return RunStatus.FAILED, _describe_base(exc), exc
        except Exception as exc:
            _leave_if_forked(pid, exc)
            spare = active.ticket.attempt < active.job.policy.max_attempts
            if spare and isinstance(exc, LeaseLost):
                # The handler's own check_lease() saw its lease run out: the run is left to a
                # backup (the slot runs again), not recorded failed with attempts to spare.
                return None
            # Raw here: a secret in it is masked where it becomes the result (._results).
            return RunStatus.FAILED, f"{type(exc).__name__}: {exc}", exc
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt, GeneratorExit, a class of its own: the handler's
            # run fails, never the scheduler.
            _leave_if_forked(pid, exc)
            return RunStatus.FAILED, _describe_base(exc), exc
        finally:
            active.in_handler = False
            self.counters.handler_ended(active.job.name, self.clock.monotonic_ms() - began)

    async def _run_async(self, active: ActiveRun) -> Outcome:
        job, ctx = active.job, active.ctx
        timeout = job.timeout_ms
        if timeout is None:
            await job.handler(ctx)
            return RunStatus.SUCCEEDED, None, None
        scope = asyncio.timeout(timeout / 1000)
        began = self.clock.monotonic_ms()
        try:
            async with scope:
                await job.handler(ctx)
        except TimeoutError:
            if not scope.expired():
                raise  # the handler's own TimeoutError, not ours
            ctx._timed_out = True
            return RunStatus.FAILED, f"timed out after timeout_ms={timeout}", None
        if scope.expired():
            # The handler caught its cancellation and returned: still past its time.
            ctx._timed_out = True
            took = self.clock.monotonic_ms() - began
            _log(
                logging.WARNING,
                Action.TIMED_OUT,
                active.ticket,
                "job %s ran past timeout_ms=%d and ignored its cancellation (it caught "
                "CancelledError); it returned after %d ms: recorded failed. Let handlers end "
                "on CancelledError",
                job.name,
                timeout,
                took,
            )
            error = (
                f"timed out after timeout_ms={timeout}; the handler ignored the cancellation "
                f"and returned after {took} ms"
            )
            return RunStatus.FAILED, error, None
        return RunStatus.SUCCEEDED, None, None

    async def _run_thread(self, active: ActiveRun) -> Outcome:
        job, ctx, ticket = active.job, active.ctx, active.ticket
        label = f"job {job.name} (run {ticket.run_id[:8]}, attempt {ticket.attempt})"
        reserved, active.reserved = active.reserved, False
        try:
            handler = functools.partial(_call_plain, job.handler, ctx)
            call = self.threads.submit(handler, label, reserved=reserved)
        except NoThreadFree as exc:
            return RunStatus.FAILED, f"not started: {exc} (max_workers)", None
        active.thread = call
        waiting = asyncio.wrap_future(call)
        waiting.add_done_callback(consume)  # a thread abandoned (lease lost) may still fail
        try:
            return await self._wait_thread(active, waiting)
        except asyncio.CancelledError:
            active.thread_running = not call.done()
            failed = call.exception() if call.done() and not call.cancelled() else None
            if failed is not None and active.cancel_reason is None:
                task = asyncio.current_task()
                if task is None or task.cancelling() == 0:
                    # The handler raised concurrent.futures.CancelledError, which asyncio
                    # turned into its own: the handler's failure, with its own exception.
                    raise failed from None
            raise

    async def _wait_thread(self, active: ActiveRun, waiting: asyncio.Future[Any]) -> Outcome:
        job, ctx, ticket = active.job, active.ctx, active.ticket
        timeout = job.timeout_ms
        if timeout is not None:
            done, _ = await asyncio.wait({waiting}, timeout=timeout / 1000)
            if not done:
                # A thread cannot be stopped. The run keeps its lease (the keeper goes on
                # renewing it) until the handler returns, so overlap='skip' still holds and no
                # backup starts the slot beside it; ctx.timed_out tells the handler.
                ctx._timed_out = True
                self.counters.timed_out_threads += 1
                _log(
                    logging.WARNING,
                    Action.TIMED_OUT,
                    ticket,
                    "job %s ran past timeout_ms=%d; its thread cannot be stopped, so the run "
                    "keeps its lease until the handler returns (ctx.timed_out is now True)",
                    job.name,
                    timeout,
                )
                # What it does after its time is not its result (whatever it raises).
                await asyncio.wait({waiting})
                return RunStatus.FAILED, f"timed out after timeout_ms={timeout}", None
        await waiting
        return RunStatus.SUCCEEDED, None, None

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
        if active.cancel_reason is not None:
            return
        active.cancel_reason = reason
        active.ctx._mark_lost(reason)
        if active.in_handler and active.task is not None:
            active.task.cancel()

    async def _release(self, active: ActiveRun) -> Run | None:
        """Hand the run over on stop (a lease backend, ``handover`` on), else record it failed
        (``stopped: ...``); the run recorded, or None (its :attr:`ActiveRun.fate` says why)."""
        ticket = active.ticket
        backend = self.backend
        if isinstance(backend, LeaseBackend) and active.job.policy.handover:
            try:
                await backend.release(ticket, HANDED_OVER)
            except BackendError as exc:
                active.fate = Action.HANDOVER_FAILED.value
                _log(
                    logging.WARNING,
                    Action.HANDOVER_FAILED,
                    ticket,
                    "could not hand %s over (%s); a backup takes over at lease expiry",
                    ticket.job,
                    exc,
                )
                return None
            active.fate = HANDED_OVER_FATE
            self.counters.count(ticket.job, "handed_over")
            _log(
                logging.INFO,
                Action.HANDED_OVER,
                ticket,
                "handed %s attempt %d over to a backup",
                ticket.job,
                ticket.attempt,
            )
            return None
        reason = (
            f"{STOPPED}: the scheduler stopped before the handler finished "
            f"(grace_ms={self.grace_ms})"
        )
        return await self.results.finish(active, RunStatus.FAILED, reason, None)

    def hurry(self) -> None:
        """End the grace period now (a second SIGINT or SIGTERM): :meth:`drain`, running or to
        come, stops waiting and cancels and hands over what still runs."""
        self._hurried.set()

    async def drain(self, deadline_ms: int) -> None:
        """Let running handlers finish until ``deadline_ms`` (monotonic) or :meth:`hurry`, while
        their leases are still renewed; then cancel what is left and hand it over (or record it
        failed)."""
        # Waits on the tasks themselves: a result future may be cancelled by whoever awaited
        # it (a catch-up), while the run goes on.
        pending = [a.task for a in self.active.values() if a.task is not None]
        left_s = (deadline_ms - self.clock.monotonic_ms()) / 1000
        if pending and left_s > 0 and not self._hurried.is_set():
            # The clock's sleep; and never longer than the grace in real time, so that a test
            # clock nobody moves cannot make stop() hang.
            await _all_or_sleep(pending, self.clock.sleep(left_s), left_s, self._hurried)
        self.closed = True
        leftover = [a for a in self.active.values() if a.task is not None and not a.task.done()]
        for active in leftover:
            self._cancel(active, HANDED_OVER)
        if self.abandoned:
            await self._settle_abandoned(deadline_ms)
        if self._settling:  # orphaned threads that returned: their results being recorded
            settling = list(self._settling)
            await _all_or_sleep(settling, self.clock.sleep(CANCEL_GRACE_S), CANCEL_GRACE_S)
        if not leftover:
            return
        # Give the cancelled handlers and the release/finish calls a bounded time; a call
        # still stuck after that (an unreachable backend) is abandoned: the lease expires
        # and a backup takes the run over.
        tasks = [a.task for a in leftover if a.task is not None]
        await _all_or_sleep(tasks, self.clock.sleep(CANCEL_GRACE_S), CANCEL_GRACE_S)
        # A handler still in its code swallowed the cancellation and works on. Handing its run
        # over now would let a backup run the slot beside it: its lease stays renewed until it
        # ends (a process that exits meanwhile ends it; the lease then expires).
        for active in filter(_still_in_handler, leftover):
            self.counters.cancel_ignored += 1
            _log(
                logging.WARNING,
                Action.CANCEL_IGNORED,
                active.ticket,
                "job %s attempt %d ignores its cancellation (it caught CancelledError and works "
                "on): not handed over; its lease stays renewed while it runs, and expires if the "
                "process exits first. Let handlers end on CancelledError",
                active.job.name,
                active.ticket.attempt,
            )
        for active in leftover:
            if active.task is not None and not active.task.done() and not active.in_handler:
                active.task.cancel()  # stuck in a release or finish call: abandoned

    async def _settle_abandoned(self, deadline_ms: int) -> None:
        """Settle the runs cancelled from outside (:attr:`abandoned`): wait for the plain
        handlers' threads that still work (:meth:`_await_threads`), and hand the others over
        (or record them failed), bounded as the cancelled handlers' hand-over is."""
        abandoned, self.abandoned = self.abandoned, []
        working = [a for a in abandoned if a.thread is not None and not a.thread.cancelled()]
        gone = [a for a in abandoned if a not in working]
        if gone:
            await self._hand_over_abandoned(gone)
        if working:
            await self._await_threads(working, deadline_ms)

    async def _hand_over_abandoned(self, abandoned: list[ActiveRun]) -> None:
        """Hand over (or record failed) runs cancelled from outside, bounded as the cancelled
        handlers' hand-over is."""
        releases = [asyncio.ensure_future(self._release(active)) for active in abandoned]
        done, pending = await asyncio.wait(releases, timeout=CANCEL_GRACE_S)
        for release in pending:
            release.cancel()  # an unreachable backend: the lease expires
        for release in done:
            failed = release.exception()
            if failed is not None:
                logger.error(
                    "handing over a run cancelled from outside failed",
                    exc_info=failed,
                    extra=log_fields(Action.INTERNAL_ERROR),
                )

    async def _await_threads(self, working: list[ActiveRun], deadline_ms: int) -> None:
        """Wait for the threads of plain handlers whose runs were cancelled from outside (the
        event loop ending under the scheduler) until ``deadline_ms`` (monotonic: the grace),
        their leases still renewed, and record each result, as a stop does for a thread that
        ends within the grace. A thread cannot be stopped, so handing its run over at once
        would let a backup run the slot beside it. A thread still working after the grace
        keeps the stop's rule: not handed over, its lease left to expire."""
        calls = [a.thread for a in working if a.thread is not None]
        left_s = (deadline_ms - self.clock.monotonic_ms()) / 1000
        if left_s > 0 and not all(call.done() for call in calls):
            # Never cancelled from here (that would cancel a call not begun): left to settle.
            waits = [asyncio.wrap_future(call) for call in calls]
            for wait in waits:
                wait.add_done_callback(consume)
            await _all_or_sleep(waits, self.clock.sleep(left_s), left_s)
        for active in working:
            call = active.thread
            assert call is not None
            self._stop_keeping(active)
            if not call.done():
                active.fate = LEFT_TO_EXPIRE
                _log(
                    logging.WARNING,
                    Action.LEFT_TO_EXPIRE,
                    active.ticket,
                    "job %s attempt %d: its thread still runs after the grace period (the event "
                    "loop ended under the scheduler); not handed over: a backup takes the run "
                    "over when its lease expires",
                    active.job.name,
                    active.ticket.attempt,
                )
                continue
            outcome = _thread_outcome(active, call)
            if outcome is None:
                continue  # the handler saw its lease lost: left to a backup
            try:
                await self._record(active, outcome)
            except Exception:
                logger.exception(
                    "recording the result of a run cancelled from outside failed",
                    extra=log_fields(Action.INTERNAL_ERROR),
                )

    def _watch_orphan(self, active: ActiveRun) -> None:
        """When the thread of ``active`` (a run whose task was cancelled from outside while its
        plain handler worked) returns, settle it on the event loop (:meth:`_settle_orphan`).
        Before, its lease was renewed, and its slot held, until the scheduler stopped."""
        call = active.thread
        assert call is not None
        loop = asyncio.get_running_loop()

        def returned(_: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the stop settled it
                loop.call_soon_threadsafe(self._settle_orphan, active)

        call.add_done_callback(returned)

    def _settle_orphan(self, active: ActiveRun) -> None:
        """The thread of an orphaned run returned: record its result now (:meth:`drain`
        waits for the recording), unless a stop has taken the run over already."""
        if active not in self.abandoned:
            return  # drain() waits for it and records it
        self.abandoned.remove(active)
        task = asyncio.ensure_future(self._await_threads([active], self.clock.monotonic_ms()))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _stop_keeping(self, active: ActiveRun) -> None:
        """Stop renewing ``active``'s lease (an orphaned thread's, kept until now)."""
        if self.keeper is not None and active.kept:
            self.keeper.discard(active)
        active.ctx._deadline = None

    def stubborn(self) -> list[asyncio.Task[Any]]:
        """Runs whose handlers ignored their cancellation and still work (after :meth:`drain`)."""
        return [a.task for a in self.active.values() if _still_in_handler(a) and a.task]


def _orphaned(active: ActiveRun) -> bool:
    """The run's task was cancelled from outside (not by the scheduler) while its plain
    handler's thread still works: the stop waits for that thread (:meth:`RunExecutor.drain`)."""
    return active.thread_running and active.cancel_reason is None


def _thread_outcome(active: ActiveRun, call: concurrent.futures.Future[Any]) -> Outcome | None:
    """The outcome of a plain handler's ``call`` (done) that its run's task no longer waited
    for, as :meth:`RunExecutor._run_handler` would have made it; None: the handler saw its
    lease lost (the run is left to a backup)."""
    exc = call.exception()
    job = active.job
    if exc is None:
        if active.ctx._timed_out:
            return RunStatus.FAILED, f"timed out after timeout_ms={job.timeout_ms}", None
        return _SUCCEEDED
    if isinstance(exc, LeaseLost) and active.ticket.attempt < job.policy.max_attempts:
        return None
    if isinstance(exc, Exception):
        return RunStatus.FAILED, f"{type(exc).__name__}: {exc}", exc
    return RunStatus.FAILED, _describe_base(exc), exc


def _still_in_handler(active: ActiveRun) -> bool:
    """The run's task is alive and still inside the handler's code."""
    return active.in_handler and active.task is not None and not active.task.done()


async def _all_or_sleep(
    tasks: Sequence[asyncio.Future[Any]],
    sleep: Coroutine[Any, Any, None],
    limit_s: float,
    until: asyncio.Event | None = None,
) -> None:
    """Wait until every task is done, ``sleep`` (a clock's sleep) ends, ``limit_s`` pass, or
    ``until`` is set."""
    waits: set[asyncio.Future[Any]] = {
        asyncio.ensure_future(sleep),
        asyncio.ensure_future(asyncio.wait(tasks)),
    }
    if until is not None:
        waits.add(asyncio.ensure_future(until.wait()))
    try:
        await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _fresh(ticket: Ticket) -> bool:
    """More than a third of the lease was left when the backend answered."""
    return _lease_left(ticket) > ticket.lease_ms // 3


def _lease_left(ticket: Ticket) -> int:
    """How much of the lease the backend said was left when it answered (ms)."""
    if ticket.lease_expires_at_ms is None or ticket.backend_now_ms is None:
        return ticket.lease_ms
    return ticket.lease_expires_at_ms - ticket.backend_now_ms


def _leave_if_forked(pid: int, exc: BaseException | None) -> None:
    """End this process if it is not ``pid``, the scheduler's: a child the handler forked
    (``os.fork()``) that came back out of the handler, returning (status 0) or raising (the
    status ``sys.exit()`` gave, else 1). It would otherwise run on as a copy of the scheduler:
    a plain handler's child waiting for ever on the handler thread's queue, deaf to SIGTERM;
    an async handler's child running the event loop on its parent's backend connections.
    ``os._exit``: the parent's clean-up (atexit, the backend's ``stop()``) is not the child's."""
    if os.getpid() == pid:
        return
    code = 0 if exc is None else 1
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _call_plain(handler: Callable[[RunContext], Any], ctx: RunContext) -> Any:
    """Call a plain handler on its thread; fail its run if it returned work it did not do.

    A plain handler's result is dropped: a coroutine it returns (an ``async def`` behind a
    plain decorator, ``lambda ctx: work(ctx)``) would be recorded ``succeeded`` with its body
    never run. Awaiting it on the loop instead would break what a plain handler promises
    (its run keeps its lease past a timeout, and it runs on after a lost lease where async code
    is cancelled: docs/guarantees.md), so the run fails, saying what to write. A coroutine or
    generator is closed here, so no "never awaited" warning follows.
    """
    pid = os.getpid()
    try:
        result = handler(ctx)
    except BaseException as exc:
        _leave_if_forked(pid, exc)
        raise
    _leave_if_forked(pid, None)
    if result is not None and (inspect.isawaitable(result) or _is_generator(result)):
        if inspect.iscoroutine(result) or inspect.isgenerator(result):
            result.close()
        raise TypeError(
            f"the plain handler returned {_kind(result)}, which anarchon does not "
            "await or iterate: what a plain 'def' handler returns is dropped, so that work was "
            "not done. Make the handler 'async def' (a decorator of an async handler must "
            "itself be 'async def' and 'return await func(ctx)'), or do the work in the plain "
            "handler itself"
        )
    return result


def _is_generator(value: object) -> bool:
    return inspect.isgenerator(value) or inspect.isasyncgen(value)


def _kind(value: object) -> str:
    """``a coroutine 'work'``, ``an awaitable Future``: what a plain handler returned."""
    if inspect.iscoroutine(value):
        kind = "a coroutine"
    elif inspect.isasyncgen(value):
        kind = "an async generator"
    elif inspect.isgenerator(value):
        kind = "a generator"
    else:
        return f"an awaitable {type(value).__qualname__}"
    return f"{kind} {getattr(value, '__qualname__', '?')!r}"


def _describe_base(exc: BaseException) -> str:
    """A handler's BaseException (not an Exception) as its run's error."""
    if isinstance(exc, SystemExit):
        return (
            f"SystemExit({exc.code!r}): the handler called sys.exit() or raised SystemExit; "
            "a handler's exit fails its run, never the scheduler"
        )
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{text} (raised by the handler; it fails its run, never the scheduler)"


def _log(
    level: int,
    action: Action,
    ticket: Ticket,
    msg: str,
    *args: Any,
    exc_info: BaseException | None = None,
    **more: Any,
) -> None:
    logger.log(
        level, msg, *args, exc_info=exc_info, extra=log_fields(action, ticket=ticket, **more)
    )
