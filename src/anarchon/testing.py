"""Tools for testing your own jobs: the in-memory backend and a clock you move by hand.

Example::

    clock = FakeClock(start_ms=1_767_225_600_000)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    ...
    await clock.advance(60_000)   # one minute passes; due slots fire
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from .backends.memory import MemoryBackend

__all__ = ["FakeClock", "MemoryBackend"]


class FakeClock:
    """A wall clock that only moves when told to; ``sleep`` waits for :meth:`advance`."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._now = start_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        """The current fake time, epoch milliseconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the fake time has moved ``seconds`` forward."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + int(seconds * 1000), next(self._seq), future))
        await future

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        """Wait until the fake time reaches ``wall_ms``."""
        await self.sleep((wall_ms - self._now) / 1000)

    async def advance(self, ms: int, *, step_ms: int = 100) -> None:
        """Move time forward by ``ms`` in steps, letting due sleepers and their work run."""
        target = self._now + ms
        while self._now < target:
            self._now = min(target, self._now + step_ms)
            await self._wake_due()

    async def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        # Let woken tasks run, and the tasks they start, before time moves again.
        for _ in range(20):
            await asyncio.sleep(0)
