"""Slots due at once in numbers larger than one backend batch: the core sends their claims in
parts of at most ``CLAIM_PART`` (2 000), one after another, each judged too late right before
it is sent and retried on its own, and each part's runs start as soon as it is answered."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
from collections.abc import Sequence

import pytest

from anarchon import BackendUnavailable, RunContext, RunStatus, Scheduler
from anarchon._claims import CLAIM_PART, share_first
from anarchon._models import Trigger
from anarchon.backend import ClaimOutcome, ClaimRequest, FinishRequest
from anarchon.errors import BackendError
from anarchon.kit import Run
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START

JOBS = 4_500  # two full parts and a half one


class Parts(MemoryBackend):
    """Records the jobs of every claim call; each call takes ``slow_s`` (on the fake clock);
    once ``answers`` calls are answered, the others fail as an unreachable backend's do."""

    def __init__(self, clock: FakeClock, slow_s: float = 0.0, answers: int | None = None):
        super().__init__(clock=clock)
        self.clock = clock
        self.slow_s = slow_s
        self.answers = answers
        self.calls: list[list[str]] = []
        self.callers: list[str] = []  # the instance of each call
        self.answered: list[int] = []  # when each call was answered (monotonic ms)
        self.recorded: dict[str, int] = {}  # when each job's result was recorded (monotonic ms)
        self.runs: dict[str, int] = {}  # the runs started so far (the test's), if it tells us
        self.runs_at_call: list[int] = []  # how many had started when each claim call came
        self.requests_at_call: list[int] = []  # claim requests alive when each call came
        self.count_requests = False

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        self.calls.append([r.job for r in requests])
        self.callers.append(requests[0].instance)
        self.runs_at_call.append(len(self.runs))
        if self.count_requests:
            # type(), not isinstance(): no attribute of any object in the heap is looked up
            # (isinstance asks an unknown object for __class__; an xdist worker that had run
            # hundreds of tests died in this loop once).
            # Collected first: requests an earlier test left in reference cycles are not alive.
            gc.collect()
            alive = sum(1 for o in gc.get_objects() if type(o) is ClaimRequest)
            self.requests_at_call.append(alive)
        if self.slow_s:
            await self.clock.sleep(self.slow_s)
        if self.answers is not None and len(self.answered) >= self.answers:
            raise BackendUnavailable("claims: connection refused")
        answers = await super().claim(requests)
        self.answered.append(self.clock.monotonic_ms())
        return answers

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        now = self.clock.monotonic_ms()
        self.recorded.update((item.ticket.job, now) for item in items)
        return await super().finish_many(items)


def _scheduler(
    slow_s: float = 0.0, answers: int | None = None, max_late_ms: int | None = None
) -> tuple[Parts, dict[str, int], Scheduler]:
    """A scheduler with JOBS jobs due at the same slot on a :class:`Parts` backend, and the
    start time of each job's run (monotonic ms)."""
    backend = Parts(FakeClock(START), slow_s, answers)
    started: dict[str, int] = {}

    async def work(ctx: RunContext) -> None:
        started[ctx.job] = backend.clock.monotonic_ms()

    scheduler = Scheduler(backend, clock=backend.clock)
    for n in range(JOBS):
        # jitter_ms=0: every slot due at once (the burst); max_late_ms at its default unless given
        if max_late_ms is None:
            scheduler.add(f"j{n}", "0 * * * *", work, jitter_ms=0)
        else:
            scheduler.add(f"j{n}", "0 * * * *", work, jitter_ms=0, max_late_ms=max_late_ms)
    return backend, started, scheduler


async def _to_the_slot(clock: FakeClock) -> None:
    """Up to just before the slot, in large steps (nothing happens before it)."""
    await clock.advance(60 * MINUTE - 1_000, step_ms=MINUTE)


def _not_claimed(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "claim_failed"]


async def test_a_large_due_batch_is_claimed_in_parts() -> None:
    backend, started, scheduler = _scheduler(slow_s=0.5)
    clock = backend.clock
    async with scheduler:
        await _to_the_slot(clock)
        await clock.advance(6_000)
        metrics = scheduler.metrics()
    assert CLAIM_PART == 2_000
    assert [len(call) for call in backend.calls] == [2_000, 2_000, 500]
    assert sorted(j for call in backend.calls for j in call) == sorted(f"j{n}" for n in range(JOBS))
    assert len(started) == JOBS
    # Each part's runs start when that part is answered, not when the whole batch is.
    for call, answered in zip(backend.calls, backend.answered, strict=True):
        assert {started[job] for job in call} == {answered}
    assert backend.answered[0] < backend.answered[-1]
    assert metrics["claims_won"] == JOBS  # every claim counted once
    assert metrics["runs_succeeded"] == JOBS
    # The results wait for the last part: sent between the parts, they would hold its claims up.
    assert set(backend.recorded.values()) == {backend.answered[-1]}


