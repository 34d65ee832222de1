"""Leases: kept from the scheduler's own thread while a handler blocks the event loop, known lost
when their local deadline passes, renewed before a handler starts on a lease a retried claim
brought back half-used, takeovers retried with the same request, and a burst of
expired leases checked a bounded number at a time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import pytest

from anarchon import (
    BackendError,
    BackendUnavailable,
    LeaseLost,
    RunContext,
    RunStatus,
    Scheduler,
    Trigger,
)
from anarchon._watcher import MAX_CHECKS
from anarchon.backend import (
    ClaimOutcome,
    ClaimRequest,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START, Recording, until


async def test_a_handler_that_blocks_the_loop_does_not_stop_renewals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Recording(None)
    blocked: list[tuple[float, float]] = []
    contexts: list[RunContext] = []

    async def blocking(ctx: RunContext) -> None:
        contexts.append(ctx)
        began = time.time()
        time.sleep(2.5)  # noqa: ASYNC251 - blocks the event loop on purpose, for 2.5 s
        blocked.append((began * 1000, time.time() * 1000))

    scheduler = Scheduler(backend)
    scheduler.add("blocking", "@daily", blocking, lease_ms=600)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        run = await scheduler.run_now("blocking")
        metrics = scheduler.metrics()
    [(began, ended)] = blocked
    during = [at for _, at, _ in backend.named("renew") if began < at < ended]
    assert len(during) >= 3, "the lease was not renewed while the loop was blocked"
    assert run.status is RunStatus.SUCCEEDED and not contexts[0].lease_lost
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "loop_blocked"]
    assert warning.levelno == logging.WARNING and getattr(warning, "job", None) == "blocking"
    assert "blocking" in warning.getMessage() and "test_leases.py" in warning.getMessage()
    [back] = [r for r in caplog.records if getattr(r, "action", None) == "loop_unblocked"]
    assert getattr(back, "blocked_ms", 0) >= 1_000
    assert (metrics["loop_lag_max_ms"] or 0) >= 1_000


async def test_the_lease_is_known_lost_once_its_deadline_passes_without_a_renewal() -> None:
    clock = FakeClock(START)

    class Hanging(MemoryBackend):
        hang = False

        async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
            if self.hang:  # a renewal that never comes back (a frozen link)
                await asyncio.Event().wait()
            return await super().renew_many(tickets)

    backend = Hanging(clock=clock)
    contexts: list[RunContext] = []
    release = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        contexts.append(ctx)
        await release.wait()

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with scheduler:
        await clock.advance(60 * MINUTE + 2_000)
        [ctx] = contexts
        assert not ctx.lease_lost
        backend.hang = True
        await clock.advance(3_100)  # a full lease since the last renewal
        assert ctx.lease_lost, "the lease ran out unrenewed and the handler was not told"
        with pytest.raises(LeaseLost, match=r"ran out without a renewal|could not renew"):
            ctx.check_lease()
        release.set()


class LostClaimAnswer(Recording):
    """The first claim is stored, but its answer arrives late and is lost; the retry (same
    token) gets the stored ticket back, with most of its lease gone."""

    def __init__(self, clock: FakeClock, delay_s: float) -> None:
        super().__init__(clock)
        self._fake = clock
        self._delay_s = delay_s
        self.refuse_renewal = False

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        outcomes = await super().claim(requests)
        if len(self.named("claim")) == 1:
            await self._fake.sleep(self._delay_s)
            raise BackendUnavailable("the answer was lost on the way back")
        return outcomes

    async def renew(self, ticket: Ticket) -> Ticket:
        if self.refuse_renewal:
            self._note("renew", ticket)
            raise LeaseLost(f"run {ticket.run_id} was taken over meanwhile")
        return await super().renew(ticket)


async def test_a_retried_claim_with_little_lease_left_is_renewed_before_the_handler() -> None:
    clock = FakeClock(START)
    backend = LostClaimAnswer(clock, delay_s=2.9)

    async def work(ctx: RunContext) -> None:
        backend._note("handler", ctx.run_id)

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with scheduler:
        await clock.advance(60 * MINUTE + 5_000)
        history = await scheduler.history("work")
    order = [name for name, _, _ in backend.calls if name in ("claim", "renew", "handler")]
    assert order[:4] == ["claim", "claim", "renew", "handler"], order
    assert [(r.attempt, r.status) for r in history] == [(1, RunStatus.SUCCEEDED)]


async def test_a_retried_claim_whose_renewal_says_lost_does_not_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Started half a minute off the slot's minute: the periodic adoption (every minute from the
    # start) does not see the claim before its delayed answer comes back.
    clock = FakeClock(START + 30_000)
    backend = LostClaimAnswer(clock, delay_s=3.5)
    backend.refuse_renewal = True
    started: list[int] = []

    async def work(ctx: RunContext) -> None:
        started.append(ctx.attempt)

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(60 * MINUTE - 30_000 + 6_000)
    # Attempt 1 never starts; the run, left with its lease lost, may be taken over as attempt 2
    # (by this instance's periodic adoption: no other instance watches it).
    assert 1 not in started, "the handler started on a lease the backend says is lost"
    assert any(getattr(r, "action", None) == "lease_lost" for r in caplog.records)


class LostTakeoverAnswer(Recording):
    """The first takeover granted has its answer lost."""

    lost: TakeoverRequest | None = None

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        outcome = await super().take_over(request)
        if outcome.status is TakeoverStatus.TAKEN and self.lost is None:
            self.lost = request
            raise BackendUnavailable("the answer was lost on the way back")
        return outcome


async def test_a_takeover_whose_answer_was_lost_is_retried_with_the_same_request() -> None:
    clock = FakeClock(START)
    backend = LostTakeoverAnswer(clock)
    slot = START + 60 * MINUTE

    async def work(ctx: RunContext) -> None:
        pass

    backup = Scheduler(backend, clock=clock, instance_id="backup")
    backup.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with backup:
        await clock.advance(60 * MINUTE - 1_000)
        # A runner claimed the slot first and crashed: its lease runs out.
        await backend.claim(
            [
                ClaimRequest(
                    job="work",
                    slot=slot,
                    run_id="crashed",
                    token="crashed-token",
                    instance="crashed",
                    trigger=Trigger.SCHEDULE,
                    lease_ms=3_000,
                )
            ]
        )
        await clock.advance(6_000)
    requests = [request for _, _, request in backend.named("take_over")]
    assert backend.lost is not None and backend.lost in requests, "no takeover was granted"
    assert len(requests) > requests.index(backend.lost) + 1, "the takeover was not retried"
    retried = requests[requests.index(backend.lost) + 1]
    assert (retried.run_id, retried.token) == (backend.lost.run_id, backend.lost.token)


class Renewals(MemoryBackend):
    """Renewals that hang (``hang``: the link holds packets, no answer, no error) or take a
    round trip of ``round_trip_s`` (real time)."""

    hang = False
    round_trip_s = 0.0

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        if self.hang:
            await asyncio.Event().wait()
        if self.round_trip_s:
            await asyncio.sleep(self.round_trip_s)
        return await super().renew_many(tickets)


async def test_a_renewal_that_hangs_cancels_the_handler_at_the_lease_deadline() -> None:
    clock = FakeClock(START)
    backend = Renewals(clock=clock)
    cancelled: list[bool] = []

    async def work(ctx: RunContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.lease_lost)
            raise

    # grace_ms=0: a run still under way when the test is done is cancelled at once; the default
    # 30 s grace would pass in real time (stop()'s bound when nobody moves the test clock).
    scheduler = Scheduler(backend, clock=clock, grace_ms=0)
    scheduler.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with scheduler:
        await clock.advance(60 * MINUTE + 2_000)
        backend.hang = True
        for _ in range(16):  # 4 s: past the deadline of the lease the hung call should renew
            await clock.advance(250)
        assert cancelled == [True], "the handler ran on past its lease while a renewal hung"
        assert scheduler.metrics()["lease_lost"] == 1
        backend.hang = False


class SlowTakeovers(MemoryBackend):
    """Takeovers that take a while (real time), counting how many are in flight at once."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.in_flight = 0
        self.most = 0
        self.taken = 0

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            outcome = await super().take_over(request)
        finally:
            self.in_flight -= 1
        self.taken += outcome.status is TakeoverStatus.TAKEN
        return outcome


