"""stop() drains: handlers run up to grace_ms while their leases are still renewed, and only what
is left then is handed over. With the defaults (grace 30 s > lease 15 s) a handler that needs
longer than a lease after SIGTERM must not be run a second time by a backup."""

from __future__ import annotations

import asyncio

from anarchon import RunContext, RunStatus, Scheduler
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, Recording, View


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


async def test_what_is_left_after_the_grace_is_handed_over_at_once() -> None:
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
        await clock.advance(4_500)
        assert seen == [("leaving", 1)], "taken over during the grace period"
        await clock.advance(1_000)
        await asyncio.wait_for(stopping, 5)
        await clock.advance(500)
        assert seen == [("leaving", 1), ("staying", 2)]
        assert done.is_set()
        history = await staying.history("work")
    finally:
        for scheduler in (leaving, staying):
            await scheduler.stop()
    assert [(r.attempt, r.reason) for r in history] == [(2, None), (1, "handed over")]
