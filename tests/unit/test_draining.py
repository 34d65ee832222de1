"""stop() drains: handlers run up to grace_ms while their leases are still renewed, and only what
is left then is handed over. With the defaults (grace 30 s > lease 15 s) a handler that needs
longer than a lease after SIGTERM must not be run a second time by a backup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading

import pytest

from anarchon import RunContext, RunStatus, Scheduler
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, Recording, View, stopping_during_a_run, until


async def _drain_once(grace_ms: int | None, lease_ms: int | None, needs_ms: int) -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[RunContext] = []

    async def work(ctx: RunContext) -> None:
        seen.append(ctx)
        await clock.sleep(needs_ms / 1000)

    # None: the option left at its default.
    runner = Scheduler(backend, clock=clock, instance_id="runner")
    if grace_ms is not None:
        runner = Scheduler(backend, clock=clock, instance_id="runner", grace_ms=grace_ms)
    backup = Scheduler(View(backend), clock=clock, instance_id="backup")
    runner.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=lease_ms)
    backup.add("work", "0 * * * *", work, jitter_ms=1_000, lease_ms=lease_ms)
    for scheduler in (runner, backup):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 2_000)
        assert [c.instance for c in seen] == ["runner"]
        renewals_before = len(backend.named("renew"))
        stopping = asyncio.ensure_future(runner.stop())  # SIGTERM while the handler works
        await clock.advance(needs_ms + 1_000)
        await asyncio.wait_for(stopping, 5)
        history = await backup.history("work")
    finally:
        for scheduler in (runner, backup):
            await scheduler.stop()
    assert [(c.instance, c.attempt) for c in seen] == [("runner", 1)], "a backup ran it too"
    assert not seen[0].lease_lost
    assert len(backend.named("renew")) > renewals_before, "no renewal while draining"
    assert [(r.attempt, r.status) for r in history] == [(1, RunStatus.SUCCEEDED)]


async def test_a_draining_handler_keeps_its_lease_with_the_defaults() -> None:
    # grace_ms=30000, lease_ms=15000: the handler needs 20 s more after stop() began.
    await _drain_once(grace_ms=None, lease_ms=None, needs_ms=20_000)


async def test_a_draining_handler_keeps_its_lease_longer_than_several_leases() -> None:
    await _drain_once(grace_ms=10_000, lease_ms=1_000, needs_ms=8_000)


@pytest.mark.parametrize("gives_up", [False, True], ids=["awaited", "caller-gave-up"])
async def test_what_is_left_after_the_grace_is_handed_over_at_once(gives_up: bool) -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.attempt))
        if ctx.instance == "leaving":
            await clock.sleep(3600)
        done.set()

    leaving = Scheduler(backend, clock=clock, instance_id="leaving", grace_ms=5_000)
    staying = Scheduler(View(backend), clock=clock, instance_id="staying")
    leaving.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=2_000)
    staying.add("work", "0 * * * *", work, jitter_ms=1_000, lease_ms=2_000)
    for scheduler in (leaving, staying):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 2_000)
        stopping = asyncio.ensure_future(leaving.stop())
        if gives_up:
            # The caller gives up (a lifespan's timeout, say). That cut the drain short: the
            # handler was neither given its grace nor cancelled nor handed over; a later stop()
            # returned at once. The stop goes on; a later call waits for the same one.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stopping, 0.2)
        await clock.advance(4_500)
        assert seen == [("leaving", 1)], "taken over during the grace period"
        await clock.advance(1_000)
        await asyncio.wait_for(leaving.stop() if gives_up else stopping, 5)
        await clock.advance(500)
        assert seen == [("leaving", 1), ("staying", 2)]
        assert done.is_set()
        history = await staying.history("work")
    finally:
        for scheduler in (leaving, staying):
            await scheduler.stop()
    assert [(r.attempt, r.reason) for r in history] == [(2, None), (1, "handed over")]


async def test_a_second_signal_ends_the_grace_at_once_and_a_third_is_not_caught(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Defaults (grace 30 s, lease 15 s). SIGTERM, then SIGINT while the handler has an hour to
    # go: without the second signal stop() would wait out the grace (nobody moves this clock 30 s).
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[tuple[str, int]] = []
    third_caught: list[bool] = []

    async def work(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.attempt))
        if ctx.instance == "leaving":
            try:
                await clock.sleep(3600)
            except asyncio.CancelledError:
                caught = signal.getsignal(signal.SIGINT) is not signal.default_int_handler
                third_caught.append(caught)
                raise

    leaving = Scheduler(backend, clock=clock, instance_id="leaving")
    staying = Scheduler(View(backend), clock=clock, instance_id="staying")
    leaving.add("work", "0 * * * *", work, jitter_ms=0)
    staying.add("work", "0 * * * *", work, jitter_ms=1_000)
    serving = asyncio.ensure_future(leaving.serve())
    try:
        await until(lambda: leaving.running, 5, "the leaving instance to start")
        await staying.start()
        await clock.advance(60 * MINUTE + 2_000)
        assert seen == [("leaving", 1)]
        os.kill(os.getpid(), signal.SIGTERM)
        await until(lambda: not leaving.running, 5, "the stop to begin")
        await clock.advance(1_000)
        assert seen == [("leaving", 1)], "handed over during the grace period"
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(serving, 10)
        await clock.advance(500)
        assert seen == [("leaving", 1), ("staying", 2)]
        history = await staying.history("work")
    finally:
        serving.cancel()
        await staying.stop()
    assert third_caught == [False], "SIGINT still caught after the second signal"
    assert [(r.attempt, r.reason) for r in history] == [(2, None), (1, "handed over")]
    said = [(getattr(r, "action", None), getattr(r, "signal", None)) for r in caplog.records]
    assert ("signal", "SIGTERM") in said and ("grace_cut_short", "SIGINT") in said, said


async def test_a_handler_that_ignores_its_cancellation_keeps_its_lease_until_it_ends() -> None:
    # Defaults (grace 30 s, lease 15 s). The handler swallows CancelledError and works 60 s more
    # after the grace: handing it over would let the backup run the slot beside it. stop()
    # returns (bounded); the lease stays renewed until the handler ends, its result recorded.
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[tuple[str, int]] = []
    ended: list[str] = []

    async def work(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.attempt))
        if ctx.instance == "runner":
            for _ in range(90):
                with contextlib.suppress(asyncio.CancelledError):  # the fault: it works on
                    await clock.sleep(1)
        ended.append(ctx.instance)

    runner = Scheduler(backend, clock=clock, instance_id="runner")
    backup = Scheduler(View(backend), clock=clock, instance_id="backup")
    runner.add("work", "0 * * * *", work, jitter_ms=0)
    backup.add("work", "0 * * * *", work, jitter_ms=1_000)
    for scheduler in (runner, backup):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 2_000)
        stopping = asyncio.ensure_future(runner.stop())
        for _ in range(42):  # past the grace (30 s) and the cancel grace (10 s)
            await clock.advance(1_000)
        await asyncio.wait_for(stopping, 5)  # stop() is bounded: it does not wait for it
        for _ in range(38):  # the handler works on for 38 s more, past two leases
            await clock.advance(1_000)
        assert seen == [("runner", 1)], "a backup ran the slot beside a handler still running"
        assert ended == [], "the handler should still be working"
        for _ in range(15):
            await clock.advance(1_000)
        assert ended == ["runner"]
        for _ in range(20):
            await clock.advance(1_000)
        history = await backup.history("work")
    finally:
        for scheduler in (runner, backup):
            await scheduler.stop()
    assert seen == [("runner", 1)]
    assert ended == ["runner"]
    assert runner.metrics()["cancel_ignored"] == 1
    assert [(r.attempt, r.status) for r in history] == [(1, RunStatus.SUCCEEDED)]


async def test_a_thread_still_running_after_the_grace_is_not_handed_over() -> None:
    # A thread cannot be stopped: releasing its lease would let the backup start the slot while
    # it still works. The lease is left to expire; only then does the backup take over.
    clock = FakeClock(START)
    backend = Recording(clock)
    seen: list[tuple[str, int]] = []
    release = threading.Event()

    def work(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.attempt))
        if ctx.instance == "leaving":
            release.wait(30)

    leaving = Scheduler(backend, clock=clock, instance_id="leaving", grace_ms=2_000)
    staying = Scheduler(View(backend), clock=clock, instance_id="staying")
    leaving.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    staying.add("work", "0 * * * *", work, jitter_ms=1_000, lease_ms=3_000)
    for scheduler in (leaving, staying):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 500)
        await until(lambda: seen, 5, "the thread to start")
        stopping = asyncio.ensure_future(leaving.stop())
        for _ in range(12):  # past the grace (2 s) and the cancel grace (10 s)
            await clock.advance(250)
            await asyncio.sleep(0.01)
        await asyncio.wait_for(stopping, 5)
        await asyncio.sleep(0.2)
        assert seen == [("leaving", 1)], "handed over while its thread still ran"
        for _ in range(40):  # the lease (3 s) expires: the backup takes over
            await clock.advance(250)
            await asyncio.sleep(0.01)
        await until(lambda: len(seen) == 2, 5, "the backup to take over")
        assert seen == [("leaving", 1), ("staying", 2)]
    finally:
        release.set()
        for scheduler in (leaving, staying):
            await scheduler.stop()


async def test_a_second_stop_waits_for_the_first_to_end() -> None:
    # It returned at once while the first still drained: a caller that then left (asyncio.run()
    # ending, a lifespan closing) cut the drain short and the hand-over with it.
    clock = FakeClock(START)
    ended: list[int] = []
    scheduler, first = await stopping_during_a_run(clock, 20, ended)
    second = asyncio.ensure_future(scheduler.stop())
    await asyncio.sleep(0.2)
    assert not second.done(), "the second stop() returned while the first still drained"
    await clock.advance(21_000)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert ended == [1]
    await asyncio.wait_for(scheduler.stop(), 1)  # and a call after the end returns at once


async def test_a_stop_after_a_cancelled_one_waits_for_the_same_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Cancelling the first call cut the drain short and a later call returned at once: the
    # handler ran on unwatched, "stopped" was never logged. The stop is the same one, in a task
    # of its own: cancelling a caller leaves it to drain; a later call waits for it.
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    clock = FakeClock(START)
    ended: list[int] = []
    scheduler, first = await stopping_during_a_run(clock, 20, ended)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    second = asyncio.ensure_future(scheduler.stop())
    await asyncio.sleep(0.2)
    assert not second.done(), "a stop after a cancelled one returned while the run drained"
    await clock.advance(21_000)
    await asyncio.wait_for(second, 5)
    assert ended == [1], "the draining handler did not finish"
    assert [getattr(r, "action", None) for r in caplog.records].count("stopped") == 1


async def test_two_signals_at_once_still_cut_the_grace_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Both may be handled before the stop takes the signals over: the second still counts.
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    clock = FakeClock(START)
    ended: list[int] = []

    async def work(ctx: RunContext) -> None:
        await clock.sleep(3600)
        ended.append(ctx.attempt)

    scheduler = Scheduler(Recording(clock), clock=clock, instance_id="one")
    scheduler.add("work", "0 * * * *", work, jitter_ms=0)
    serving = asyncio.ensure_future(scheduler.serve())
    try:
        await until(lambda: scheduler.running, 5, "the scheduler to start")
        await clock.advance(60 * MINUTE + 2_000)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 10)  # the grace (30 s on a clock nobody moves) cut short
    finally:
        serving.cancel()
    said = [getattr(r, "action", None) for r in caplog.records]
    assert said.count("signal") == 1 and said.count("grace_cut_short") == 1, said
    assert ended == [], "the handler was not cancelled"
