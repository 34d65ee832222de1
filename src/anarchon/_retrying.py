"""Retries on failure and the ``on_failure`` hook.

When a run's handler fails (it raised or timed out), its retry number ``n`` (0 for the first
run of a slot, ``n`` for a run under ``<slot key>-retry-<n>``) is compared with the job's
``retries``: below it, a :class:`~anarchon.control.RunRequest` for retry ``n + 1`` is made, due
after the backoff (``min(retry_backoff_ms * 2**n, retry_backoff_max_ms)``, jittered uniformly
down to half of it), and sent with the ``failed`` result
(:attr:`~anarchon.backend.FinishRequest.retry`): the backend stores both in one atomic step,
so a process that dies right after its failed result was accepted cannot lose the retry, and a
refused result stores none. Every instance that carries the job sees the request
(:mod:`._requests`) and one of them runs it. Its id is derived from the job, the slot key and
``n + 1``, so storing it twice stores it once.

Otherwise the slot has finally failed, and the job's ``on_failure`` hook is called with the
failed run, on this instance (the one that recorded the final failure). A backup whose takeover
was answered ``exhausted`` calls it too. The hook's exceptions are logged, never raised.

Runs whose result was refused (the lease moved on), that were cancelled on stop, or that were
taken over are not retried here: their slot's fate belongs to whoever holds it now.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ._clock import BackendTime
from ._job import Job
from ._metrics import Counters
from ._models import Run, Trigger
from .backend import Ticket
from .control import ControlStore, RunRequest, retry_key
from .logs import Action, log_fields

__all__ = ["Failures", "retry_number", "retry_request_id"]

logger = logging.getLogger("anarchon.scheduler")

RETRY_MARK: Final = "-retry-"
# An on_failure hook gets this long (s); it is then left to itself and logged.
HOOK_TIMEOUT_S: Final = 60.0


def retry_number(slot_key: str) -> int:
    """The retry number of the run under ``slot_key``: ``n`` for ``<key>-retry-<n>``, else 0."""
    _, mark, tail = slot_key.rpartition(RETRY_MARK)
    return int(tail) if mark and tail.isdigit() else 0


def retry_request_id(job: str, slot_key: str, retry: int) -> str:
    """The id (32 hex digits) of the request for retry number ``retry`` of ``job``'s slot under
    ``slot_key`` (any of its retries' keys): the same on every instance and every call."""
    base = slot_key.split(RETRY_MARK, 1)[0]
    return hashlib.sha256(f"{job}\0{base}\0{retry}".encode()).hexdigest()[:32]


def jittered(delay_ms: int) -> int:
    """A delay drawn uniformly from ``[delay_ms / 2, delay_ms]``."""
    low = delay_ms // 2
    return low + random.randint(0, delay_ms - low)


@dataclass(eq=False)
class Failures:
    """Decides, for each failed run, between a retry and the job's ``on_failure`` hook."""

    _control: ControlStore | None
    _backend_time: BackendTime
    _counters: Counters

    def retry_for(self, job: Job, ticket: Ticket) -> RunRequest | None:
        """The run request of the retry of ``ticket``'s run, whose handler failed, to send
        with its ``failed`` result; None if the slot has no retry left or the backend keeps no
        run requests (the slot then finally fails)."""
        done = retry_number(ticket.slot_key)
        if done >= job.retry.retries or self._control is None:
            return None
        retry = done + 1
        now = self._backend_time.now_ms()
        return RunRequest(
            id=retry_request_id(job.name, ticket.slot_key, retry),
            job=job.name,
            trigger=Trigger.RETRY,
            key=retry_key(ticket.slot_key, retry),
            slot=ticket.slot,
            due_ms=now + jittered(job.retry.delay_ms(retry)),
            requested_by=f"retry {retry} of {job.retry.retries} after run {ticket.run_id}",
            requested_at_ms=now,
            retry=retry,
        )

    async def failed(self, job: Job, ticket: Ticket, run: Run, retry: RunRequest | None) -> None:
        """The handler of ``ticket``'s run failed and ``run`` (its ``failed`` record) was
        accepted, with ``retry`` (:meth:`retry_for`) stored in the same step: log the retry,
        or call the hook if there is none. Never raises."""
        if retry is None:
            await self.finally_failed(job, run)
            return
        self._counters.retries_scheduled += 1
        logger.warning(
            "job %s failed (%s); retry %d of %d stored, due in %d ms",
            job.name,
            run.error,
            retry.retry,
            job.retry.retries,
            retry.due_ms - retry.requested_at_ms,
            extra=log_fields(
                Action.RETRY_SCHEDULED, ticket=ticket, retry=retry.retry, due_ms=retry.due_ms
            ),
        )

    async def finally_failed(self, job: Job, run: Run) -> None:
        """Call ``job``'s ``on_failure`` hook with ``run`` (if it has one); log what it raises.
        A plain hook runs on a thread of its own, an async one on this loop; either gets
        :data:`HOOK_TIMEOUT_S`."""
        hook = job.options.on_failure
        if hook is None:
            return
        extra = log_fields(Action.FAILURE_HOOK, run.job, run.slot_ms, run_id=run.run_id)
        logger.info("calling on_failure of %s (run %s)", run.job, run.run_id, extra=extra)
        failed = log_fields(Action.FAILURE_HOOK_FAILED, run.job, run.slot_ms, run_id=run.run_id)
        try:
            await asyncio.wait_for(_call(hook, run), HOOK_TIMEOUT_S)
        except Exception as exc:
            self._counters.failure_hook_errors += 1
            logger.error(
                "on_failure of %s raised (run %s): %s",
                run.job,
                run.run_id,
                f"{type(exc).__name__}: {exc}",
                exc_info=exc,
                extra=failed,
            )


async def _call(hook: Callable[[Run], Any], run: Run) -> None:
    if _is_async(hook):
        await hook(run)
        return
    result = await asyncio.to_thread(hook, run)
    if inspect.isawaitable(result):  # a plain callable that returned a coroutine
        await result


def _is_async(hook: Any) -> bool:
    target = hook
    while hasattr(target, "func"):  # functools.partial
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004
    )
