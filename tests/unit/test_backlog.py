"""A backlog: slots an instance passes over because it fell behind (its process frozen, its clock
stepped forward) are decided at once by the job's ``catch_up``, as missed slots are on start:
``latest`` (the default) and ``none`` run the newest due slot and record the older ones
``skipped``, ``behind: ...``; ``all`` runs each, oldest first. Never "overlap" with the first.

The freeze is :meth:`FakeClock.advance` in one step: both clocks move and nothing runs between.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

import pytest

from anarchon import Overlap, RunContext, RunStatus, Scheduler, Trigger
from anarchon._job import build_job, job_options
from anarchon.backend import ClaimRequest
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import START

SECOND = 1_000
EVERY_SECOND = "* * * * * *"
FROZEN_MS = 5_500
# The timer's slot after 2.5 s is 3 s; the process wakes at 8 s: slots 3 s to 8 s are due.
DUE = [START + n * SECOND for n in range(3, 9)]


def _recorder() -> tuple[list[tuple[int, Trigger]], Any]:
    ran: list[tuple[int, Trigger]] = []

    async def tick(ctx: RunContext) -> None:
        assert ctx.slot is not None
        ran.append((int(ctx.slot.timestamp() * 1000), ctx.trigger))

    return ran, tick


async def _frozen(scheduler: Scheduler, clock: FakeClock, after_ms: int = 3_000) -> dict[int, Any]:
    """Run 2.5 s, freeze the process for :data:`FROZEN_MS`, run ``after_ms`` more; return the
    job's records by slot."""
    async with scheduler:
        await clock.advance(2_500)
        await clock.advance(FROZEN_MS, step_ms=FROZEN_MS)  # frozen: one late wake-up
        await clock.advance(after_ms)
        return _by_slot(await scheduler.history("tick", limit=100))


def _by_slot(history: list[Any]) -> dict[int, Any]:
    return {run.slot_ms: run for run in history}


async def test_a_frozen_process_with_the_defaults_runs_the_newest_and_records_the_rest_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every option at its default: catch_up="latest", jitter 100 ms, max_late_ms 60 s.
    clock = FakeClock(START)
    ran, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick)
    caplog.set_level(logging.WARNING, "anarchon")
    history = await _frozen(scheduler, clock)
    slots = [slot for slot, _ in ran]
    assert DUE[-1] in slots and not set(DUE[:-1]) & set(slots), ran
    for slot in DUE[:-1]:
        run = history[slot]
        assert run.status is RunStatus.SKIPPED, run
        assert run.reason.startswith("behind: "), run.reason
        assert "6 slots of the job due at once" in run.reason, run.reason
        assert "catch_up='latest' runs only the newest" in run.reason, run.reason
    assert history[DUE[-1]].status is RunStatus.SUCCEEDED
    assert not [r for r in history.values() if (r.reason or "").startswith("overlap")]
    # Every slot from the first to the last has a fate.
    newest = max(history)
    assert sorted(history) == list(range(START + SECOND, newest + 1, SECOND))
    assert newest >= START + 10 * SECOND, sorted(history)
    metrics = scheduler.metrics()
    assert metrics["behind"] == 5 and metrics["too_late"] == 0
    assert metrics.by_job["tick"].slots["skipped_behind"] == 5
    assert metrics.by_job["tick"].slots["ran"] == len(ran)
    logged = [r for r in caplog.records if getattr(r, "action", None) == "behind"]
    assert len(logged) == 1 and getattr(logged[0], "count", None) == 6, logged


async def test_catch_up_none_runs_only_the_newest_due_slot() -> None:
    clock = FakeClock(START)
    ran, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick, catch_up="none", jitter_ms=0)
    history = await _frozen(scheduler, clock)
    assert [slot for slot, _ in ran if slot in DUE] == [DUE[-1]]
    assert all(t is Trigger.SCHEDULE for _, t in ran)
    reasons = [history[slot].reason or "" for slot in DUE[:-1]]
    assert all(r.startswith("behind: ") and "catch_up='none'" in r for r in reasons), reasons


async def test_catch_up_all_runs_every_due_slot_oldest_first() -> None:
    clock = FakeClock(START)
    ran, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick, catch_up="all", jitter_ms=0)
    history = await _frozen(scheduler, clock, after_ms=6_000)
    caught = [(slot, trigger) for slot, trigger in ran if slot in DUE]
    assert caught == [(slot, Trigger.CATCH_UP) for slot in DUE], ran
    for slot in DUE:
        assert history[slot].status is RunStatus.SUCCEEDED, history[slot]
    assert not [r for r in history.values() if (r.reason or "").startswith("behind")]
    assert scheduler.metrics()["behind"] == 0


