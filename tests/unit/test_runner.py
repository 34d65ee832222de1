"""The run executor's bookkeeping at a run's end, whatever ends it: the run leaves the runs in
progress, an unused handler thread reservation is given back, and ``ActiveRun.result`` settles."""

from __future__ import annotations

import asyncio

import pytest

from anarchon import MemoryBackend, RunContext
from anarchon._job import build_job, job_options
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


async def test_a_run_cancelled_before_its_first_step_gives_its_thread_back_and_settles() -> None:
    clock = FakeClock(start_ms=START)
    backend = MemoryBackend(clock=clock)
    threads = HandlerThreads(max_workers=1)
    executor = RunExecutor(backend, clock, threads, Counters(), grace_ms=1_000)
    job = build_job("a", "* * * * *", _plain, job_options("test", {}), backend)
    assert threads.reserve()
    active = executor.start(job, await _won(backend, "a"), reserved=True)
    assert active.task is not None
    active.task.cancel()  # before the task's first step: its coroutine never runs
    with pytest.raises(asyncio.CancelledError):
        await active.result
    assert executor.active == {}, "the run left the runs in progress"
    assert threads.free == 1, "the reservation was given back"
    threads.close()


async def test_the_result_asked_for_after_the_run_ended_is_the_recorded_run() -> None:
    clock = FakeClock(start_ms=START)
    backend = MemoryBackend(clock=clock)
    threads = HandlerThreads(max_workers=1)
    executor = RunExecutor(backend, clock, threads, Counters(), grace_ms=1_000)
    job = build_job("a", "* * * * *", _async, job_options("test", {}), backend)
    active = executor.start(job, await _won(backend, "a"))
    assert active.task is not None
    await asyncio.wait({active.task})
    await asyncio.sleep(0)  # the task's done callback
    run = await active.result
    assert run is not None and run.status.value == "succeeded" and run.job == "a"
    assert executor.active == {}
    threads.close()
