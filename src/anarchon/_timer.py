"""One timer for all jobs: a heap of the next due slot of each job, and a single waiting task."""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, NamedTuple

from ._clock import Clock, sleep_or_wake
from .logs import Action, log_fields

__all__ = ["Due", "Late", "SlotTimer"]

logger = logging.getLogger("anarchon.scheduler")

# Slots are wall-clock instants, but waits are durations on the monotonic clock: look at the wall
# clock at least this often, so a step (NTP, a VM resumed) is noticed within a second and the
# wait re-armed. One wake-up a second costs nothing measurable.
STEP_CHECK_MS: Final = 1_000
# A wall clock that moved this much more (or less) than the monotonic clock since the last look
# was stepped. NTP slews offsets under 128 ms; anything past a second is a step.
STEP_MIN_MS: Final = 1_000
# Slots due at their very slot (no jitter, or the preferred rank) are handed over this long
# before it, so their claims are built while the clock runs out, and sent at the slot itself
# (the claim waits for it: see Claims.fire). Building 17 claims took 0.35 ms and starting the
# claim's task 0.1 ms more on this 2-core machine, on every slot's lag; and a wake-up a few
# milliseconds late (a busy host) is absorbed instead of delaying the claim.
LEAD_MS: Final = 5
# ... and this much sooner per slot due at that one instant (us), up to PREPARE_MAX_MS: handing
# a slot over (popping it off the heap, building its claim, putting the job's next slot on the
# heap) cost 5-8 us here (10 000 slots: 23-34 ms to build their claims, 25-44 ms to find their
# next slots), twice that on a busy host. So a burst of 10 000 due at once is handed over 155 ms
# before it and ready when its time comes, instead of starting its claims 40 ms late and
# finding the next slots while its runs start. Its claims still go out at the slot, not before.
PREPARE_US: Final = 15
PREPARE_MAX_MS: Final = 500


class Due(NamedTuple):
    """A slot of a job, due (after its jitter) at ``due_ms`` on the local wall clock.

    A tuple, so the heap orders entries by ``(due_ms, seq)`` in C: ``seq`` is unique, so the
    other fields are never compared. (A dataclass's generated ``__lt__`` made popping the 10 000
    slots of one instant take 50 ms.)
    """

    due_ms: int
    seq: int
    job: str
    slot: int
    generation: int


class Late(NamedTuple):
    """The timer's latest look at the clocks, which hands over the slots due then: at
    ``monotonic_ms``, ``gap_ms`` after the look before it (the timer looks at least every
    :data:`STEP_CHECK_MS` while the event loop runs: a longer gap is a loop that did not run),
    and the wall clock's step between the two (0: none of :data:`STEP_MIN_MS` or more)."""

    monotonic_ms: int
    gap_ms: int
    step_ms: int


