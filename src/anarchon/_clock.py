"""Clocks: three kinds of time, never mixed.

* **Wall clock** (:meth:`Clock.now_ms`): slots are wall-clock instants, so the timer fires by it.
* **Monotonic clock** (:meth:`Clock.monotonic_ms`, :meth:`Clock.sleep`): every duration and
  deadline inside one process (lease upkeep, grace, timeouts, retry deadlines, the watcher's
  check at a lease's expiry). A wall-clock step (NTP, a VM resumed) does not move it.
* **Backend clock** (:class:`BackendTime`): decisions shared with other instances (is this claim
  too late) compare with the backend's time as last measured, carried forward on the monotonic
  clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._metrics import Counters
from .backend import Backend
from .errors import BackendUnavailable, InvalidOption
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._job import Job
    from ._timer import Due

__all__ = [
    "CLOCK_METHODS",
    "BackendClock",
    "BackendTime",
    "Clock",
    "SystemClock",
    "check_clock",
    "sleep_or_wake",
]

logger = logging.getLogger("anarchon.scheduler")

# asyncio sleeps in whole milliseconds (epoll), rounding up. A precise wait sleeps until this
# close to its target, then yields to the loop until the clock reaches it.
SPIN_MS = 2.0

# The offset from the backend's clock is measured this often (s), and at once after a step.
SKEW_CHECK_S: Final = 60.0
# A slot due by this host's wall clock but still this far (ms) in the future by the backend's
# (this clock is ahead: stepped, or a VM resumed) waits for the backend's time to reach it.
EARLY_TOLERANCE_MS: Final = 1_000
# A deferred slot is looked at again within this long (ms): the estimate may be stale (the
# backend's clock stepped too, and is being measured again after the step).
EARLY_RECHECK_MS: Final = 1_000
# An offset from the backend's clock up to this (ms) is never warned of, whatever the jobs.
SKEW_WARN_FLOOR_MS: Final = 250

#: What a clock must provide (checked when a Scheduler is made).
CLOCK_METHODS: Final = ("now_ms", "monotonic_ms", "sleep", "sleep_until")


class Clock(Protocol):
    """Where the scheduler reads the time and how it waits.

    ``now_ms`` is the wall clock (it may jump); ``monotonic_ms`` never goes back and is not moved
    by wall-clock steps; ``sleep`` waits a duration on the monotonic clock.
    """

    def now_ms(self) -> int:
        """Wall-clock time, epoch milliseconds (UTC). May step forward or back."""

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that only moves forward at a steady rate (any origin)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of monotonic time: a duration, unaffected by wall-clock steps."""

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        """Wait until :meth:`now_ms` should read ``wall_ms``, computed as a duration from now;
        ``precise`` asks not to overshoot. A wall step during the wait is not followed: callers
        that wait long re-check the wall clock in short steps."""


def check_clock(clock: object) -> Clock | None:
    """The ``clock`` option of a Scheduler, checked: None, or an object with every method of
    :data:`CLOCK_METHODS`."""
    if clock is None:
        return None
    missing = [name for name in CLOCK_METHODS if not callable(getattr(clock, name, None))]
    if missing:
        raise InvalidOption(
            f"clock={clock!r} lacks {', '.join(missing)}: a clock provides now_ms() (wall "
            "clock, epoch ms), monotonic_ms(), async sleep(seconds) and async "
            "sleep_until(wall_ms, precise=False), as anarchon.testing.FakeClock does"
        )
    return clock  # type: ignore[return-value]


class SystemClock:
    """The machine's clocks (``time.time``, ``time.monotonic``) and ``asyncio.sleep``.

    Usable from any thread's event loop.
    """

    def now_ms(self) -> int:
        """Return ``time.time()`` in milliseconds."""
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        """Return ``time.monotonic()`` in milliseconds."""
        return time.monotonic_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        """Sleep with asyncio (whose timers are monotonic)."""
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
            # A bounded spin: at most SPIN_MS, or until a backward wall step is over-waited
            # (then the caller's next look at the clock re-arms).
            spin_until = time.monotonic() + SPIN_MS / 1000 * 2
            while time.time_ns() // 1_000_000 < wall_ms and time.monotonic() < spin_until:  # noqa: ASYNC110
                await asyncio.sleep(0)
        elif remaining_ms > 0:
            await asyncio.sleep(remaining_ms / 1000)


