"""The scheduler core on the in-memory backend with a clock moved by hand."""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import signal
from collections.abc import Callable, Sequence

import pytest

from anarchon import BackendUnavailable, RunContext, RunStatus, Scheduler, Trigger
from anarchon.backend import ClaimOutcome, ClaimRequest, JobPolicy, Ticket
from anarchon.testing import FakeClock, MemoryBackend

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000


class FlakyBackend(MemoryBackend):
    """A memory backend that can be switched off, and can refuse renewals."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.down = False
        self.renew_down = False
        self.claims = 0

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        self.claims += 1
        if self.down:
            raise BackendUnavailable("switched off by the test")
        return await super().claim(requests)

    async def renew(self, ticket: Ticket) -> Ticket:
        if self.down or self.renew_down:
            raise BackendUnavailable("switched off by the test")
        return await super().renew(ticket)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


async def test_each_slot_fires_once_within_its_jitter(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    fired: list[tuple[int, int, str]] = []

    async def handler(ctx: RunContext) -> None:
        assert ctx.slot is not None
        fired.append((int(ctx.slot.timestamp() * 1000), clock.now_ms(), ctx.instance))

    fleet = [Scheduler(backend, clock=clock, instance_id=f"i{n}") for n in range(3)]
    for scheduler in fleet:
        scheduler.add("tick", "* * * * *", handler, jitter_ms=2_000)
        await scheduler.start()
    await clock.advance(5 * MINUTE + 5_000)
    for scheduler in fleet:
        await scheduler.stop()
    assert [slot for slot, _, _ in fired] == [START + n * MINUTE for n in range(1, 6)]
    assert all(0 <= at - slot <= 2_100 for slot, at, _ in fired), fired


async def test_a_late_instance_records_the_slot_as_too_late(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(clock=clock)
    ran: list[int] = []

    async def handler(ctx: RunContext) -> None:
        assert ctx.slot is not None
        ran.append(int(ctx.slot.timestamp() * 1000))

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "* * * * *", handler, jitter_ms=0, max_late_ms=10_000)
    async with scheduler:
        caplog.set_level(logging.WARNING, "anarchon")
        # The process is frozen for 3.5 minutes: the timer wakes long after three slots. The
        # two older ones are passed over (behind: a backlog, see test_backlog); the newest,
        # 3:00, is judged as any slot: 30 s late, too late.
        await clock.advance(3 * MINUTE + 30_000, step_ms=3 * MINUTE + 30_000)
        await clock.advance(MINUTE, step_ms=500)
        history = await scheduler.history("tick")
    assert ran == [START + 4 * MINUTE]
    late = [(r.slot_ms or 0, r.reason or "") for r in history if r.status is RunStatus.SKIPPED]
    behind = sorted(slot for slot, reason in late if reason.startswith("behind: "))
    assert behind == [START + MINUTE, START + 2 * MINUTE]
    [(slot, reason)] = [(slot, reason) for slot, reason in late if "too late" in reason]
    assert slot == START + 3 * MINUTE and "max_late_ms=10000" in reason
    assert any(getattr(r, "action", None) == "too_late" for r in caplog.records)
    assert scheduler.metrics()["too_late"] == 1


async def test_claims_fail_closed_and_recover(clock: FakeClock) -> None:
    backend = FlakyBackend(clock)
    ran: list[int] = []

    async def handler(ctx: RunContext) -> None:
        assert ctx.slot is not None
        ran.append(int(ctx.slot.timestamp() * 1000))

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "* * * * * *", handler, jitter_ms=0, max_late_ms=2_000)
    async with scheduler:
        await clock.advance(3_000)
        assert len(ran) == 3
        backend.down = True
        await clock.advance(10_000)
        assert len(ran) == 3, "a slot ran while the backend was down"
        attempts = backend.claims
        backend.down = False
        await clock.advance(3_000)
    assert len(ran) >= 5, "the scheduler did not recover"
    assert attempts > 10, "claims were not retried"
    assert (scheduler.metrics()["claim_errors"] or 0) > 0


async def test_a_runner_that_cannot_renew_stops_and_a_backup_takes_over(clock: FakeClock) -> None:
    backend = FlakyBackend(clock)
    contexts: list[RunContext] = []
    release = asyncio.Event()

    async def long(ctx: RunContext) -> None:
        contexts.append(ctx)
        if ctx.attempt == 1:
            await ctx.wait_lease_lost()
            await asyncio.sleep(3600)
        await release.wait()

    runner = Scheduler(backend, clock=clock, instance_id="runner")
    backup = Scheduler(MemoryBackendView(backend), clock=clock, instance_id="backup")
    for scheduler in (runner, backup):
        scheduler.add("long", "0 * * * *", long, jitter_ms=0, lease_ms=3_000)
        await scheduler.start()
    await clock.advance(60 * MINUTE + 100)
    assert [c.instance for c in contexts] == [contexts[0].instance]
    backend.renew_down = True  # the runner's renewals fail; the backup's claim path still works
    await clock.advance(5_000)
    assert contexts[0].lease_lost
    assert [c.attempt for c in contexts] == [1, 2]
    assert contexts[1].fence is not None and contexts[0].fence is not None
    assert contexts[1].fence > contexts[0].fence
    assert contexts[1].instance != contexts[0].instance
    backend.renew_down = False
    release.set()
    await clock.advance(1_000)
    history = await backup.history("long")
    for scheduler in (runner, backup):
        await scheduler.stop()
    assert [(r.attempt, r.status, r.reason) for r in history] == [
        (2, RunStatus.SUCCEEDED, None),
        (1, RunStatus.FAILED, "lease lost"),
    ]


class MemoryBackendView(MemoryBackend):
    """Another instance's view of the same store, whose renewals bypass FlakyBackend."""

    def __init__(self, shared: MemoryBackend) -> None:
        self.__dict__ = shared.__dict__


