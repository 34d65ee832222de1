"""Calling a run's handler and what came of it (its :data:`Outcome`): :class:`HandlerCalls`,
a mixin of :class:`~anarchon._runner.RunExecutor`, on the per-run path.

An ``async def`` handler is awaited in its run's task, under ``timeout_ms`` if it has one. A
plain (non-async) handler runs on :class:`~anarchon._threads.HandlerThreads`: a thread is
reserved before the slot is claimed, and a thread that runs past ``timeout_ms`` keeps its run's
lease until it really returns (a thread cannot be stopped from outside). A handler's exception,
``sys.exit()`` included, fails its run, never the scheduler; a child process it forked that comes
back out of it is ended there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._active import ActiveRun
from ._active import log_run as _log
from ._context import RunContext
from ._models import RunStatus
from ._supervisor import consume
from ._threads import HandlerThreads, NoThreadFree
from .errors import LeaseLost
from .logs import Action

if TYPE_CHECKING:
    from ._clock import Clock
    from ._metrics import Counters

__all__ = ["HandlerCalls", "Outcome", "thread_outcome"]


Outcome = tuple[RunStatus, str | None, BaseException | None]
"""(status, error text, the exception to log with its traceback). The text is raw: secrets in
it are masked where it becomes a result (:class:`~anarchon._results.ResultRecorder`)."""
# A handler's success, the one outcome of nearly every run: one object, not one per run (and
# no read of RunStatus.SUCCEEDED, which costs 0.15-0.2 us on Python 3.11: EnumType.__getattr__).
_SUCCEEDED: Final[Outcome] = (RunStatus.SUCCEEDED, None, None)


class HandlerCalls:
    """The executor's calls of handlers (a mixin of :class:`~anarchon._runner.RunExecutor`,
    whose fields these are): :meth:`_run_handler` and the async and thread calls under it."""

    clock: Clock
    counters: Counters
    threads: HandlerThreads
    abandoned: list[ActiveRun]

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
        """Await an async handler under its ``timeout_ms``; its outcome."""
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
        """Call a plain handler on its reserved (or a free) handler thread; its outcome."""
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
        """Wait for a plain handler's thread (``waiting``), past ``timeout_ms`` too; its outcome."""
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


def thread_outcome(active: ActiveRun, call: concurrent.futures.Future[Any]) -> Outcome | None:
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
    """A generator or an async generator."""
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
