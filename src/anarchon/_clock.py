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
import time
from collections.abc import Coroutine
from typing import Any, Final, Protocol

__all__ = ["CLOCK_METHODS", "BackendTime", "Clock", "SystemClock", "sleep_or_wake"]

# asyncio sleeps in whole milliseconds (epoll), rounding up. A precise wait sleeps until this
# close to its target, then yields to the loop until the clock reaches it.
SPIN_MS = 2.0

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


async def sleep_or_wake(sleep: Coroutine[Any, Any, None], wake: asyncio.Event) -> None:
    """Wait for ``sleep`` (a coroutine) or for ``wake`` to be set, whichever comes first."""
    sleeper = asyncio.ensure_future(sleep)
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waker.cancel()
