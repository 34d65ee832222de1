"""The scheduler's life cycle at its edges: a start refused leaves a running scheduler alone, two
starts at once start it once, a stop during start() stops what it started. (What stop() drains:
test_draining.py.)"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import pytest

from anarchon import RunContext, Scheduler
from anarchon.errors import SchedulerStateError
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, Recording, until

REFUSED = "it can start only once"


def _hourly(clock: FakeClock, backend: Any | None = None) -> tuple[Scheduler, list[int]]:
    """A scheduler (defaults) with one job at the top of each hour, and the attempts it ran."""
    seen: list[int] = []

    async def work(ctx: RunContext) -> None:
        seen.append(ctx.attempt)

    scheduler = Scheduler(backend or Recording(clock), clock=clock, instance_id="one")
    scheduler.add("work", "0 * * * *", work, jitter_ms=0)
    return scheduler, seen


async def test_a_second_serve_or_start_is_refused_and_leaves_the_first_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The refused serve() stopped the running scheduler in its `finally` (the first serve()
    # then blocked on with nothing firing), and took its signal handlers away.
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    clock = FakeClock(START)
    scheduler, seen = _hourly(clock)
    serving = asyncio.ensure_future(scheduler.serve())
    try:
        await until(lambda: scheduler.running, 5, "the scheduler to start")
        with pytest.raises(SchedulerStateError, match=f"scheduler is running; {REFUSED}"):
            await scheduler.serve(asyncio.Event())
        with pytest.raises(SchedulerStateError, match=REFUSED):
            await scheduler.start()
        with pytest.raises(SchedulerStateError, match=REFUSED):
            await asyncio.to_thread(scheduler.run)  # its own loop, on another thread
        assert scheduler.running, "a refused call stopped the running scheduler"
        assert not serving.done()
        await clock.advance(60 * MINUTE + 1_000)
        await until(lambda: seen, 5, "the slot to run after the refused calls")
        # The first serve() still holds SIGINT: it stops, it does not raise KeyboardInterrupt.
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(serving, 10)
    finally:
        serving.cancel()
    assert seen == [1] and not scheduler.running
    said = [getattr(r, "action", None) for r in caplog.records]
    assert said.count("started") == 1 and said.count("stopped") == 1, said
    assert said.count("signal") == 1, said


async def test_two_starts_at_once_start_it_once() -> None:
    # Both saw a new scheduler and both started every service.
    clock = FakeClock(START)
    scheduler, _ = _hourly(clock)
    results = await asyncio.gather(scheduler.start(), scheduler.start(), return_exceptions=True)
    try:
        assert results[0] is None, results
        assert isinstance(results[1], SchedulerStateError), results
        assert f"scheduler is starting; {REFUSED}" in str(results[1])
        assert scheduler.running
    finally:
        await scheduler.stop()


class _SlowToStart(Recording):
    """Its start() waits until ``gate`` is set."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = asyncio.Event()
        self.starting = False

    async def start(self) -> None:
        self.starting = True
        await self.gate.wait()
        await super().start()


async def test_a_stop_during_start_waits_for_it_and_stops_the_scheduler() -> None:
    # It returned at once, marking the scheduler stopped, and the start then went on: the
    # scheduler ran after stop() had returned.
    clock = FakeClock(START)
    backend = _SlowToStart(clock)
    scheduler, seen = _hourly(clock, backend)
    starting = asyncio.ensure_future(scheduler.start())
    await until(lambda: backend.starting, 5, "the backend's start")
    stopping = asyncio.ensure_future(scheduler.stop())
    await asyncio.sleep(0.2)
    assert not stopping.done(), "stop() returned while the start went on"
    backend.gate.set()
    await asyncio.wait_for(asyncio.gather(starting, stopping), 5)
    assert not scheduler.running
    await clock.advance(60 * MINUTE + 1_000)
    await asyncio.sleep(0.1)
    assert seen == [], "the scheduler ran after its stop"