async def test_stop_hands_running_work_over(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    attempts: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        attempts.append((ctx.attempt, ctx.instance))
        if ctx.instance == "leaving":
            await asyncio.sleep(3600)
        done.set()

    leaving = Scheduler(backend, clock=clock, instance_id="leaving", grace_ms=0)
    staying = Scheduler(backend, clock=clock, instance_id="staying")
    leaving.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=60_000)
    staying.add("work", "0 * * * *", work, jitter_ms=5_000, lease_ms=60_000)
    await leaving.start()
    await staying.start()
    await clock.advance(60 * MINUTE + 6_000)
    assert attempts == [(1, "leaving")]
    await leaving.stop()
    await clock.advance(200)
    assert attempts == [(1, "leaving"), (2, "staying")], "hand-over waited for lease expiry"
    assert done.is_set()
    history = await staying.history("work")
    await staying.stop()
    assert [(r.attempt, r.reason) for r in history] == [(2, None), (1, "handed over")]


async def test_ten_thousand_jobs_keep_one_timer(clock: FakeClock) -> None:
    async def handler(ctx: RunContext) -> None:
        pass

    async def tasks_while_idle(jobs: int) -> int:
        scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
        for n in range(jobs):
            scheduler.add(f"job{n}", f"{n % 60} {n % 24} * * *", handler)
        async with scheduler:
            await clock.advance(1_000)
            assert len(scheduler._services.firing.timer) == jobs
            return len(asyncio.all_tasks())

    assert await tasks_while_idle(10_000) == await tasks_while_idle(1), "tasks grow with jobs"


async def test_jobs_armed_at_once_fire_as_if_pushed_one_by_one(clock: FakeClock) -> None:
    """start() puts every job's first slot on the timer in one go (push_many): the heap hands
    them over in the order single pushes would, and a slot earlier than any waiting wakes the
    timer."""
    from anarchon._timer import SlotTimer

    entries = [(f"j{n}", 1_000 * (n % 7), 1_000 * (n % 7) + n % 3, n) for n in range(50)]
    one, bulk = SlotTimer(clock, lambda batch: None), SlotTimer(clock, lambda batch: None)
    for entry in entries:
        one.push(*entry)
    bulk.push_many(entries[:20])
    bulk.push_many(entries[20:])
    assert sorted(one._heap) == sorted(bulk._heap) and len(bulk) == 50
    heap = list(bulk._heap)
    assert [heapq.heappop(heap) for _ in range(50)] == sorted(one._heap)
    bulk._wake.clear()
    bulk.push_many([("late", 9_000, 9_000, 0)])
    assert not bulk._wake.is_set()
    bulk.push_many([("early", 0, -1, 0)])
    assert bulk._wake.is_set()


