"""Clocks: the wall clock the scheduler fires by, replaceable in tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Protocol

__all__ = ["Clock", "SystemClock", "sleep_or_wake"]

# asyncio sleeps in whole milliseconds (epoll), rounding up. A precise wait sleeps until this
# close to its target, then yields to the loop until the clock reaches it.
SPIN_MS = 2.0


class Clock(Protocol):
    """Where the scheduler reads the time and how it waits."""

    def now_ms(self) -> int:
        """Wall-clock time, epoch milliseconds (UTC)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        """Wait until :meth:`now_ms` reaches ``wall_ms``; ``precise`` asks not to overshoot."""


class SystemClock:
    """The machine's clock and ``asyncio.sleep``."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in milliseconds."""
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        """Sleep with asyncio."""
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        """Sleep until the wall clock reads ``wall_ms``.

        The delay is computed from the clock's full precision; a precise wait stops short by
        :data:`SPIN_MS` and then yields until the target, so a slot's claim is not sent up to
        two milliseconds late (asyncio's timers wake in whole milliseconds, rounding up).
        """
        remaining_ms = wall_ms - time.time_ns() / 1_000_000
        if precise:
            if remaining_ms > SPIN_MS:
                await asyncio.sleep((remaining_ms - SPIN_MS) / 1000)
            while time.time_ns() // 1_000_000 < wall_ms:  # noqa: ASYNC110 - a bounded spin
                await asyncio.sleep(0)
        elif remaining_ms > 0:
            await asyncio.sleep(remaining_ms / 1000)


async def sleep_or_wake(sleep: Coroutine[Any, Any, None], wake: asyncio.Event) -> None:
    """Wait for ``sleep`` (a coroutine) or for ``wake`` to be set, whichever comes first."""
    sleeper = asyncio.ensure_future(sleep)
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waker.cancel()