async def test_catch_up_all_records_the_slots_older_than_its_window_behind() -> None:
    clock = FakeClock(START)
    ran, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick, catch_up="all", catch_up_window_ms=2_500, jitter_ms=0)
    history = await _frozen(scheduler, clock, after_ms=6_000)
    # Woken at 8 s: 6 s, 7 s and 8 s are inside the window; 3 s to 5 s are not.
    assert [(s, t) for s, t in ran if s in DUE] == [(s, Trigger.CATCH_UP) for s in DUE[3:]]
    for slot in DUE[:3]:
        reason = history[slot].reason or ""
        assert reason.startswith("behind: ") and "catch_up='all' runs the 3 inside" in reason


async def test_a_forward_step_of_the_clock_on_one_host_is_a_backlog() -> None:
    # SQLite and memory: the backend's clock is this host's, so it steps with it.
    clock = FakeClock(START)
    ran, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick, jitter_ms=0)
    async with scheduler:
        await clock.advance(2_500)
        clock.step(FROZEN_MS)
        await clock.advance(3_000)
        history = _by_slot(await scheduler.history("tick", limit=100))
    behind = sorted(s for s, r in history.items() if (r.reason or "").startswith("behind: "))
    assert len(behind) >= 4 and behind[0] == START + 3 * SECOND, behind
    assert not set(behind) & {slot for slot, _ in ran}
    assert not [r for r in history.values() if (r.reason or "").startswith("overlap")]


def test_a_slot_claimed_a_little_late_is_not_behind() -> None:
    # Within its jitter and BEHIND_MS, a late slot is claimed as before, even with the next due;
    # a slot reached later than that is behind only if the job's next slot is due too.
    from anarchon._backlog import BEHIND_MS, is_behind  # here: the tests above run on 0.1.0 too

    backend = MemoryBackend(clock=FakeClock(START))
    every_second = build_job("a", EVERY_SECOND, lambda ctx: None, job_options("t", {}), backend)
    slot = START + SECOND
    limit = slot + every_second.policy.jitter_ms + BEHIND_MS
    assert not is_behind(every_second, slot, limit)
    assert is_behind(every_second, slot, limit + 1)
    every_ten = build_job("b", "*/10 * * * * *", lambda ctx: None, job_options("t", {}), backend)
    assert not is_behind(every_ten, START + 10 * SECOND, START + 19_999)
    assert is_behind(every_ten, START + 10 * SECOND, START + 20_000)


async def test_a_second_backlog_of_catch_up_all_joins_the_first_never_beside_it() -> None:
    # catch_up="all", each run 3 s: the first backlog's six runs take 18 s; frozen again 4 s
    # in, the second backlog's slots join the catch-up under way instead of running beside it.
    clock = FakeClock(START)
    ran: list[tuple[int, Trigger]] = []
    running: set[int] = set()
    most = 0

    async def slow(ctx: RunContext) -> None:
        nonlocal most
        assert ctx.slot is not None
        slot = int(ctx.slot.timestamp() * 1000)
        ran.append((slot, ctx.trigger))
        running.add(slot)
        most = max(most, len(running))
        try:
            await clock.sleep(3)
        finally:
            running.discard(slot)

    # grace_ms=0: the run under way when the test is done is cancelled at once; the default 30 s
    # grace would pass in real time (stop()'s bound when nobody moves the test clock).
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock, grace_ms=0)
    scheduler.add("tick", EVERY_SECOND, slow, catch_up="all", jitter_ms=0)
    async with scheduler:
        await clock.advance(2_500)
        await clock.advance(FROZEN_MS, step_ms=FROZEN_MS)  # woken at 8 s: 3 s to 8 s due
        await clock.advance(4_000)
        await clock.advance(FROZEN_MS, step_ms=FROZEN_MS)  # again: 13 s to 17.5 s due
        await clock.advance(60_000)
        history = _by_slot(await scheduler.history("tick", limit=200))
    caught = [slot for slot, trigger in ran if trigger is Trigger.CATCH_UP]
    assert most == 1, f"{most} runs of the job at once: {ran}"
    assert caught == sorted(caught), caught  # one catch-up, oldest first
    assert set(DUE) <= set(caught), caught
    second = [START + n * SECOND for n in range(13, 18)]
    assert set(second) <= set(caught), caught
    for slot in DUE + second:
        assert history[slot].status is RunStatus.SUCCEEDED, history[slot]


