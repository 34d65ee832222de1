"""The run executor's bookkeeping at a run's end, whatever ends it: the run leaves the runs in
progress, an unused handler thread reservation is given back, and ``ActiveRun.result`` settles."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from anarchon import MemoryBackend, RunContext
from anarchon._active import ActiveRun
from anarchon._job import Handler, build_job, job_options
from anarchon._metrics import Counters
from anarchon._runner import RunExecutor
from anarchon._threads import HandlerThreads
from anarchon.backend import ClaimStatus, Ticket
from anarchon.testing import FakeClock
from tests.records import claim_request

START = 1_767_225_600_000


async def _won(backend: MemoryBackend, job: str) -> Ticket:
    [outcome] = await backend.claim([claim_request(job, START, "me")])
    assert outcome.status is ClaimStatus.WON and outcome.ticket is not None
    return outcome.ticket


def _plain(ctx: RunContext) -> None:
    """A plain handler: its run holds a thread reservation until the handler starts."""


async def _async(ctx: RunContext) -> None:
    """An async handler."""


@pytest.fixture
def threads() -> Iterator[HandlerThreads]:
    threads = HandlerThreads(max_workers=1)
    yield threads
    threads.close()


async def _start(
    threads: HandlerThreads, handler: Handler, reserved: bool = False
) -> tuple[RunExecutor, ActiveRun]:
    """A run of job ``a`` won on a fresh in-memory backend, started by a fresh executor."""
    clock = FakeClock(start_ms=START)
    backend = MemoryBackend(clock=clock)
    executor = RunExecutor(backend, clock, threads, Counters(), grace_ms=1_000)
    job = build_job("a", "* * * * *", handler, job_options("test", {}), backend)
    return executor, executor.start(job, await _won(backend, "a"), reserved=reserved)


async def test_a_run_cancelled_before_its_first_step_gives_its_thread_back_and_settles(
    threads: HandlerThreads,
) -> None:
    assert threads.reserve()
    executor, active = await _start(threads, _plain, reserved=True)
    assert active.task is not None
    active.task.cancel()  # before the task's first step: its coroutine never runs
    with pytest.raises(asyncio.CancelledError):
        await active.result
    assert executor.active == {}, "the run left the runs in progress"
    assert threads.free == 1, "the reservation was given back"


async def test_the_result_asked_for_after_the_run_ended_is_the_recorded_run(
    threads: HandlerThreads,
) -> None:
    executor, active = await _start(threads, _async)
    assert active.task is not None
    await asyncio.wait({active.task})
    await asyncio.sleep(0)  # the task's done callback
    run = await active.result
    assert run is not None and run.status.value == "succeeded" and run.job == "a"
    assert executor.active == {}
