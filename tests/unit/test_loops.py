"""The scheduler's long-lived loops are owned by one task group, held by a task of its own
(``anarchon._loops``): start() and stop() may run in different tasks, a loop that ends
unexpectedly is logged and does not take the other loops down, and nothing is left after stop.
(Every backend, defaults: tests/conformance/test_task_ownership.py.)"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from anarchon import MemoryBackend, RunContext, RunStatus, Scheduler
from anarchon._clock import SKEW_CHECK_S
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, Recording, until

LOOPS = {"watcher", "adopt", "timer", "clock", "requests", "heartbeat"}


def _loops(scheduler: Scheduler) -> dict[str, bool]:
    """Each loop's name and whether it still runs."""
    tasks = scheduler._services.loops.tasks
    return {t.get_name().removeprefix("anarchon "): not t.done() for t in tasks}


def _failed(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "loop_failed"]


async def test_start_and_stop_in_different_tasks_end_every_loop_and_their_group() -> None:
    # Every option at its default (the real clock: the lease keeper on its own thread).
    async def work(ctx: RunContext) -> None:
        pass

    before = asyncio.all_tasks()
    scheduler = Scheduler(MemoryBackend(), instance_id="one")
    scheduler.add("work", "* * * * * *", work)
    await asyncio.ensure_future(scheduler.start())
    assert set(_loops(scheduler)) == LOOPS and all(_loops(scheduler).values())
    owner = scheduler._services.loops._owner
    assert owner is not None and not owner.done()
    await asyncio.sleep(1.2)  # a slot runs
    await asyncio.ensure_future(scheduler.stop())
    assert not any(_loops(scheduler).values()) and owner.done() and not owner.cancelled()
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert not left, sorted(t.get_name() for t in left)


def _glitchy(clock: FakeClock, error: BaseException) -> tuple[MemoryBackend, list[int]]:
    """A memory backend whose second reading of its clock (the clock loop's first measure)
    raises ``error``."""
    calls: list[int] = []

    class Glitchy(MemoryBackend):
        async def server_time_ms(self) -> int | None:
            calls.append(1)
            if len(calls) == 2:
                raise error
            return await super().server_time_ms()

    return Glitchy(clock=clock), calls


async def test_a_cancellation_nobody_asked_for_is_logged_and_the_loop_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A driver that turns its own timeout into a CancelledError ended the loop, unlogged, for
    # the rest of the process (health then said "loop(s) not running: clock").
    caplog.set_level(logging.ERROR, "anarchon")
    clock = FakeClock(START)
    backend, calls = _glitchy(clock, asyncio.CancelledError())
    async with Scheduler(backend, clock=clock) as scheduler:
        await clock.advance(int(SKEW_CHECK_S * 1000) + 100)
        assert len(calls) == 2
        await clock.advance(int(SKEW_CHECK_S * 1000) + 5_000)
        assert len(calls) == 3, "the clock loop did not come back"
        assert _loops(scheduler)["clock"]
    [failed] = _failed(caplog)
    assert getattr(failed, "loop", None) == "clock" and "restarting it" in failed.getMessage()


async def test_a_loop_ended_by_a_base_exception_is_logged_and_the_others_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The clock loop ends (a BaseException of a class of its own, not restarted): it is logged
    # at once, the other loops go on (the timer fires the next slot), and stop() drains and
    # hands the running handler over as always. Before, it ended unlogged. Under a bare task
    # group, a failing task would have cancelled every other loop with it.
    class Odd(BaseException):
        pass

    caplog.set_level(logging.INFO, "anarchon")
    clock = FakeClock(START)
    backend, _ = _glitchy(clock, Odd("not an Exception"))
    seen: list[int] = []

    async def work(ctx: RunContext) -> None:
        seen.append(ctx.attempt)
        await asyncio.sleep(3600)

    scheduler = Scheduler(backend, clock=clock, instance_id="one")
    scheduler.add("work", "0 * * * *", work, jitter_ms=0)
    await scheduler.start()
    try:
        await clock.advance(int(SKEW_CHECK_S * 1000) + 100)
        await until(lambda: _failed(caplog), 5, "the clock loop's end to be logged")
        assert _loops(scheduler) == {name: name != "clock" for name in LOOPS | {"lease keeper"}}
        health = await scheduler.health()
        assert "loop(s) not running: clock" in health.problems
        await clock.advance(60 * MINUTE)
        await until(lambda: seen, 5, "the timer to fire the slot")
        stopping = asyncio.ensure_future(scheduler.stop())
        await clock.advance(31_000)  # past the grace (30 s): the handler is handed over
        await asyncio.wait_for(stopping, 5)
    finally:
        await scheduler.stop()
    [failed] = _failed(caplog)
    assert failed.levelno == logging.ERROR and "ended by Odd" in failed.getMessage()
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], Odd)
    assert seen == [1] and scheduler.metrics()["handed_over"] == 1
    assert "handed_over" in [getattr(r, "action", None) for r in caplog.records]
    assert not any(_loops(scheduler).values())


def test_a_keyboard_interrupt_in_one_loop_leaves_the_event_loop_and_the_keeper_renewing() -> None:
    # KeyboardInterrupt leaves the event loop from the loop's task, as asyncio raises it; the
    # program catches it and stops the scheduler. The lease keeper (on the event loop: a fake
    # clock) must still renew the running handler's lease while it drains: a task group that
    # saw the loop fail would have cancelled it with every other loop, and a backup would run
    # the slot beside the handler.
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[RunContext] = []
    interrupt = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        seen.append(ctx)
        await clock.sleep(25)  # past a lease (15 s), within the grace (30 s)

    async def interrupting() -> None:
        await interrupt.wait()
        raise KeyboardInterrupt

    scheduler = Scheduler(backend, clock=clock, instance_id="one")
    scheduler._services._adopt_again = interrupting  # type: ignore[method-assign]
    scheduler.add("work", "0 * * * *", work, jitter_ms=0)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scheduler.start())
        loop.run_until_complete(clock.advance(60 * MINUTE + 2_000))
        assert [c.attempt for c in seen] == [1]
        interrupt.set()
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(5))
        loop.run_until_complete(asyncio.sleep(0.1))  # the loop's task ended; the rest goes on
        alive = _loops(scheduler)
        assert alive == {name: name != "adopt" for name in LOOPS | {"lease keeper"}}, alive
        renewals = len(backend.named("renew"))
        stopping = loop.create_task(scheduler.stop())
        loop.run_until_complete(clock.advance(30_000))
        loop.run_until_complete(asyncio.wait_for(stopping, 5))
        history: list[Any] = loop.run_until_complete(backend.history("work"))
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in left:  # the sleep the interrupt cut short
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    finally:
        loop.close()
    assert len(backend.named("renew")) > renewals, "no renewal while draining"
    assert not seen[0].lease_lost
    assert [(r.attempt, r.status) for r in history] == [(1, RunStatus.SUCCEEDED)]
    assert not any(_loops(scheduler).values())