async def test_behind_counts_only_the_records_this_instance_wrote() -> None:
    # Another instance ran the slots this one passes over while frozen: its claims find those
    # runs and record nothing, so nothing is counted behind (before: every slot tried was).
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    ran, tick = _recorder()
    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", EVERY_SECOND, tick, jitter_ms=0)
    async with scheduler:
        await clock.advance(2_500)
        for slot in DUE:  # the other instance's runs, won and finished
            request = ClaimRequest(
                job="tick",
                slot=slot,
                run_id=uuid4().hex,
                token=uuid4().hex,
                instance="other",
                trigger=Trigger.SCHEDULE,
                lease_ms=15_000,
                overlap=Overlap.ALLOW,
            )
            [outcome] = await backend.claim([request])
            assert outcome.ticket is not None
            await backend.finish(outcome.ticket, "succeeded", None)
        await clock.advance(FROZEN_MS, step_ms=FROZEN_MS)
        await clock.advance(3_000)
        history = _by_slot(await scheduler.history("tick", limit=100))
    assert all(history[slot].instance == "other" for slot in DUE), history
    assert not [r for r in history.values() if (r.reason or "").startswith("behind")]
    assert not set(DUE) & {slot for slot, _ in ran}
    metrics = scheduler.metrics()
    assert metrics.by_job["tick"].slots["skipped_behind"] == 0
    assert metrics["behind"] == 0, "slots another instance ran were counted behind"


def test_why_behind_names_the_cause_it_can_tell() -> None:
    from anarchon._backlog import why_behind
    from anarchon._timer import Late
    from anarchon._watchdog import Block

    stepped = Late(10_000, 900, 5_000)
    assert why_behind(stepped, None, True)[0] == "clock_step"
    assert "stepped forward 5000 ms" in why_behind(stepped, None, True)[1]
    blocked = Block(9_990, 5_200, "job 'slow' (handler app.slow; in slow at app.py:3)")
    late = Late(10_000, 6_000, 0)
    cause, words = why_behind(late, blocked, True)
    assert cause == "loop_blocked" and "blocked for 5200 ms by job 'slow'" in words, words
    # A block that ended before the timer's look before, or too short to explain the gap.
    assert why_behind(late, Block(3_000, 5_200, None), True)[0] == "frozen"
    assert why_behind(late, Block(9_990, 600, None), True)[0] == "frozen"
    assert "did not run for 6000 ms" in why_behind(late, None, True)[1]
    # Without the watchdog a block and a freeze look alike: it says so.
    cause, words = why_behind(late, None, False)
    assert cause == "unknown" and "frozen, its event loop blocked or its clock stepped" in words


async def _behind_warnings(
    caplog: pytest.LogCaptureFixture, names: list[str]
) -> tuple[Scheduler, list[logging.LogRecord]]:
    """Jobs ``names``, every second with the defaults, frozen together as :func:`_frozen`
    does; the scheduler and its WARNINGs ``behind``."""
    clock = FakeClock(START)
    _, tick = _recorder()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    for name in names:
        scheduler.add(name, EVERY_SECOND, tick)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(2_500)
        await clock.advance(FROZEN_MS, step_ms=FROZEN_MS)
        await clock.advance(3_000)
    return scheduler, [r for r in caplog.records if getattr(r, "action", None) == "behind"]


async def test_one_job_behind_logs_one_warning_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    # Every option at its default: one backlog is told in full, once, when its window ends.
    _, logged = await _behind_warnings(caplog, ["tick"])
    assert len(logged) == 1, [r.getMessage() for r in logged]
    record = logged[0]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("job tick: this instance fell 5000 ms behind ("), message
    assert "6 slot(s) due at once" in message and "catch_up=latest" in message, message
    assert getattr(record, "job", None) == "tick" and getattr(record, "count", None) == 6
    assert getattr(record, "passed", None) == 5 and getattr(record, "behind_ms", 0) == 5_000
    assert getattr(record, "cause", None) == "unknown"  # no watchdog on a FakeClock


async def test_many_jobs_behind_at_once_log_one_warning_counting_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 200 jobs fall behind in one freeze: one WARNING counts them (there was one per job).
    scheduler, logged = await _behind_warnings(caplog, [f"j{n:03}" for n in range(200)])
    assert len(logged) == 1, f"{len(logged)} WARNINGs behind"
    record = logged[0]
    message = record.getMessage()
    assert message.startswith("200 jobs: this instance fell up to 5000 ms behind ("), message
    assert "1200 slot(s) due at once in all" in message and "1000 passed over" in message
    assert "and 195 more" in message, message
    assert getattr(record, "jobs", None) == 200 and getattr(record, "count", None) == 1_200
    assert len(getattr(record, "job_names", [])) == 5
    assert getattr(record, "cause", None) == "unknown"
    assert scheduler.metrics()["behind"] == 1_000
