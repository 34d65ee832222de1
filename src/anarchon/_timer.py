"""One timer for all jobs: a heap of the next due slot of each job, and a single waiting task."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._clock import Clock

__all__ = ["Due", "SlotTimer"]

# Re-read the wall clock at least this often while idle, so a clock step (NTP) is noticed.
MAX_IDLE_WAIT_S = 30.0


@dataclass(order=True, slots=True)
class Due:
    """A slot of a job, due (after its jitter) at ``due_ms`` on the local clock."""

    due_ms: int
    seq: int
    job: str = field(compare=False)
    slot: int = field(compare=False)
    generation: int = field(compare=False)


class SlotTimer:
    """Keeps every job's next slot in a heap and hands due slots over in batches.

    Idle cost is one sleeping task, however many jobs are registered.
    """

    def __init__(self, clock: Clock, on_due: Callable[[list[Due]], Awaitable[None] | None]) -> None:
        self._clock = clock
        self._on_due = on_due
        self._heap: list[Due] = []
        self._seq = 0
        self._wake = asyncio.Event()

    def push(self, job: str, slot: int, due_ms: int, generation: int) -> None:
        """Schedule ``slot`` of ``job`` to be handed over at ``due_ms``."""
        self._seq += 1
        entry = Due(due_ms, self._seq, job, slot, generation)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._wake.set()

    def __len__(self) -> int:
        return len(self._heap)

    async def run(self) -> None:
        """Hand over due slots until cancelled."""
        while True:
            now = self._clock.now_ms()
            batch: list[Due] = []
            while self._heap and self._heap[0].due_ms <= now:
                batch.append(heapq.heappop(self._heap))
            if batch:
                result = self._on_due(batch)
                if result is not None:
                    await result
                continue
            delay = (self._heap[0].due_ms - now) / 1000 if self._heap else MAX_IDLE_WAIT_S
            self._wake.clear()
            await self._wait(min(delay, MAX_IDLE_WAIT_S))

    async def _wait(self, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