async def test_a_burst_of_expired_leases_is_checked_a_bounded_number_at_a_time() -> None:
    """Two hundred runs a crashed instance held, whose leases end together: the backup checks
    them at most MAX_CHECKS at a time (not two hundred calls at once) and takes every one over."""
    clock = FakeClock(START)
    backend = SlowTakeovers(clock)
    slot = START + 60 * MINUTE
    names = [f"j{n}" for n in range(200)]
    crashed = [
        ClaimRequest(
            job=name,
            slot=slot,
            run_id=f"crashed-{name}",
            token=f"token-{name}",
            instance="crashed",
            trigger=Trigger.SCHEDULE,
            lease_ms=3_000,
        )
        for name in names
    ]

    async def work(ctx: RunContext) -> None:
        pass

    backup = Scheduler(backend, clock=clock, instance_id="backup")
    for name in names:
        backup.add(name, "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with backup:
        await clock.advance(60 * MINUTE - 1_000)
        await backend.claim(crashed)  # claimed just before the backup: it loses and watches
        await clock.advance(5_000)
        await until(lambda: backend.taken == len(names), 60, "every run taken over")
    assert backend.most == MAX_CHECKS


async def test_a_lease_lost_while_the_process_was_frozen_says_so() -> None:
    # SIGSTOP (or a starved host): nothing runs until long after the renewal was due, past the
    # lease's local deadline. The renewal did not hang: the reason names the freeze and its length.
    clock = FakeClock(START)
    backend = Renewals(clock=clock)
    backend.round_trip_s = 0.01  # real time: the fake clock stands still meanwhile
    reasons: list[str] = []

    async def work(ctx: RunContext) -> None:
        try:
            await asyncio.Event().wait()
        finally:  # cancelled once the lease is lost
            with pytest.raises(LeaseLost) as lost:
                ctx.check_lease()
            reasons.append(str(lost.value))

    # grace_ms=0: a run still under way when the test is done is cancelled at once; the default
    # 30 s grace would pass in real time (stop()'s bound when nobody moves the test clock).
    scheduler = Scheduler(backend, clock=clock, grace_ms=0)
    scheduler.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000)
    async with scheduler:
        await clock.advance(60 * MINUTE + 200)
        await clock.advance(10_000, step_ms=10_000)  # frozen for 10 s: one late wake-up
        await clock.advance(1_000)
        assert len(reasons) == 1, reasons
    assert "frozen or starved for" in reasons[0], reasons
    assert "hung" not in reasons[0], reasons
