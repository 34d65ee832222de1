"""Running one attempt: the handler, its lease renewal, its timeout, its result and hand-over."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ._batch import Coalescer
from ._clock import Clock
from ._context import RunContext
from ._job import Job
from ._models import Run, RunStatus, ms_to_datetime
from ._retry import backoff
from .backend import Backend, FinishRequest, LeaseBackend, Ticket
from .errors import BackendError, BackendUnavailable, LeaseLost

__all__ = ["ActiveRun", "RunExecutor"]

logger = logging.getLogger("anarchon.scheduler")

HANDED_OVER = "handed over"
LEASE_LOST = "lease lost"
STOPPED = "stopped"


@dataclass(eq=False)
class ActiveRun:
    """An attempt this instance is running."""

    job: Job
    ticket: Ticket
    ctx: RunContext
    handler_task: asyncio.Future[Any] | None = None
    cancel_reason: str | None = None
    result: asyncio.Future[Run | None] = field(default_factory=asyncio.Future)
    task: asyncio.Future[None] | None = None


class RunExecutor:
    """Runs won tickets: calls the handler, renews the lease, records the result."""

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
        if isinstance(backend, LeaseBackend):
            self._renewals: Coalescer[Ticket, Ticket] = Coalescer(backend.renew_many)

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
        _log(
            logging.INFO,
            "run_started",
            ticket,
            "running %s attempt %d (fence %s)",
            job.name,
            ticket.attempt,
            ticket.fence,
        )
        active.handler_task = asyncio.ensure_future(self._call(job, active.ctx))
        renewer = None
        if isinstance(self._backend, LeaseBackend) and ticket.lease_expires_at_ms is not None:
            renewer = asyncio.ensure_future(self._renew_loop(active))
        try:
            outcome = await self._outcome(active)
        finally:
            if renewer is not None:
                renewer.cancel()
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

    async def _call(self, job: Job, ctx: RunContext) -> Any:
        if job.is_async:
            return await job.handler(ctx)
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, job.handler, ctx)
        return await loop.run_in_executor(self._executor, call)

    async def _outcome(self, active: ActiveRun) -> tuple[RunStatus, str | None] | None:
        """The handler's result as (status, error), or None if we cancelled it."""
        assert active.handler_task is not None
        timeout = active.job.timeout_ms
        try:
            if timeout is None:
                await active.handler_task
            else:
                await asyncio.wait_for(active.handler_task, timeout / 1000)
        except TimeoutError:
            if active.cancel_reason is not None:
                return None
            return RunStatus.FAILED, f"timed out after timeout_ms={timeout}"
        except asyncio.CancelledError:
            if active.cancel_reason is None:
                raise
            return None
        except Exception as exc:
            logger.warning(
                "job %s failed: %s",
                active.job.name,
                exc,
                exc_info=True,
                extra=_fields("run_failed", active.ticket),
            )
            return RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
        return RunStatus.SUCCEEDED, None

    async def _renew_loop(self, active: ActiveRun) -> None:
        backend = self._backend
        assert isinstance(backend, LeaseBackend)
        ticket = active.ticket
        # Renew at a third of the lease, so two renewals can fail before it expires.
        interval = ticket.lease_ms / 3 / 1000
        deadline = _local_expiry(self._clock.now_ms(), ticket)
        while True:
            await self._clock.sleep(interval)
            sent = self._clock.now_ms()
            try:
                ticket = await self._renewals.submit(ticket)
            except LeaseLost as exc:
                self._lose(active, f"{LEASE_LOST}: {exc}")
                return
            except BackendError as exc:
                if self._clock.now_ms() >= deadline:
                    self._lose(active, f"{LEASE_LOST}: could not renew before expiry ({exc})")
                    return
                _log(
                    logging.WARNING,
                    "renew_failed",
                    ticket,
                    "renewing %s failed: %s",
                    ticket.job,
                    exc,
                )
                interval = min(interval, 1.0)
                continue
            active.ticket = ticket
            deadline = _local_expiry(sent, ticket)
            interval = ticket.lease_ms / 3 / 1000

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
        active.cancel_reason = reason
        active.ctx._mark_lost(reason)
        if active.handler_task is not None:
            active.handler_task.cancel()

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
