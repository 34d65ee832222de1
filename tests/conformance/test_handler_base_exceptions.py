"""A handler that ends with a BaseException other than an Exception (a class of its own,
GeneratorExit, a CancelledError of its own making) fails its own run, once, on a real backend
and with every option at its default; an async handler that swallows its timeout's
cancellation is still recorded failed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import RunContext, RunStatus, Scheduler
from tests.conformance.conftest import _load
from tests.harness import Harness

Make = Callable[..., list[Scheduler]]


@pytest.fixture(params=["sqlite", "redis"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """SQLite and Redis: a file and a server backend."""
    return _load(request.param)


class Boom(BaseException):
    """A BaseException of the handler's own."""


async def _boom_async(ctx: RunContext) -> None:
    raise Boom("async boom")


async def _generator_exit(ctx: RunContext) -> None:
    raise GeneratorExit("async generator exit")


async def _own_cancelled(ctx: RunContext) -> None:
    sub = asyncio.ensure_future(asyncio.sleep(30))
    await asyncio.sleep(0)
    sub.cancel()
    await sub  # the handler's own CancelledError, not the scheduler's


def _boom_plain(ctx: RunContext) -> None:
    raise Boom("plain boom")


def _futures_cancelled(ctx: RunContext) -> None:
    raise concurrent.futures.CancelledError("plain futures cancel")


CASES = [
    (_boom_async, "Boom: async boom"),
    (_generator_exit, "GeneratorExit: async generator exit"),
    (_own_cancelled, "CancelledError"),
    (_boom_plain, "Boom: plain boom"),
    (_futures_cancelled, "CancelledError: plain futures cancel"),
]
IDS = ["async-Boom", "async-GeneratorExit", "async-own-CancelledError", "plain-Boom", "plain-fut"]


async def _until(predicate: Callable[[], Any], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


@pytest.mark.parametrize(("handler", "text"), CASES, ids=IDS)
async def test_a_handlers_base_exception_fails_its_run_once_at_defaults(
    harness: Harness, schedulers: Make, handler: Callable[[RunContext], Any], text: str
) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def counted(ctx: RunContext) -> Any:
        with lock:
            calls[str(ctx.slot)] += 1
        return handler(ctx)

    async def counted_async(ctx: RunContext) -> None:
        calls[str(ctx.slot)] += 1
        await handler(ctx)

    wrapped = counted_async if asyncio.iscoroutinefunction(handler) else counted
    instances = schedulers(3)
    for scheduler in instances:
        scheduler.add("base", "* * * * * *", wrapped)
    for scheduler in instances:
        await scheduler.start()

    async def six_failed() -> bool:
        runs = await instances[0].history("base")
        return sum(r.status is RunStatus.FAILED for r in runs) >= 6

    await _until(six_failed, 40, "six failed runs")
    runs = await instances[0].history("base")
    failed = [r for r in runs if r.status is RunStatus.FAILED]
    assert all(r.error and text in r.error for r in failed), [r.error for r in failed]
    assert all(r.attempt == 1 for r in failed), [(r.slot, r.attempt, r.error) for r in failed]
    # One call per slot: no backup ran a slot again after a lost lease.
    assert max(calls.values()) == 1, calls
    # Nothing left running or skipped for overlap (slots older than 4 s: settled by now).
    old = time.time() - 4
    unsettled = [
        (r.slot, r.status, r.reason)
        for r in runs
        if r.slot and r.slot.timestamp() < old and r.status is not RunStatus.FAILED
    ]
    assert not unsettled, unsettled


async def test_a_base_exception_is_retried_like_any_failure(
    harness: Harness, schedulers: Make
) -> None:
    [scheduler] = schedulers(1)
    scheduler.add("retried", "@daily", _boom_async, retries=1, retry_backoff_ms=0)
    async with scheduler:
        try:
            first = await scheduler.run_now("retried")
        except BaseException as exc:  # the handler's Boom must not reach the caller
            raise AssertionError(f"run_now raised {exc!r}") from None

        async def retried() -> bool:
            runs = await scheduler.history("retried")
            return len([r for r in runs if r.status is RunStatus.FAILED]) >= 2

        await _until(retried, 20, "the retry's failure")
    assert first.status is RunStatus.FAILED and first.error and "Boom: async boom" in first.error


async def test_an_async_handler_that_swallows_its_timeout_is_recorded_failed(
    harness: Harness, schedulers: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async def stubborn(ctx: RunContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1.5)  # ignores the cancellation, then returns

    [scheduler] = schedulers(1)
    scheduler.add("stubborn", "@daily", stubborn, timeout_ms=500)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        run = await asyncio.wait_for(scheduler.run_now("stubborn"), 30)
    assert run.status is RunStatus.FAILED, run
    assert run.error and run.error.startswith("timed out after timeout_ms=500; the handler "), run
    assert "ignored the cancellation and returned after" in run.error
    warned = [r for r in caplog.records if getattr(r, "action", None) == "timed_out"]
    assert warned and "ignored its cancellation" in warned[0].getMessage()
