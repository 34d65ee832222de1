"""Running attempts: the handler, its timeout, its result and hand-over; and one lease keeper
that renews every running attempt's lease.

A run costs one task. Leases are renewed by a single :class:`LeaseKeeper` in batches, so ten
thousand jobs sharing a slot do not start ten thousand renewal loops.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ._batch import Coalescer
from ._clock import Clock, sleep_or_wake
from ._context import RunContext
from ._job import Job
from ._models import Run, RunStatus, ms_to_datetime
from ._retry import backoff
from .backend import Backend, FinishRequest, LeaseBackend, Ticket
from .errors import BackendError, BackendUnavailable, LeaseLost

__all__ = ["ActiveRun", "LeaseKeeper", "RunExecutor"]

logger = logging.getLogger("anarchon.scheduler")

HANDED_OVER = "handed over"
LEASE_LOST = "lease lost"
STOPPED = "stopped"
# While renewals fail, retry at least this often (ms) until the lease is over.
RENEW_RETRY_MS = 1_000


@dataclass(eq=False)
class ActiveRun:
    """An attempt this instance is running."""

    job: Job
    ticket: Ticket
    ctx: RunContext
    task: asyncio.Task[None] | None = None
    in_handler: bool = False
    cancel_reason: str | None = None
    result: asyncio.Future[Run | None] = field(default_factory=asyncio.Future)
    # Lease bookkeeping (local clock, ms): when to renew next, and when the lease surely ends.
    renew_at: int = 0
    deadline: int = 0


class RunExecutor:
    """Runs won tickets: calls the handler, records the result, hands over on stop."""

    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        executor: Executor,
        counters: dict[str, int],
        grace_ms: int,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._executor = executor
        self._counters = counters
        self._grace_ms = grace_ms
        self.active: dict[str, ActiveRun] = {}
        self._results: Coalescer[FinishRequest, Run] = Coalescer(backend.finish_many)
        self.keeper: LeaseKeeper | None = None
        if isinstance(backend, LeaseBackend):
            self.keeper = LeaseKeeper(backend, clock, self._lose)

    def start(self, job: Job, ticket: Ticket) -> ActiveRun:
        """Begin running ``ticket`` in a task; return its handle."""
        ctx = RunContext(
            job=job.name,
            slot=ms_to_datetime(ticket.slot),
            run_id=ticket.run_id,
            attempt=ticket.attempt,
            fence=ticket.fence,
            trigger=ticket.trigger,
            instance=ticket.instance,
        )
        active = ActiveRun(job=job, ticket=ticket, ctx=ctx)
        self.active[ticket.run_id] = active
        active.task = asyncio.get_running_loop().create_task(self._execute(active))
        active.task.add_done_callback(lambda _t: self.active.pop(ticket.run_id, None))
        return active

    async def _execute(self, active: ActiveRun) -> None:
        try:
            run = await self._execute_inner(active)
        except BaseException as exc:
            if not active.result.done():
                active.result.set_exception(exc)
            raise
        if not active.result.done():
            active.result.set_result(run)

    async def _execute_inner(self, active: ActiveRun) -> Run | None:
        ticket, job = active.ticket, active.job
        if logger.isEnabledFor(logging.INFO):
            _log(
                logging.INFO,
                "run_started",
                ticket,
                "running %s attempt %d (fence %s)",
                job.name,
                ticket.attempt,
                ticket.fence,
            )
        leased = self.keeper is not None and ticket.lease_expires_at_ms is not None
        if leased:
            assert self.keeper is not None
            self.keeper.add(active)
        try:
            outcome = await self._run_handler(active)
        finally:
            if leased:
                assert self.keeper is not None
                self.keeper.discard(active)
        ticket = active.ticket  # renewed by the keeper meanwhile
        if outcome is not None:
            return await self._finish(active, *outcome)
        if active.cancel_reason == HANDED_OVER:
            await self._release(active)
        else:
            # The lease is lost: a backup takes the run over (or has); recording our own
            # cancellation as the run's result would end the slot without running it.
            _log(
                logging.INFO,
                "left_to_backup",
                ticket,
                "left %s attempt %d to a backup",
                job.name,
                ticket.attempt,
            )
        return None

    async def _run_handler(self, active: ActiveRun) -> tuple[RunStatus, str | None] | None:
        """Call the handler; return (status, error), or None if we cancelled it ourselves."""
        job, ctx = active.job, active.ctx
        timeout = job.timeout_ms
        active.in_handler = True
        try:
            if timeout is None:
                await self._call(job, ctx)
            else:
                async with asyncio.timeout(timeout / 1000):
                    await self._call(job, ctx)
        except TimeoutError:
            return RunStatus.FAILED, f"timed out after timeout_ms={timeout}"
        except asyncio.CancelledError:
            if active.cancel_reason is None:
                raise  # not ours: the scheduler is abandoning the run
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return None
        except Exception as exc:
            logger.warning(
                "job %s failed: %s",
                job.name,
                exc,
                exc_info=True,
                extra=_fields("run_failed", active.ticket),
            )
            return RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            active.in_handler = False
        return RunStatus.SUCCEEDED, None

    async def _call(self, job: Job, ctx: RunContext) -> Any:
        if job.is_async:
            return await job.handler(ctx)
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, job.handler, ctx)
        # Cancelling the await leaves the thread running: plain handlers cannot be interrupted,
        # but their lease is released and their late result refused.
        return await loop.run_in_executor(self._executor, call)

    def _lose(self, active: ActiveRun, reason: str) -> None:
        self._counters["lease_lost"] += 1
        _log(
            logging.WARNING,
            "lease_lost",
            active.ticket,
            "job %s attempt %d: %s",
            active.job.name,
            active.ticket.attempt,
            reason,
        )
        self._cancel(active, reason)

    def _cancel(self, active: ActiveRun, reason: str) -> None:
        if active.cancel_reason is not None:
            return
        active.cancel_reason = reason
        active.ctx._mark_lost(reason)
        if active.in_handler and active.task is not None:
            active.task.cancel()

    async def _finish(self, active: ActiveRun, status: RunStatus, error: str | None) -> Run | None:
        ticket = active.ticket
        for delay in backoff():
            try:
                run = await self._results.submit((ticket, status, error))
            except LeaseLost as exc:
                self._counters["result_refused"] += 1
                _log(
                    logging.WARNING,
                    "result_refused",
                    ticket,
                    "result of %s attempt %d refused: %s",
                    ticket.job,
                    ticket.attempt,
                    exc,
                )
                return None
            except BackendUnavailable as exc:
                _log(
                    logging.WARNING,
                    "finish_retry",
                    ticket,
                    "recording %s failed, retrying: %s",
                    ticket.job,
                    exc,
                )
                await self._clock.sleep(delay)
                continue
            self._counters[f"runs_{status.value}"] += 1
            level = logging.INFO if status is RunStatus.SUCCEEDED else logging.WARNING
            if logger.isEnabledFor(level):
                _log(
                    level,
                    f"run_{status.value}",
                    ticket,
                    "job %s %s (attempt %d)%s",
                    ticket.job,
                    status.value,
                    ticket.attempt,
                    f": {error}" if error else "",
                )
            return run
        raise AssertionError("unreachable")  # pragma: no cover

    async def _release(self, active: ActiveRun) -> None:
        ticket = active.ticket
        backend = self._backend
        if isinstance(backend, LeaseBackend) and active.job.policy.handover:
            try:
                await backend.release(ticket, HANDED_OVER)
            except BackendError as exc:
                _log(
                    logging.WARNING,
                    "handover_failed",
                    ticket,
                    "could not hand %s over (%s); a backup takes over at lease expiry",
                    ticket.job,
                    exc,
                )
                return
            self._counters["handed_over"] += 1
            _log(
                logging.INFO,
                "handed_over",
                ticket,
                "handed %s attempt %d over to a backup",
                ticket.job,
                ticket.attempt,
            )
            return
        reason = (
            f"{STOPPED}: the scheduler stopped before the handler finished "
            f"(grace_ms={self._grace_ms})"
        )
        await self._finish(active, RunStatus.FAILED, reason)

    async def stop(self, grace_ms: int) -> None:
        """Wait up to ``grace_ms`` for running handlers; hand over or fail what is left."""
        pending = [a.result for a in self.active.values()]
        if pending:
            await asyncio.wait(pending, timeout=grace_ms / 1000)
        leftover = [a for a in self.active.values() if not a.result.done()]
        for active in leftover:
            self._cancel(active, HANDED_OVER)
        if leftover:
            # Give the cancelled handlers and the release/finish calls a bounded time; a call
            # still stuck after that (an unreachable backend) is abandoned: the lease expires
            # and a backup takes the run over.
            await asyncio.wait([a.result for a in leftover], timeout=10)
            for active in leftover:
                if active.task is not None and not active.task.done():
                    active.task.cancel()


class LeaseKeeper:
    """Renews the leases of every running attempt, in batches, from one task.

    Each lease is renewed at a third of its length, so two renewals can fail before it
    expires. Renewals that fall due together go to the backend in one ``renew_many`` call.
    """

    def __init__(self, backend: LeaseBackend, clock: Clock, on_lost: Any) -> None:
        self._backend = backend
        self._clock = clock
        self._on_lost = on_lost
        self._heap: list[tuple[int, int, ActiveRun]] = []
        self._seq = 0
        self._live: set[ActiveRun] = set()
        self._wake = asyncio.Event()

    def add(self, active: ActiveRun) -> None:
        """Keep ``active``'s lease from now on."""
        now = self._clock.now_ms()
        ticket = active.ticket
        active.deadline = _local_expiry(now, ticket)
        self._live.add(active)
        self._push(active, now + ticket.lease_ms // 3)

    def discard(self, active: ActiveRun) -> None:
        """Stop renewing ``active`` (it finished, or is being handed over)."""
        self._live.discard(active)

    def __len__(self) -> int:
        return len(self._live)

    def _push(self, active: ActiveRun, at: int) -> None:
        self._seq += 1
        active.renew_at = at
        heapq.heappush(self._heap, (at, self._seq, active))
        if self._heap[0][2] is active:
            self._wake.set()

    async def run(self) -> None:
        """Renew leases as they fall due, until cancelled."""
        while True:
            now = self._clock.now_ms()
            due: list[ActiveRun] = []
            while self._heap and self._heap[0][0] <= now:
                at, _, active = heapq.heappop(self._heap)
                if active in self._live and active.renew_at == at:
                    due.append(active)
            if due:
                await self._renew(due)
                continue
            delay = (self._heap[0][0] - now) / 1000 if self._heap else 30.0
            self._wake.clear()
            await sleep_or_wake(self._clock.sleep(min(delay, 30.0)), self._wake)

    async def _renew(self, due: list[ActiveRun]) -> None:
        sent = self._clock.now_ms()
        try:
            answers: list[Ticket | BackendError] | None = await self._backend.renew_many(
                [a.ticket for a in due]
            )
        except BackendError as exc:
            answers = None
            error: BackendError = exc
        now = self._clock.now_ms()
        for n, active in enumerate(due):
            if active not in self._live:
                continue
            answer = answers[n] if answers is not None else None
            if isinstance(answer, BackendError) and not isinstance(answer, LeaseLost):
                error, answer = answer, None  # this item alone failed: as if the call had
            if isinstance(answer, Ticket):
                active.ticket = answer
                active.deadline = _local_expiry(sent, answer)
                self._push(active, now + answer.lease_ms // 3)
            elif isinstance(answer, LeaseLost):
                self._live.discard(active)
                self._on_lost(active, f"{LEASE_LOST}: {answer}")
            elif now >= active.deadline:
                self._live.discard(active)
                self._on_lost(active, f"{LEASE_LOST}: could not renew before expiry ({error})")
            else:
                if n == 0:
                    _log(
                        logging.WARNING,
                        "renew_failed",
                        active.ticket,
                        "renewing %d lease(s) failed: %s",
                        len(due),
                        error,
                    )
                self._push(active, now + min(RENEW_RETRY_MS, active.ticket.lease_ms // 3))


def _local_expiry(local_sent_ms: int, ticket: Ticket) -> int:
    if ticket.lease_expires_at_ms is None or ticket.backend_now_ms is None:
        return local_sent_ms + ticket.lease_ms
    return local_sent_ms + (ticket.lease_expires_at_ms - ticket.backend_now_ms)


def _fields(action: str, ticket: Ticket) -> dict[str, Any]:
    return {
        "job": ticket.job,
        "slot": ticket.slot,
        "action": action,
        "run_id": ticket.run_id,
        "attempt": ticket.attempt,
        "fence": ticket.fence,
    }


def _log(level: int, action: str, ticket: Ticket, msg: str, *args: Any) -> None:
    logger.log(level, msg, *args, extra=_fields(action, ticket))
