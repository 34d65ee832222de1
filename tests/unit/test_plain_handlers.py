"""Plain (thread) handlers: a thread is reserved before a slot is claimed, and a thread that runs
past timeout_ms keeps its run's lease until it really returns. Real time: threads do not follow
a fake clock."""

from __future__ import annotations

import asyncio
import threading
import time

from anarchon import MemoryBackend, RunContext, RunStatus, Scheduler
from tests.unit.core_helpers import until

EVERY_SECOND = "* * * * * *"


async def test_a_timed_out_thread_keeps_its_lease_until_it_returns() -> None:
    lock = threading.Lock()
    running = 0
    most = 0
    told: list[bool] = []

    def stubborn(ctx: RunContext) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(2.5)  # ignores its timeout, as a blocking call would
        finally:
            with lock:
                running -= 1
            told.append(getattr(ctx, "timed_out", False) and getattr(ctx, "should_stop", False))

    scheduler = Scheduler(MemoryBackend(), grace_ms=5_000)
    scheduler.add("stubborn", EVERY_SECOND, stubborn, jitter_ms=0, timeout_ms=300, lease_ms=900)
    async with scheduler:
        await until(lambda: told, 15, "the first run to return")
        await asyncio.sleep(0.5)
        history = await scheduler.history("stubborn", limit=50)
    assert most == 1, "a second thread started beside the one that timed out"
    assert told[0], "ctx.timed_out / ctx.should_stop did not tell the handler"
    ran = [r for r in history if r.status is not RunStatus.SKIPPED]
    first = min(ran, key=lambda r: r.started_at)
    assert first.status is RunStatus.FAILED and first.error == "timed out after timeout_ms=300"
    assert first.duration is not None and first.duration >= 2.0, "recorded before it returned"
    skipped = [r for r in history if r.status is RunStatus.SKIPPED]
    assert skipped and all(r.reason and r.reason.startswith("overlap") for r in skipped)


async def test_no_slot_is_claimed_without_a_free_thread() -> None:
    backend = MemoryBackend()
    stuck = threading.Event()
    runs: list[tuple[str, int]] = []

    def hang(ctx: RunContext) -> None:
        stuck.wait(30)

    def other(ctx: RunContext) -> None:
        assert ctx.slot is not None
        runs.append((ctx.instance, int(ctx.slot.timestamp())))

    busy = Scheduler(backend, instance_id="busy", max_workers=1, grace_ms=100)
    free = Scheduler(backend, instance_id="free")
    busy.add("hang", EVERY_SECOND, hang, jitter_ms=0)
    busy.add("other", EVERY_SECOND, other, jitter_ms=0)  # claims first, if it claims at all
    free.add("other", EVERY_SECOND, other, jitter_ms=300)
    try:
        for scheduler in (busy, free):
            await scheduler.start()
        await until(lambda: len(runs) >= 4, 15, "four runs of 'other'")
        history = await free.history("other", limit=50)
        metrics = busy.metrics()
    finally:
        stuck.set()
        for scheduler in (busy, free):
            await scheduler.stop()
    assert {instance for instance, _ in runs[-3:]} == {"free"}, runs
    assert not [r for r in history if r.instance == "busy" and r.status is RunStatus.RUNNING]
    assert (metrics.get("no_thread") or 0) >= 3
