"""Calls that need a running scheduler say what is true in each state: before start(), start it;
while it stops or after, it cannot start again (make a new Scheduler). add() is refused once
stop() was called, where the job would never fire; before start() and while running it is
allowed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from anarchon import RunContext, RunStatus, Scheduler, SchedulerStateError
from anarchon.testing import MemoryBackend
from tests.unit.core_helpers import until

DAILY = "0 0 * * *"
Calls = dict[str, Callable[[], Awaitable[Any]]]


def _calls(scheduler: Scheduler) -> Calls:
    return {
        "history": lambda: scheduler.history("a"),
        "last_run": lambda: scheduler.last_run("a"),
        "run_now": lambda: scheduler.run_now("a"),
        "pause": lambda: scheduler.pause("a"),
        "pause_all": scheduler.pause_all,
        "resume": lambda: scheduler.resume("a"),
        "resume_all": scheduler.resume_all,
        "paused": scheduler.paused,
        "trigger": lambda: scheduler.trigger("a"),
        "cluster": scheduler.cluster,
    }


async def _refused(calls: Calls, *words: str, never: str | None = None) -> None:
    for call, make in calls.items():
        with pytest.raises(SchedulerStateError) as caught:
            await make()
        text = str(caught.value)
        assert text.startswith(f"{call}() needs a running scheduler"), text
        for word in words:
            assert word in text, text
        if never is not None:
            assert never not in text, text


async def _quick(ctx: RunContext) -> None:
    pass


async def test_before_start_the_calls_say_to_start_it_and_add_is_allowed() -> None:
    scheduler = Scheduler(MemoryBackend())
    scheduler.add("a", DAILY, _quick)
    await _refused(_calls(scheduler), "not started yet", "'await scheduler.start()'")
    scheduler.add("b", DAILY, _quick)
    async with scheduler:
        scheduler.add("c", DAILY, _quick)  # while running, too
        assert (await scheduler.run_now("c")).status is RunStatus.SUCCEEDED
    assert sorted(scheduler.jobs) == ["a", "b", "c"]


async def test_while_stopping_the_calls_and_add_say_it_cannot_start_again() -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def held(ctx: RunContext) -> None:
        started.append(ctx.run_id)
        await release.wait()

    scheduler = Scheduler(MemoryBackend())  # grace_ms at its default: the drain waits for held
    scheduler.add("a", DAILY, held)
    await scheduler.start()
    running = asyncio.ensure_future(scheduler.run_now("a"))
    await until(lambda: started, 10, "the handler to start")
    stopping = asyncio.ensure_future(scheduler.stop())
    try:
        await until(lambda: not scheduler.running, 10, "the stop to begin")
        assert not stopping.done()
        await _refused(
            _calls(scheduler),
            "is stopping (stop() was called)",
            "make a new Scheduler",
            never="start()'",
        )
        with pytest.raises(SchedulerStateError) as caught:
            scheduler.add("late", "* * * * * *", _quick)
        text = str(caught.value)
        assert "cannot add job 'late'" in text and "is stopping" in text, text
        assert "would never fire it" in text and "new Scheduler" in text, text
        with pytest.raises(SchedulerStateError, match="cannot add job 'later'"):
            scheduler.job("later", DAILY)(_quick)
        assert list(scheduler.jobs) == ["a"]
    finally:
        release.set()
        await stopping
    assert (await running).status is RunStatus.SUCCEEDED


@pytest.mark.parametrize("started", [True, False], ids=["after-running", "never-started"])
async def test_after_stop_the_calls_and_add_say_it_has_stopped(started: bool) -> None:
    scheduler = Scheduler(MemoryBackend())
    scheduler.add("a", DAILY, _quick)
    if started:
        await scheduler.start()
    await scheduler.stop()
    await _refused(_calls(scheduler), "has stopped", "make a new Scheduler", never="start()'")
    with pytest.raises(SchedulerStateError, match="cannot add job 'b': the scheduler has stopped"):
        scheduler.add("b", DAILY, _quick)
    assert list(scheduler.jobs) == ["a"]
