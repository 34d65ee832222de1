"""Clocks: the wall clock the scheduler fires by, replaceable in tests."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Where the scheduler reads the time and how it waits."""

    def now_ms(self) -> int:
        """Wall-clock time, epoch milliseconds (UTC)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""


class SystemClock:
    """The machine's clock and ``asyncio.sleep``."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in milliseconds."""
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        """Sleep with asyncio."""
        await asyncio.sleep(max(0.0, seconds))
