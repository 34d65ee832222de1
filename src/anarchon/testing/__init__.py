"""Tools for testing your own jobs: the in-memory backend and a clock you move by hand.

(For testing your own *backend*, see :mod:`anarchon.testing.contract`: the conformance suite as
pytest classes.)

Example::

    clock = FakeClock(start_ms=1_767_225_600_000)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    ...
    await clock.advance(60_000)   # one minute passes; due slots fire
    clock.step(-60_000)           # an NTP step: the wall clock goes back, durations do not
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from ..backends.memory import MemoryBackend

__all__ = ["FakeClock", "MemoryBackend"]


class FakeClock:
    """A clock that only moves when told to.

    It has the scheduler's two clocks: a wall clock (:meth:`now_ms`) and a monotonic clock
    (:meth:`monotonic_ms`). :meth:`advance` moves both, as time passing does; :meth:`step` moves
    the wall clock alone, as an NTP step or a VM resumed does. ``sleep`` is a duration on the
    monotonic clock and waits for :meth:`advance`. Use it from one event loop.
    """

    def __init__(self, start_ms: int = 1_767_225_600_000, *, monotonic_ms: int = 1_000_000) -> None:
        self._now = start_ms
        self._mono = monotonic_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        """The fake wall clock, epoch milliseconds."""
        return self._now

    def monotonic_ms(self) -> int:
        """The fake monotonic clock, milliseconds from an arbitrary origin."""
        return self._mono

    async def sleep(self, seconds: float) -> None:
        """Wait until the monotonic clock has moved ``seconds`` forward."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + int(seconds * 1000), next(self._seq), future))
        await future

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        """Wait for the wall clock to reach ``wall_ms``, as a duration computed now (like
        :class:`~anarchon._clock.SystemClock`: a step during the wait is not followed)."""
        await self.sleep((wall_ms - self._now) / 1000)

    async def advance(self, ms: int, *, step_ms: int = 100) -> None:
        """Let ``ms`` pass on both clocks, in steps, letting due sleepers and their work run."""
        target = self._mono + ms
        while self._mono < target:
            delta = min(target, self._mono + step_ms) - self._mono
            self._mono += delta
            self._now += delta
            await self._wake_due()

    def step(self, ms: int) -> None:
        """Step the wall clock by ``ms`` (negative: back) without time passing: monotonic time
        and every sleeper stay where they are."""
        self._now += ms

    async def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        # Let woken tasks run, and the tasks they start, before time moves again; stop early
        # once nothing else is ready to run (an idle step then costs one pass of the loop, not
        # twenty: an hour in 100 ms steps took seconds).
        ready = getattr(asyncio.get_running_loop(), "_ready", None)
        for _ in range(20):
            await asyncio.sleep(0)
            if ready is not None and not ready:
                break
