"""A run's end: a handler that exits fails its own run only, a failure is one ERROR line with the
traceback, a handler's own TimeoutError is its error; background loops survive errors."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import BackendError, RunContext, RunStatus, Scheduler
from anarchon._clock import SKEW_CHECK_S
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START, until


async def _exit_async(ctx: RunContext) -> None:
    raise SystemExit(3)


def _exit_plain(ctx: RunContext) -> None:
    sys.exit(4)


async def _interrupt_async(ctx: RunContext) -> None:
    raise KeyboardInterrupt


def _interrupt_plain(ctx: RunContext) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("handler", "text"),
    [
        (_exit_async, "SystemExit(3)"),
        (_exit_plain, "SystemExit(4)"),
        (_interrupt_async, "KeyboardInterrupt"),
        (_interrupt_plain, "KeyboardInterrupt"),
    ],
    ids=["async-SystemExit", "plain-sys.exit", "async-Interrupt", "plain-Interrupt"],
)
async def test_a_handler_that_exits_fails_its_run_and_the_scheduler_goes_on(
    handler: Callable[[RunContext], Any], text: str
) -> None:
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("bye", "* * * * *", handler, jitter_ms=0)
    async with scheduler:
        for minute in (1, 2):
            await clock.advance(MINUTE)

            def recorded(n: int = minute) -> bool:
                return scheduler.metrics().get("runs_failed") == n

            await until(recorded, 10, "the failure")
        assert scheduler.running
        history = await scheduler.history("bye")
    assert [r.status for r in history] == [RunStatus.FAILED, RunStatus.FAILED]
    assert all(r.error and text in r.error for r in history), [r.error for r in history]


async def test_a_failed_run_is_one_error_line_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(START)

    async def broken(ctx: RunContext) -> None:
        raise ValueError("boom")

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("broken", "@daily", broken)
    caplog.set_level(logging.DEBUG, "anarchon")
    async with scheduler:
        run = await scheduler.run_now("broken")
    assert run.status is RunStatus.FAILED and run.error == "ValueError: boom"
    about = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(about) == 1, [(r.levelname, r.getMessage()) for r in about]
    [line] = about
    assert line.levelno == logging.ERROR and getattr(line, "action", None) == "run_failed"
    assert line.exc_info is not None and isinstance(line.exc_info[1], ValueError)
    assert getattr(line, "job", None) == "broken"


async def test_a_handlers_own_timeout_error_is_its_error() -> None:
    clock = FakeClock(START)

    async def own(ctx: RunContext) -> None:
        raise TimeoutError("the API did not answer")

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("own", "@daily", own)
    scheduler.add("own_with_limit", "@daily", own, timeout_ms=60_000)
    async with scheduler:
        run = await scheduler.run_now("own")
        limited = await scheduler.run_now("own_with_limit")
    assert run.error == "TimeoutError: the API did not answer"
    assert limited.error == "TimeoutError: the API did not answer"


async def test_an_async_timeout_is_recorded_with_its_limit() -> None:
    async def slow(ctx: RunContext) -> None:
        await asyncio.sleep(10)

    scheduler = Scheduler(MemoryBackend())
    scheduler.add("slow", "@daily", slow, timeout_ms=50)
    async with scheduler:
        run = await scheduler.run_now("slow")
    assert run.status is RunStatus.FAILED and run.error == "timed out after timeout_ms=50"


async def test_a_background_loop_that_fails_is_logged_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(START)

    class Glitchy(MemoryBackend):
        calls = 0

        async def server_time_ms(self) -> int | None:
            self.calls += 1
            if self.calls == 2:  # the skew loop's first (the scheduler measured as it started)
                raise BackendError("a glitch the scheduler does not expect")
            return await super().server_time_ms()

    backend = Glitchy(clock=clock)
    scheduler = Scheduler(backend, clock=clock)
    caplog.set_level(logging.ERROR, "anarchon")
    async with scheduler:
        assert backend.calls == 1
        await clock.advance(int(SKEW_CHECK_S * 1000) + 100)
        assert backend.calls == 2
        await clock.advance(int(SKEW_CHECK_S * 1000) + 5_000)
        assert backend.calls == 3, "the skew loop did not come back"
    [failed] = [r for r in caplog.records if getattr(r, "action", None) == "loop_failed"]
    assert failed.exc_info is not None and "glitch" in str(failed.exc_info[1])