async def test_a_backend_whose_claim_never_waits_still_starts_a_parts_runs_before_the_next() -> (
    None
):
    # The in-memory backend answers without letting the event loop run: the runs each part won
    # still start before the next part's answers are acted on, not all after the last part.
    backend, started, scheduler = _scheduler()
    backend.runs = started
    backend.count_requests = True
    clock = backend.clock
    async with scheduler:
        await _to_the_slot(clock)
        await clock.advance(2_000)
        metrics = scheduler.metrics()
    assert [len(call) for call in backend.calls] == [2_000, 2_000, 500]
    assert backend.runs_at_call[:2] == [0, 0]
    assert backend.runs_at_call[2] >= 2_000, "the first part's runs waited for the last part"
    assert metrics["runs_succeeded"] == JOBS
    assert set(backend.recorded.values()) == {backend.answered[-1]}, "results wait, as before"
    # The timer hands its list of requests over: at the third call the first part's 2 000 are
    # gone (freed once acted on), the second's (still being let go of) and the third's left.
    assert backend.requests_at_call[2] <= 2_500, backend.requests_at_call


async def test_a_held_result_waits_no_longer_than_its_lease_allows() -> None:
    # Each part takes 4 s: the last is answered 12 s after the slot. The first part's results
    # may wait only until two thirds of their 15 s lease are left: 5 s after it was sent.
    backend, _, scheduler = _scheduler(slow_s=4.0)
    clock = backend.clock
    async with scheduler:
        await _to_the_slot(clock)
        sent = clock.monotonic_ms() + 1_000
        await clock.advance(16_000)
        metrics = scheduler.metrics()
    assert metrics["runs_succeeded"] == JOBS
    first = {backend.recorded[job] for job in backend.calls[0]}
    assert max(first) <= sent + 5_000 < backend.answered[-1]


async def test_a_part_too_late_by_the_time_it_could_be_sent_is_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each claim call takes 1.5 s, max_late_ms is 1 s: the first part is sent at the slot, the
    # second would be sent 1.5 s after it, too late.
    backend, started, scheduler = _scheduler(slow_s=1.5, max_late_ms=1_000)
    clock = backend.clock
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await _to_the_slot(clock)
        await clock.advance(11_000)
        histories = {f"j{n}": await scheduler.history(f"j{n}") for n in range(JOBS)}
    [first] = backend.calls
    assert len(first) == 2_000
    assert set(started) == set(first)
    assert sum(1 for h in histories.values() if h) == 2_000, "a late part was claimed"
    logged = _not_claimed(caplog)
    assert logged, "the slots not claimed were not logged"
    assert all("too late by the time their part" in r.getMessage() for r in logged)
    assert sum(int(r.getMessage().split()[0]) for r in logged) == JOBS - 2_000