async def test_clock_skew_is_measured_and_warned(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Skewed(MemoryBackend):
        async def server_time_ms(self) -> int | None:
            return clock.now_ms() + 45_000

    scheduler = Scheduler(Skewed(clock=clock), clock=clock)
    scheduler.add("tick", "* * * * *", lambda ctx: None)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(100)
        assert scheduler.metrics()["clock_offset_ms"] == 45_000
    assert any(getattr(r, "action", None) == "clock_skew" for r in caplog.records)


@pytest.mark.parametrize(("offset", "warned"), [(250, False), (-250, False), (251, True)])
async def test_clock_skew_under_the_floor_does_not_walk_the_jobs(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, offset: int, warned: bool
) -> None:
    """An offset of at most 250 ms is never warned of, so the jobs' skew budgets are not read
    (100 000 of them took 0.2 s a minute on NATS); just past it, a tight budget warns."""
    asked: list[str] = []

    class Skewed(MemoryBackend):
        async def server_time_ms(self) -> int | None:
            return clock.now_ms() + offset

        def skew_budget_ms(self, policy: JobPolicy) -> int | None:
            asked.append(policy.name)
            return 1_000  # warn from 100 ms: the floor decides

    scheduler = Scheduler(Skewed(clock=clock), clock=clock)
    scheduler.add("tick", "* * * * *", lambda ctx: None)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(100)
        assert scheduler._services.backend_clock.offset_ms == offset
    skew = [r for r in caplog.records if getattr(r, "action", None) == "clock_skew"]
    assert bool(skew) is warned and bool(asked) is warned


async def test_manual_run_and_context(clock: FakeClock) -> None:
    seen: list[RunContext] = []

    def plain(ctx: RunContext) -> None:
        seen.append(ctx)
        ctx.logger.info("working")
        ctx.check_lease()

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock, instance_id="me")
    scheduler.add("plain", "@daily", plain)
    async with scheduler:
        run = await scheduler.run_now("plain")
    assert run.trigger is Trigger.MANUAL and run.status is RunStatus.SUCCEEDED
    assert seen[0].run_id == run.run_id and seen[0].slot is None and seen[0].instance == "me"
    assert not seen[0].lease_lost


class NotifyingBackend(MemoryBackend):
    """A memory backend that keeps the scheduler's notification callback for the test."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.on_change: list[Callable[[str, str, bool], None]] = []

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        self.on_change.append(on_change)
        await super().subscribe(on_change)


async def test_a_burst_of_notifications_does_not_drown_a_signal(clock: FakeClock) -> None:
    # A backend's listener reports thousands of results at once after a burst. Each report
    # once went through call_soon_threadsafe, which writes a byte to the loop's self-pipe; the
    # pipe filled, the byte that carries SIGTERM to the loop was dropped, and stop() never ran.
    backend = NotifyingBackend(clock)
    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "* * * * *", lambda ctx: None)
    await scheduler.start()
    loop = asyncio.get_running_loop()
    heard = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, heard.set)
    try:
        [notify] = backend.on_change
        for n in range(20_000):
            notify("tick", str(n), False)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.wait_for(heard.wait(), 5)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        await scheduler.stop()


def test_the_decorator_forwards_its_options_to_add() -> None:
    scheduler = Scheduler(MemoryBackend(clock=FakeClock(START)), clock=FakeClock(START))

    @scheduler.job("report", "0 6 * * *", timezone="Europe/Athens", lease_ms=45_000, jitter_ms=0)
    async def report(ctx: RunContext) -> None:
        pass

    job = scheduler._jobs["report"]
    assert (job.schedule.timezone, job.policy.lease_ms, job.policy.jitter_ms) == (
        "Europe/Athens",
        45_000,
        0,
    )
    with pytest.raises(TypeError, match="'leese_ms'"):
        scheduler.job("other", "@daily", leese_ms=1)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"Scheduler\.add\(\) got an unexpected keyword .*'leese_ms'"
    ):
        scheduler.add("other", "@daily", report, leese_ms=1)  # type: ignore[call-arg]
    assert sorted(scheduler.jobs) == ["report"]


def test_add_with_every_option_at_its_default_takes_the_documented_defaults() -> None:
    scheduler = Scheduler(MemoryBackend(clock=FakeClock(START)), clock=FakeClock(START))

    async def handler(ctx: RunContext) -> None:
        pass

    scheduler.add("plain", "* * * * *", handler)
    job = scheduler._jobs["plain"]
    assert job.schedule.timezone == "UTC"
    assert (job.options.retries, job.options.on_failure) == (0, None)
    assert (job.policy.lease_ms, job.options.retry_backoff_ms) == (15_000, 1_000)
