"""Background loops that never die silently: an unexpected error is logged with its traceback and
the loop starts again after a pause that grows while it keeps failing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from ._retry import backoff
from .logs import Action, log_fields

__all__ = ["supervised"]

logger = logging.getLogger("anarchon.scheduler")

FIRST_PAUSE_S: Final = 1.0
MAX_PAUSE_S: Final = 60.0


async def supervised(
    name: str,
    loop: Callable[[], Awaitable[None]],
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Run ``loop()`` until it returns or the task is cancelled; restart it after an error.

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
        if time.monotonic() - began > MAX_PAUSE_S:
            pauses = backoff(FIRST_PAUSE_S, MAX_PAUSE_S)
        await wait(next(pauses))
