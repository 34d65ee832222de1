"""Background loops that never die silently: an unexpected error is logged with its traceback and
the loop starts again after a pause that grows while it keeps failing; and tasks that stop when
told, within a bound, even when they swallow their cancellation."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from ._retry import backoff
from .logs import Action, log_fields

__all__ = ["cancel_and_wait", "consume", "supervised", "wait_unless"]

logger = logging.getLogger("anarchon.scheduler")
_SCHEDULER_LOGGER: Final = logger  # cancel_and_wait's default (its parameter shadows the name)

FIRST_PAUSE_S: Final = 1.0
MAX_PAUSE_S: Final = 60.0


async def supervised(
    name: str,
    loop: Callable[[], Awaitable[None]],
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Run ``loop()`` until it returns or the task is cancelled; restart it after an error, or
    after a ``CancelledError`` while the task was not cancelled (``Task.cancelling()``).

    The pause before a restart doubles from :data:`FIRST_PAUSE_S` up to :data:`MAX_PAUSE_S` and
    starts over once the loop has run for longer than that without failing. ``sleep`` waits
    that pause (default ``asyncio.sleep``; the scheduler passes its clock's).
    """
    wait = sleep or asyncio.sleep
    pauses = backoff(FIRST_PAUSE_S, MAX_PAUSE_S)
    while True:
        began = time.monotonic()
        try:
            await loop()
            return
        except Exception:
            logger.exception(
                "background loop %r failed; restarting it",
                name,
                extra=log_fields(Action.LOOP_FAILED, loop=name),
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this task was cancelled: the loop ends
            # Nobody cancelled this task (a driver turned its own timeout into one): before, it
            # ended the loop, unlogged, for the rest of the process.
            logger.exception(
                "background loop %r ended by a CancelledError its task was not asked for; "
                "restarting it",
                name,
                extra=log_fields(Action.LOOP_FAILED, loop=name),
            )
        if time.monotonic() - began > MAX_PAUSE_S:
            pauses = backoff(FIRST_PAUSE_S, MAX_PAUSE_S)
        await wait(next(pauses))


def consume(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of an abandoned task as seen (a done callback): nobody awaits it, and
    asyncio does not report its error as "never retrieved". Logs nothing."""
    if not task.cancelled():
        task.exception()


async def wait_unless(task: asyncio.Future[Any], other: Awaitable[Any]) -> bool:
    """Wait for ``task`` unless ``other`` (run as a task of its own) ends first; ``other`` is
    cancelled either way, ``task`` never: the caller decides what becomes of it when it is still
    running. True if ``task`` is done."""
    rival = asyncio.ensure_future(other)
    try:
        await asyncio.wait({task, rival}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        rival.cancel()
    return task.done()


async def cancel_and_wait(
    tasks: Sequence[asyncio.Future[Any]],
    limit_s: float = 5.0,
    *,
    logger: logging.Logger | None = None,
) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again while any is left: a library that
    swallows a cancellation (some drivers' timeouts do) must not make stop() hang. A task still
    running after ``limit_s`` is left behind, logged, and what it ends with later is consumed
    as below.

    The outcome of every task that ended is consumed: an error one ended with (instead of its
    cancellation, or before it) is logged with its traceback, never raised, and asyncio does
    not report it again ("Task exception was never retrieved").

    ``logger``: where both are logged (action ``stop``), the caller's own (a backend passes
    its ``anarchon.backends.<name>``); default ``anarchon.scheduler``."""
    log = _SCHEDULER_LOGGER if logger is None else logger
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    pending = {t for t in tasks if not t.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.25)
    for task in tasks:
        if task.done():
            _log_failure(task, log)
    if pending:
        for task in pending:  # what it ends with later is consumed as the others' was
            task.add_done_callback(functools.partial(_log_failure, log=log))
        names = ", ".join(sorted(t.get_name() for t in pending if isinstance(t, asyncio.Task)))
        log.warning(
            "%d task(s) did not stop when cancelled (%s); left behind",
            len(pending),
            names,
            extra=log_fields(Action.STOP),
        )


def _log_failure(task: asyncio.Future[Any], log: logging.Logger) -> None:
    """Retrieve the outcome of ``task``, ended: log the error it ended with, if any, on
    ``log``."""
    if task.cancelled() or (exc := task.exception()) is None:
        return
    log.warning(
        "task %s ended by %s when stopped; going on without it",
        task.get_name() if isinstance(task, asyncio.Task) else repr(task),
        type(exc).__name__,
        exc_info=exc,
        extra=log_fields(Action.STOP),
    )
