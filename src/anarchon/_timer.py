"""One timer for all jobs: a heap of the next due slot of each job, and a single waiting task."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._clock import Clock, sleep_or_wake

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
            self._wake.clear()
            if not self._heap or self._heap[0].due_ms - now > MAX_IDLE_WAIT_S * 1000:
                await sleep_or_wake(self._clock.sleep(MAX_IDLE_WAIT_S), self._wake)
            else:
                head = self._heap[0]
                # Without jitter the slot is the moment to claim: wake on it, not after it.
                precise = head.due_ms == head.slot
                await sleep_or_wake(self._clock.sleep_until(head.due_ms, precise), self._wake)