class BackendTime:
    """The backend's clock as this instance last measured it, carried on the monotonic clock.

    Each measurement (``server_time_ms()`` around two local readings) anchors the estimate;
    between measurements it advances with the monotonic clock, so a wall-clock step on this host
    does not change it. Before the first measurement it is the local wall clock as read by
    :meth:`assume_local` (when the scheduler starts), carried on the monotonic clock; before
    that, the local wall clock.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._anchor: tuple[int, int] | None = None  # (backend ms, monotonic ms)
        self._measured = False

    def assume_local(self) -> None:
        """Until a measurement, take the backend's clock to read what the local wall clock reads
        now (a later step of the local clock does not move the estimate)."""
        if not self._measured:
            self._anchor = (self._clock.now_ms(), self._clock.monotonic_ms())

    def measured(self, backend_ms: int, monotonic_mid_ms: int) -> None:
        """Record a measurement: the backend read ``backend_ms`` at ``monotonic_mid_ms``."""
        self._anchor = (backend_ms, monotonic_mid_ms)
        self._measured = True

    def shift(self, step_ms: int) -> None:
        """Move the estimate by ``step_ms``: the backend's clock stepped with this host's."""
        if self._anchor is not None:
            self._anchor = (self._anchor[0] + step_ms, self._anchor[1])

    @property
    def known(self) -> bool:
        """True once a measurement was made."""
        return self._measured

    def now_ms(self) -> int:
        """The backend's clock now (estimated), epoch ms."""
        if self._anchor is None:
            return self._clock.now_ms()
        backend_ms, at = self._anchor
        return backend_ms + (self._clock.monotonic_ms() - at)