async def test_a_failing_part_keeps_the_runs_an_earlier_part_won(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The backend answers the first part, then goes down: the second part is retried until its
    # slots are too late (5 s), the third is then too late to be sent.
    backend, started, scheduler = _scheduler(answers=1, max_late_ms=5_000)
    clock = backend.clock
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await _to_the_slot(clock)
        await clock.advance(21_000)
        histories = {f"j{n}": await scheduler.history(f"j{n}") for n in range(JOBS)}
        metrics = scheduler.metrics()
    first, second = backend.calls[0], backend.calls[1]
    assert len(first) == len(second) == 2_000
    assert all(call == second for call in backend.calls[2:]), "a retry was not of its part"
    assert len(backend.calls) > 2, "the failing part was not retried"
    assert set(started) == set(first)
    assert all([r.status for r in histories[job]] == [RunStatus.SUCCEEDED] for job in first)
    assert sum(1 for h in histories.values() if h) == 2_000
    assert metrics["claims_won"] == 2_000
    logged = _not_claimed(caplog)
    unavailable = [r for r in logged if "unavailable" in r.getMessage()]
    assert {getattr(r, "job", None) for r in unavailable} == set(second)
    late = [r for r in logged if "too late by the time their part" in r.getMessage()]
    assert sum(int(r.getMessage().split()[0]) for r in late) == JOBS - 4_000


async def test_parts_not_yet_sent_when_the_scheduler_stops_are_not_claimed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, _, scheduler = _scheduler(slow_s=1.0)
    clock = backend.clock
    caplog.set_level(logging.INFO, "anarchon")
    await scheduler.start()
    try:
        await _to_the_slot(clock)
        await clock.advance(1_200)  # the first part is on its way (answered at slot + 1 s)
        assert len(backend.calls) == 1 and not backend.answered
        stopping = asyncio.ensure_future(scheduler.stop())
        await clock.advance(2_000)
        await stopping
    finally:
        await scheduler.stop()
    assert [len(call) for call in backend.calls] == [2_000]
    logged = [r for r in _not_claimed(caplog) if r.getMessage().startswith("stopping:")]
    assert sorted(int(r.getMessage().split()[1]) for r in logged) == [500, 2_000]


def _requests(count: int) -> list[ClaimRequest]:
    return [
        ClaimRequest(
            job=f"j{n}",
            slot=0,
            run_id=f"r{n}",
            token=f"t{n}",
            instance="me",
            trigger=Trigger.SCHEDULE,
        )
        for n in range(count)
    ]


BURST = 6_500  # three full parts and a half one


def _third(position: int, job: str) -> tuple[int, int]:
    """The share of the instance at ``position`` of three."""
    return position, 3


def test_each_instance_begins_a_burst_with_its_own_parts() -> None:
    requests = _requests(BURST)
    parts = [requests[n : n + CLAIM_PART] for n in range(0, BURST, CLAIM_PART)]
    firsts = []
    for position in range(3):
        turned = share_first(requests, functools.partial(_third, position))
        # Whole parts, in turn from this instance's own, the short one last: every instance's
        # parts hold the same slots, so each part is claimed whole by whoever gets there first.
        assert (
            turned
            == [r for part in parts[position:3] + parts[:position] for r in part] + (parts[3])
        )
        firsts.append(turned[0].job)
    assert firsts == ["j0", "j2000", "j4000"]


def test_a_burst_is_claimed_in_order_without_a_share_or_in_one_part() -> None:
    requests = _requests(BURST)
    assert share_first(requests, lambda job: None) is requests
    small = _requests(CLAIM_PART)

    def never(job: str) -> tuple[int, int]:
        raise AssertionError("one part: no share looked up")

    assert share_first(small, never) is small
    # Two slots of one job (caught up together) stay in order: the earlier is claimed first.
    twice = [*requests, dataclasses.replace(requests[0], slot=START + 60_000)]
    assert share_first(twice, functools.partial(_third, 1)) is twice


async def test_three_instances_begin_a_burst_with_different_parts() -> None:
    clock = FakeClock(START)
    backend = Parts(clock)

    async def work(ctx: RunContext) -> None:
        pass

    schedulers = []
    for n in range(3):
        scheduler = Scheduler(backend, clock=clock, instance_id=f"pod-{n}", heartbeat_ms=1_000)
        for job in range(BURST):
            scheduler.add(f"j{job}", "0 * * * *", work, jitter_ms=0)
        schedulers.append(scheduler)
    for scheduler in schedulers:
        await scheduler.start()
    # Up to the slot, the last seconds in small steps: every instance beats (and reads the
    # others' records) several times before it. A beat encodes its 6 500 definitions in a
    # thread, in real time: each step of the last seconds waits a little real time too, or on a
    # busy machine the fake clock outruns the beats and a record looks stale at the slot.
    await clock.advance(60 * MINUTE - 5_000, step_ms=MINUTE)
    for _ in range(45):
        await clock.advance(100)
        await asyncio.sleep(0.02)
    assert all(s._services.rendezvous.share("j0") is not None for s in schedulers)
    await clock.advance(2_500, step_ms=100)
    runs = [s.metrics().runs_succeeded for s in schedulers]
    for scheduler in schedulers:
        await scheduler.stop()
    # Each instance's first claim call begins with a different part, and every part is claimed
    # whole: each instance runs whole parts.
    firsts: dict[str, str] = {}
    for caller, call in zip(backend.callers, backend.calls, strict=True):
        firsts.setdefault(caller, call[0])
    assert firsts == {"pod-0": "j0", "pod-1": "j2000", "pod-2": "j4000"}
    assert all(len(call) in (CLAIM_PART, BURST % CLAIM_PART) for call in backend.calls)
    assert sum(runs) == BURST, runs  # each slot ran once
