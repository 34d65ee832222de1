"""Three kinds of time: a wall-clock step (NTP, a VM resumed) on an instance must not stop its
renewals, make it record coming slots "too late", or bring a backup's takeover forward.

The backend runs on a clock of its own (:class:`BackendClock`), as on another host; only the
instance's wall clock is stepped (:meth:`FakeClock.step`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest

from anarchon import RunContext, RunStatus, Scheduler
from anarchon._clock import SKEW_CHECK_S, SystemClock
from anarchon._timer import LEAD_MS
from anarchon.backend import ClaimRequest
from anarchon.errors import BackendUnavailable
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import (
    MINUTE,
    START,
    BackendClock,
    Recording,
    View,
    on_another_host,
)


def test_fake_clock_steps_the_wall_clock_only() -> None:
    clock = FakeClock(START)
    mono = clock.monotonic_ms()
    clock.step(-60_000)
    assert clock.now_ms() == START - 60_000 and clock.monotonic_ms() == mono


async def test_fake_clock_advance_moves_both_clocks_and_wakes_sleepers() -> None:
    clock = FakeClock(START)
    woke: list[int] = []

    async def sleeper() -> None:
        await clock.sleep(1.0)
        woke.append(clock.monotonic_ms())

    task = asyncio.ensure_future(sleeper())
    await asyncio.sleep(0)
    clock.step(3_600_000)  # a wall step wakes nobody: sleeps are durations
    await asyncio.sleep(0)
    assert not woke
    mono = clock.monotonic_ms()
    await clock.advance(1_000)
    await task
    assert woke == [mono + 1_000] and clock.now_ms() == START + 3_601_000


def test_system_clock_has_a_monotonic_clock() -> None:
    clock = SystemClock()
    first = clock.monotonic_ms()
    assert clock.monotonic_ms() >= first


def test_backend_time_follows_the_monotonic_clock_after_a_measurement() -> None:
    from anarchon._clock import BackendTime

    clock = FakeClock(START)
    estimate = BackendTime(clock)
    assert estimate.now_ms() == START and not estimate.known  # no measurement: the wall clock
    estimate.measured(START + 5_000, clock.monotonic_ms())
    clock.step(-60_000)
    assert estimate.now_ms() == START + 5_000


async def test_a_backward_wall_step_does_not_stop_renewals() -> None:
    clock = FakeClock(START)
    backend = on_another_host(Recording(BackendClock(clock)))
    seen: list[tuple[str, int]] = []
    release = asyncio.Event()

    async def long(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.attempt))
        await release.wait()

    runner = Scheduler(backend, clock=clock, instance_id="runner")
    backup = Scheduler(View(backend), clock=BackendClock(clock), instance_id="backup")
    runner.add("long", "0 * * * *", long, jitter_ms=0, lease_ms=3_000)
    backup.add("long", "0 * * * *", long, jitter_ms=1_000, lease_ms=3_000)
    for scheduler in (runner, backup):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 2_000)
        assert seen == [("runner", 1)]
        stepped_at = backend.named("renew")[-1][1]
        clock.step(-MINUTE)  # the runner's clock goes back a minute; the backend's does not
        await clock.advance(20_000)
        renewals = [at for _, at, _ in backend.named("renew") if at >= stepped_at]
        gaps = [b - a for a, b in itertools.pairwise(renewals)]
        assert seen == [("runner", 1)], "a backup ran the slot while the runner still worked"
        assert len(renewals) >= 18 and max(gaps) <= 1_100, gaps
        release.set()
        await clock.advance(1_000)
        history = await runner.history("long")
    finally:
        for scheduler in (runner, backup):
            await scheduler.stop()
    assert [(r.attempt, r.status) for r in history] == [(1, RunStatus.SUCCEEDED)]


def _every_minute(backend: Any, clock: FakeClock) -> tuple[Scheduler, list[int]]:
    """A scheduler with job ``tick`` every minute (no jitter, max_late_ms 10 s) that records the
    slots it runs, in ms, in the list returned with it."""
    ran: list[int] = []

    async def tick(ctx: RunContext) -> None:
        assert ctx.slot is not None
        ran.append(int(ctx.slot.timestamp() * 1000))

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "* * * * *", tick, jitter_ms=0, max_late_ms=10_000)
    return scheduler, ran


async def test_a_forward_wall_step_records_no_slot_too_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(START)
    backend = on_another_host(MemoryBackend(clock=BackendClock(clock)))
    scheduler, ran = _every_minute(backend, clock)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(30_000)
        clock.step(MINUTE)  # the wall clock jumps a minute ahead of the backend's
        # Slots are claimed when the backend's clock reaches them: 3:00 at 3 min 0 s elapsed.
        await clock.advance(3 * MINUTE)
        history = await scheduler.history("tick")
    too_late = [r for r in history if r.status is RunStatus.SKIPPED]
    assert not too_late, [(r.slot_ms, r.reason) for r in too_late]
    assert ran[:3] == [START + MINUTE, START + 2 * MINUTE, START + 3 * MINUTE]
    steps = [r for r in caplog.records if getattr(r, "action", None) == "clock_step"]
    assert [getattr(r, "step_ms", None) for r in steps] == [MINUTE], "logged once, with its size"
    assert not scheduler.metrics().get("too_late")


async def test_a_forward_wall_step_does_not_bring_a_takeover_check_forward() -> None:
    clock = FakeClock(START)
    backend = on_another_host(Recording(BackendClock(clock)))
    release = asyncio.Event()
    lease = MINUTE

    async def long(ctx: RunContext) -> None:
        await release.wait()

    runner = Scheduler(View(backend), clock=BackendClock(clock), instance_id="runner")
    backup = Scheduler(backend, clock=clock, instance_id="backup")
    runner.add("long", "0 * * * *", long, jitter_ms=0, lease_ms=lease)
    backup.add("long", "0 * * * *", long, jitter_ms=500, lease_ms=lease)
    for scheduler in (runner, backup):
        await scheduler.start()
    try:
        await clock.advance(60 * MINUTE + 2_000)
        # The runner claims at the slot (jitter 0). The backup watches its run, after losing a
        # claim or after hearing of the win (then it sends none: rank delays).
        assert backup.metrics()["watched"] == 1
        claimed_at = START + 60 * MINUTE
        clock.step(MINUTE)  # the backup's clock jumps ahead: the lease it watches has not ended
        await clock.advance(40_000)  # past any idle wake-up of the backup's watcher
        early = [at for _, at, _ in backend.named("take_over") if at < claimed_at + lease]
        assert not early, f"the backup checked the lease {len(early)} time(s) before it ended"
        release.set()
        await clock.advance(1_000)
    finally:
        for scheduler in (runner, backup):
            await scheduler.stop()


async def test_a_clock_ahead_of_the_backend_does_not_claim_slots_early(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The wall clock jumps a minute ahead of the backend's: the slots it now thinks are due are
    # claimed when the backend's clock reaches them, not at once (a minute early for the others).
    clock = FakeClock(START)
    backend = on_another_host(Recording(BackendClock(clock)))
    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "*/10 * * * * *", lambda ctx: None, jitter_ms=0)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(25_000)
        clock.step(MINUTE)
        for _ in range(120):
            await clock.advance(500)
        claims = [(at, r.slot) for _, at, reqs in backend.named("claim") for r in reqs]
    early = [(slot - at, slot) for at, slot in claims if at < slot - 50]
    assert claims, "nothing was claimed"
    assert not early, f"claimed ahead of the backend's clock (ms early, slot): {early[:5]}"
    warned = [r for r in caplog.records if getattr(r, "action", None) == "slot_early"]
    assert len(warned) == 1, "one warning a minute, not one per slot"
    assert (scheduler.metrics()["early_slots_deferred"] or 0) >= 6


async def test_a_clock_step_before_any_measurement_does_not_claim_slots_early() -> None:
    # The backend's clock could not be measured yet (its first answer was lost): the estimate is
    # this host's wall clock as it read at start, carried on the monotonic clock, so a step
    # still does not make the instance claim the slots it jumped to.
    clock = FakeClock(START)

    class Unmeasured(Recording):
        async def server_time_ms(self) -> int | None:
            return None

    backend = on_another_host(Unmeasured(BackendClock(clock)))
    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "*/3 * * * * *", lambda ctx: None)
    async with scheduler:
        await clock.advance(25_000)
        clock.step(MINUTE)
        for _ in range(60):
            await clock.advance(500)
        claims = [(at, r.slot) for _, at, reqs in backend.named("claim") for r in reqs]
    early = [(slot - at, slot) for at, slot in claims if at < slot - 50]
    assert len(claims) >= 15, claims
    assert not early, f"claimed ahead of the backend's clock (ms early, slot): {early[:5]}"


async def test_a_backend_clock_out_of_reach_at_start_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The backend does not answer the clock read as the scheduler starts: the start goes on by
    # this host's clock and says so, once (the reads every minute after it stay quiet).
    clock = FakeClock(START)

    class Unreachable(Recording):
        async def server_time_ms(self) -> int | None:
            raise BackendUnavailable("connection refused")

    backend = on_another_host(Unreachable(BackendClock(clock)))
    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "*/10 * * * * *", lambda ctx: None)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        for _ in range(5):
            await clock.advance(int(SKEW_CHECK_S * 1000))
        claims = backend.named("claim")
    unread = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert len(unread) == 1, [r.getMessage() for r in caplog.records]
    assert getattr(unread[0], "action", None) == "clock_skew"
    assert "BackendUnavailable: connection refused" in unread[0].getMessage()
    assert claims, "the scheduler did not run on this host's clock"


async def test_a_slot_claimed_at_its_time_is_built_before_it_and_sent_at_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without jitter the timer hands the slot over LEAD_MS early, so its claim is built while
    # the clock runs out; the claim itself still reaches the backend at the slot, not before.
    clock = FakeClock(START)
    backend = Recording(clock)
    scheduler = Scheduler(backend, clock=clock, instance_id="i0")
    scheduler.add("tick", "* * * * * *", lambda ctx: None, jitter_ms=0, catch_up="none")
    built: list[tuple[int, int | None]] = []
    build = scheduler._services.claims.request

    def request(*args: Any, **kwargs: Any) -> ClaimRequest:
        made = build(*args, **kwargs)
        built.append((clock.now_ms(), made.slot))
        return made

    monkeypatch.setattr(scheduler._services.claims, "request", request)
    async with scheduler:
        await clock.advance(3_100, step_ms=1)
    claims = [(at, r.slot) for _, at, reqs in backend.named("claim") for r in reqs]
    assert [slot for _, slot in claims] == [START + 1_000, START + 2_000, START + 3_000]
    assert all(at == slot for at, slot in claims), claims
    assert all(slot is not None and at == slot - LEAD_MS for at, slot in built), built


async def test_with_the_defaults_a_preferred_claim_goes_at_its_slot_and_none_before() -> None:
    """Two instances, every option at its default: once they see each other, each slot's
    preferred instance claims it at the slot (handed over LEAD_MS early, sent at the slot) and
    no claim of any instance reaches the backend before its slot."""
    clock = FakeClock(START)
    backend = Recording(clock)
    schedulers = [Scheduler(backend, clock=clock, instance_id=f"i{n}") for n in range(2)]
    for scheduler in schedulers:
        scheduler.add("tick", "* * * * * *", lambda ctx: None)
    for scheduler in schedulers:
        await scheduler.start()
    await clock.advance(20_000, step_ms=1)  # 1 ms steps: a claim 5 ms early would show
    for scheduler in schedulers:
        await scheduler.stop()
    claims = [(at, r.slot) for _, at, reqs in backend.named("claim") for r in reqs]
    assert claims and all(r_slot is not None and at >= r_slot for at, r_slot in claims), claims
    first: dict[int, int] = {}
    for at, r_slot in claims:
        assert r_slot is not None
        first[r_slot] = min(first.get(r_slot, at), at)
    late = sorted(s for s in first if s >= START + 12_000)
    assert late and all(first[s] == s for s in late), {s: first[s] - s for s in late}


async def test_on_one_host_a_forward_step_judges_jumped_over_slots_on_the_new_time() -> None:
    """One host (the memory backend on the instance's own clock, like SQLite): the backend's
    clock steps with the wall clock, and the estimate moves with it at once, so none of the
    slots jumped over runs late: a backlog (see test_backlog), the older ones recorded behind,
    the newest, 30 s late, too late."""
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    assert backend.one_host
    scheduler, ran = _every_minute(backend, clock)
    async with scheduler:
        await clock.advance(30_000)
        clock.step(5 * MINUTE)  # the host's clock, the backend's with it: 5:30
        await clock.advance(MINUTE)
        history = await scheduler.history("tick")
    assert ran == [START + 6 * MINUTE], [(r.slot_ms, r.status, r.reason) for r in history]
    skipped = {r.slot_ms: r.reason or "" for r in history if r.status is RunStatus.SKIPPED}
    assert skipped.pop(START + 5 * MINUTE).startswith("too late"), skipped
    older = [skipped.pop(START + n * MINUTE) for n in range(1, 5)]
    assert all(reason.startswith("behind: ") for reason in older) and not skipped, older