class BackendClock:
    """This instance's clock against the backend's: measures the offset (every
    :data:`SKEW_CHECK_S` and after a wall-clock step), warns when it grows, keeps the
    :class:`BackendTime` estimate that judges "too late", and defers slots that are due by this
    host's clock but early by the backend's."""

    def __init__(
        self, backend: Backend, clock: Clock, jobs: Mapping[str, Job], counters: Counters
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._jobs = jobs
        self._counters = counters
        self.time = BackendTime(clock)
        """The backend's clock, estimated."""
        self.offset_ms: int | None = None
        """The backend's clock minus this host's at the last measurement."""
        self.instance = ""
        """This instance's id, set by the scheduler when it starts."""
        self._wake = asyncio.Event()
        self._early_warned_at: int | None = None
        self._tried_at: int | None = None  # monotonic ms of the last measurement tried

    def stepped(self, step_ms: int) -> None:
        """The timer saw the wall clock step: measure the offset from the backend again now.
        The backend-time estimate runs on the monotonic clock; on one host (SQLite, memory),
        whose backend clock is this host's wall clock, it moves by the step at once, before
        the slots due by the new wall time are judged too late or not."""
        self._counters.clock_steps += 1
        if self._backend.one_host:
            self.time.shift(step_ms)
        self._wake.set()

    async def watch(self) -> None:
        """Measure the offset every :data:`SKEW_CHECK_S` (the first time that long after the
        scheduler's own measurement as it started, see :meth:`measure_at_start`), and at once
        after a step."""
        while True:
            tried = self._tried_at
            if tried is not None:
                left = SKEW_CHECK_S - (self._clock.monotonic_ms() - tried) / 1000
                if left > 0:
                    await sleep_or_wake(self._clock.sleep(left), self._wake)
            self._wake.clear()  # a step noticed while measuring wakes the next wait at once
            await self.measure()

    async def measure_at_start(self) -> None:
        """Measure before the scheduler's timer starts (it starts from the backend's time). A
        failure is logged, not raised: the estimate stays this host's clock until
        :meth:`watch` measures."""
        try:
            await self._measure()
        except Exception as exc:
            logger.warning(
                "could not read the %s backend's clock as the scheduler started (%s: %s); "
                "slots are fired by this host's clock until it is measured",
                self._backend.name,
                type(exc).__name__,
                exc,
                extra=log_fields(Action.CLOCK_SKEW),
            )

    async def measure(self) -> None:
        """Read the backend's clock between two local readings; warn if the offset is large.
        A backend out of reach is not logged here (the calls that need it log their outage):
        the estimate stays as it was until the next measurement."""
        try:
            await self._measure()
        except BackendUnavailable:
            return

    async def _measure(self) -> None:
        """:meth:`measure`, raising what reading the backend's clock raised."""
        clock = self._clock
        before, before_mono = clock.now_ms(), clock.monotonic_ms()
        self._tried_at = before_mono
        server = await self._backend.server_time_ms()
        after, after_mono = clock.now_ms(), clock.monotonic_ms()
        if server is None:
            return
        self.time.measured(server, (before_mono + after_mono) // 2)
        offset = server - (before + after) // 2
        self.offset_ms = offset
        if abs(offset) <= SKEW_WARN_FLOOR_MS:
            return  # below any threshold: the budgets of 100 000 jobs are not walked every minute
        budgets = [b for j in self._jobs.values() if (b := self._backend.skew_budget_ms(j.policy))]
        # Warn long before skew is unsafe: at a tenth of the tightest budget, and above 5 s anyway.
        threshold = min([5_000, *(b // 10 for b in budgets)])
        if abs(offset) > max(threshold, SKEW_WARN_FLOOR_MS):
            self._counters.clock_skew_warnings += 1
            logger.warning(
                "clock of %s is %+d ms off the %s backend's clock; slots fire off time, and past "
                "%s ms a slot could run twice. Synchronise clocks (NTP).",
                self.instance,
                offset,
                self._backend.name,
                min(budgets) if budgets else "unbounded",
                extra=log_fields(Action.CLOCK_SKEW, offset_ms=offset),
            )

    def early_slots_possible(self) -> bool:
        """Whether a slot can be early: not on one host, where every instance's wall clock
        stepped alike (before a measurement, the estimate is anchored when the scheduler
        starts, so a clock stepped since is noticed)."""
        return not self._backend.one_host

    def is_early(self, slot: int, backend_now: int) -> bool:
        """Whether ``slot`` is still more than :data:`EARLY_TOLERANCE_MS` ahead of the
        backend's clock (``backend_now``)."""
        return slot - backend_now > EARLY_TOLERANCE_MS

    def defer(self, early: list[Due], backend_now: int, push: Callable[[Due, int], None]) -> None:
        """Put slots that are due here but not yet by the backend's clock back on the timer
        (``push(due, wall_ms)``), at the local wall time when the backend's clock reaches them
        (without jitter: it was spent). Claiming them now would be early for every other
        instance (a run overlapping the previous slot's, recorded as skipped)."""
        wall = self._clock.now_ms()
        self._counters.early_slots_deferred += len(early)
        for due in early:
            # Looked at again within a second: the estimate may be stale (the backend's clock
            # stepped too, and is being measured again after the step).
            wait = due.slot - backend_now
            if wait > EARLY_RECHECK_MS + EARLY_TOLERANCE_MS:
                wait = EARLY_RECHECK_MS
            push(due, wall + wait)
        mono = self._clock.monotonic_ms()
        if self._early_warned_at is not None and mono - self._early_warned_at < SKEW_CHECK_S * 1000:
            return  # one warning a minute: a clock ahead defers every slot
        self._early_warned_at = mono
        first = early[0]
        logger.warning(
            "%d slot(s) (%s slot %s%s) are due by this host's clock but %d ms in the future by "
            "the %s backend's: this clock is ahead (stepped?); waiting for the backend's time",
            len(early),
            first.job,
            first.slot,
            f" and {len(early) - 1} more" if len(early) > 1 else "",
            first.slot - backend_now,
            self._backend.name,
            extra=log_fields(Action.SLOT_EARLY, first.job, first.slot),
        )


async def sleep_or_wake(sleep: Coroutine[Any, Any, None], wake: asyncio.Event) -> None:
    """Wait for ``sleep`` (a coroutine) or for ``wake`` to be set, whichever comes first."""
    sleeper = asyncio.ensure_future(sleep)
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waker.cancel()
