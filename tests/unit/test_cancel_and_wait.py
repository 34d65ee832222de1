"""``cancel_and_wait`` (``anarchon.kit.calls``, the scheduler's and every backend's stops) consumes
what the tasks it cancels end with: an error raised instead of the cancellation is logged once,
never raised, and asyncio has nothing left to report as "never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from anarchon import MemoryBackend, Scheduler
from anarchon.kit.calls import cancel_and_wait


async def _fails_when_cancelled() -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        raise RuntimeError("cleanup failed") from None


async def _ignores_cancellation_until(release: asyncio.Event) -> None:
    """Swallows every cancellation (as some drivers' timeouts do) until ``release`` is set."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue


def _never_retrieved(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_an_error_raised_on_cancellation_is_logged_not_raised_nor_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    task = asyncio.ensure_future(_fails_when_cancelled())
    await asyncio.sleep(0)  # the task waits in its sleep
    await cancel_and_wait([task])  # the defaults
    assert task.done()
    del task
    gc.collect()  # asyncio reports an unretrieved exception when the task is collected
    await asyncio.sleep(0)
    assert _never_retrieved(caplog) == []
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert getattr(logged[0], "action", None) == "stop"
    assert "RuntimeError" in logged[0].getMessage()


async def test_a_task_that_had_failed_before_is_consumed_and_a_cancelled_one_is_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)

    async def fails() -> None:
        raise ValueError("broken")

    failed = asyncio.ensure_future(fails())
    quiet = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await cancel_and_wait([failed, quiet], limit_s=5.0)
    assert quiet.cancelled()
    del failed, quiet
    gc.collect()
    await asyncio.sleep(0)
    assert _never_retrieved(caplog) == []
    logged = [r for r in caplog.records if r.exc_info]
    assert [r.exc_info[0] for r in logged if r.exc_info] == [ValueError]


async def test_a_schedulers_task_failing_on_its_stop_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A short task of the scheduler (a claim's, a hook's) cancelled by the stop: its error is
    # logged by cancel_and_wait, not a second time as an internal error.
    caplog.set_level(logging.WARNING)
    scheduler = Scheduler(MemoryBackend(), instance_id="one")
    async with scheduler:
        scheduler._services.spawn(_fails_when_cancelled())
        await asyncio.sleep(0)
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert [getattr(r, "action", None) for r in logged] == ["stop"]


async def test_a_backends_call_logs_on_the_backends_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A backend's stop calls it through anarchon.kit.calls with its own logger (NATS:
    # cancel_unfinished); before, its tasks' errors were logged on anarchon.scheduler.
    from anarchon.backends.nats._connection import cancel_unfinished

    caplog.set_level(logging.WARNING)
    task = asyncio.ensure_future(_fails_when_cancelled())
    await asyncio.sleep(0)
    await cancel_unfinished(task)
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert [(r.name, getattr(r, "action", None)) for r in logged] == [
        ("anarchon.backends.nats", "stop")
    ]


async def test_a_task_left_behind_is_logged_on_the_callers_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    release = asyncio.Event()
    task = asyncio.ensure_future(_ignores_cancellation_until(release))
    await asyncio.sleep(0)
    mine = logging.getLogger("tests.cancel_and_wait")
    try:
        await cancel_and_wait([task], limit_s=0.3, logger=mine)
    finally:
        release.set()  # a failure here must not leave a task that outlives the test
        await task
    left = [r for r in caplog.records if "did not stop" in r.getMessage()]
    assert [(r.name, getattr(r, "action", None)) for r in left] == [
        ("tests.cancel_and_wait", "stop")
    ]


async def test_an_error_a_task_left_behind_ends_with_later_is_logged_not_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A task that swallowed the cancellations until limit_s and fails afterwards: its error was
    # reported by asyncio as "never retrieved" (at garbage collection), not logged as stop's.
    caplog.set_level(logging.WARNING)
    release = asyncio.Event()

    async def stubborn_then_fails() -> None:
        await _ignores_cancellation_until(release)
        raise RuntimeError("failed after it was left behind")

    task = asyncio.ensure_future(stubborn_then_fails())
    await asyncio.sleep(0)
    try:
        await cancel_and_wait([task], limit_s=0.3)
        assert not task.done()
    finally:
        release.set()  # a failure here must not leave a task that outlives the test
        await asyncio.wait({task})
    await asyncio.sleep(0)  # its done callbacks run
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert _never_retrieved(caplog) == []
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert [(r.name, getattr(r, "action", None)) for r in logged] == [
        ("anarchon.scheduler", "stop")
    ]