class SlotTimer:
    """Keeps every job's next slot in a heap and hands due slots over in batches.

    Idle cost is one sleeping task, however many jobs are registered.
    """

    def __init__(
        self,
        clock: Clock,
        on_due: Callable[[list[Due]], Awaitable[None] | None],
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_due = on_due
        self._on_step = on_step
        self._heap: list[Due] = []
        self._seq = 0
        self._wake = asyncio.Event()
        self._last: tuple[int, int] | None = None  # (wall, monotonic) at the last look
        self.late = Late(0, 0, 0)
        """The latest look at the clocks: when, how long since the one before, the step."""
        # How many entries are due at their very slot, by due time: how early to hand over.
        self._instants: dict[int, int] = {}

    def push(self, job: str, slot: int, due_ms: int, generation: int) -> None:
        """Schedule ``slot`` of ``job`` to be handed over at ``due_ms`` (wall clock)."""
        self._seq += 1
        entry = Due(due_ms, self._seq, job, slot, generation)
        heapq.heappush(self._heap, entry)
        if due_ms == slot:
            self._instants[due_ms] = self._instants.get(due_ms, 0) + 1
        if self._heap[0] is entry:
            self._wake.set()

    def push_many(self, entries: Iterable[tuple[str, int, int, int]]) -> None:
        """:meth:`push` for each ``(job, slot, due_ms, generation)``, the heap put in order once
        (a scheduler starting with 100 000 jobs)."""
        heap = self._heap
        first = heap[0] if heap else None
        seq = self._seq
        instants = self._instants
        for job, slot, due_ms, generation in entries:
            seq += 1
            heap.append(Due(due_ms, seq, job, slot, generation))
            if due_ms == slot:
                instants[due_ms] = instants.get(due_ms, 0) + 1
        self._seq = seq
        heapq.heapify(heap)
        if heap and heap[0] is not first:
            self._wake.set()

    def __len__(self) -> int:
        return len(self._heap)

    def lead_ms(self, due_ms: int) -> int:
        """How long before ``due_ms`` the entries due at their slot then are handed over."""
        return LEAD_MS + min(PREPARE_MAX_MS, self._instants.get(due_ms, 0) * PREPARE_US // 1000)

    def _look(self) -> int:
        """Read the wall clock; notice and log a step since the last look. Returns wall now."""
        wall, mono = self._clock.now_ms(), self._clock.monotonic_ms()
        if self._last is not None:
            step = (wall - self._last[0]) - (mono - self._last[1])
            stepped = abs(step) >= STEP_MIN_MS
            self.late = Late(mono, mono - self._last[1], step if stepped else 0)
            if stepped:
                logger.warning(
                    "the wall clock stepped %+d ms; slots fire by the new wall time, leases and "
                    "timeouts are unaffected (they run on the monotonic clock)",
                    step,
                    extra=log_fields(Action.CLOCK_STEP, step_ms=step),
                )
                if self._on_step is not None:
                    self._on_step(step)
        self._last = (wall, mono)
        return wall

    async def run(self) -> None:
        """Hand over due slots until cancelled.

        A batch is sorted by due time. Slots due at their slot are handed over up to
        :meth:`lead_ms` before it, in a batch of their own (all due at that one instant): the
        receiver must not claim them before ``batch[-1].due_ms``."""
        heap, instants = self._heap, self._instants
        while True:
            now = self._look()
            batch: list[Due] = []
            while heap and heap[0].due_ms <= now:
                due = heapq.heappop(heap)
                batch.append(due)
                if due.due_ms == due.slot:
                    _forget(instants, due.due_ms)
            head = heap[0] if heap and not batch else None
            if (
                head is not None
                and _at_slot(head)
                and head.due_ms - now <= self.lead_ms(head.due_ms)
            ):
                at = head.due_ms
                while heap and heap[0].due_ms == at and _at_slot(heap[0]):
                    batch.append(heapq.heappop(heap))
                instants.pop(at, None)
            if batch:
                result = self._on_due(batch)
                if result is not None:
                    await result
                continue
            self._wake.clear()
            at = now + STEP_CHECK_MS + 1
            if heap:
                head = heap[0]
                # Without jitter the slot is the moment to claim: hand it over a little before
                # (its claim then waits for the slot precisely), not after it.
                at = head.due_ms - self.lead_ms(head.due_ms) if _at_slot(head) else head.due_ms
            if at - now > STEP_CHECK_MS:
                await sleep_or_wake(self._clock.sleep(STEP_CHECK_MS / 1000), self._wake)
            else:
                await sleep_or_wake(self._clock.sleep_until(at), self._wake)


def _forget(instants: dict[int, int], due_ms: int) -> None:
    """One entry due at its slot at ``due_ms`` left the heap."""
    left = instants.get(due_ms, 0) - 1
    if left > 0:
        instants[due_ms] = left
    else:
        instants.pop(due_ms, None)


def _at_slot(due: Due) -> bool:
    """The slot is claimed at its very time (no jitter, or the preferred rank)."""
    return due.due_ms == due.slot
