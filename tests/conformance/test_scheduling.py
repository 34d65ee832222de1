"""The scheduler on each backend, several instances in one event loop: overlap, catch-up,
manual runs, failing handlers, and the inputs each backend must refuse."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import (
    DuplicateJob,
    InvalidJobName,
    InvalidOption,
    InvalidSchedule,
    InvalidTimezone,
    JobNotFound,
    RunContext,
    RunStatus,
    Scheduler,
    SkipCause,
    Trigger,
    UnsupportedFeature,
)
from tests.harness import Harness, Namespace

Make = Callable[..., list[Scheduler]]
EVERY_SECOND = "* * * * * *"


async def until(predicate: Callable[[], Any], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_overlap_skips_while_the_previous_run_holds_its_lease(
    lease_harness: Harness, schedulers: Make
) -> None:
    spans: list[tuple[float, float]] = []

    async def slow(ctx: RunContext) -> None:
        began = time.monotonic()
        await asyncio.sleep(2.2)
        spans.append((began, time.monotonic()))

    fleet = schedulers(3)
    for scheduler in fleet:
        scheduler.add("slow", EVERY_SECOND, slow, jitter_ms=100, lease_ms=2_000)
    for scheduler in fleet:
        await scheduler.start()
    await until(lambda: len(spans) >= 2, 15, "two runs")
    history = await fleet[0].history("slow", limit=100)
    for scheduler in fleet:
        await scheduler.stop()

    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    skipped = [r for r in history if r.status is RunStatus.SKIPPED]
    assert skipped, "no slot was skipped while a run held its lease"
    assert all(r.reason and r.reason.startswith("overlap") for r in skipped)
    per_slot = Counter(r.slot_ms for r in history)
    assert max(per_slot.values()) == 1, "a slot was recorded twice"


async def test_overlap_allow_runs_concurrently(lease_harness: Harness, schedulers: Make) -> None:
    active = 0
    most = 0

    async def slow(ctx: RunContext) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(2.5)
        active -= 1

    [scheduler] = schedulers(1)
    scheduler.add("slow", EVERY_SECOND, slow, jitter_ms=0, overlap="allow")
    async with scheduler:
        await until(lambda: most >= 2, 10, "two concurrent runs")


async def _seed_history(make: Make, job: str) -> None:
    """Run one instance until the job has a recorded slot, then stop it."""
    ran = asyncio.Event()

    async def mark(ctx: RunContext) -> None:
        ran.set()

    [seed] = make(1)
    seed.add(job, EVERY_SECOND, mark, jitter_ms=0, catch_up="none")
    async with seed:
        await asyncio.wait_for(ran.wait(), 10)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all", "latest"])
async def test_catch_up_runs_missed_slots_once(
    lease_harness: Harness, schedulers: Make, ns: Namespace, mode: str
) -> None:
    await _seed_history(schedulers, "tick")
    await asyncio.sleep(3.5)  # no instance runs: three or four slots are missed
    seen: list[tuple[int | None, str, Trigger]] = []

    async def record(ctx: RunContext) -> None:
        seen.append(
            (int(ctx.slot.timestamp() * 1000) if ctx.slot else None, ctx.instance, ctx.trigger)
        )

    fleet = schedulers(3)
    for scheduler in fleet:
        scheduler.add("tick", "* * * * * *", record, jitter_ms=0, catch_up=mode)
    await asyncio.gather(*(s.start() for s in fleet))
    await asyncio.sleep(1.0)
    for scheduler in fleet:
        await scheduler.stop()

    caught = [slot or 0 for slot, _, trigger in seen if trigger is Trigger.CATCH_UP]
    per_slot = Counter(slot for slot, _, _ in seen)
    assert max(per_slot.values()) == 1, f"a slot ran twice: {per_slot}"
    # Each missed slot is decided once: run, or recorded skipped (overlap) when a live slot's
    # run held its lease at its claim (overlap="skip", the default, holds for catch-up too).
    reader = ns.make()
    await reader.start()
    try:
        history = await reader.history("tick", limit=100)
    finally:
        await reader.stop()
    decided = [r for r in history if r.trigger is Trigger.CATCH_UP]
    assert all(
        r.status is RunStatus.SUCCEEDED or r.skip_cause is SkipCause.OVERLAP for r in decided
    ), decided
    assert sorted(r.slot_ms or 0 for r in decided if r.status is RunStatus.SUCCEEDED) == sorted(
        caught
    )
    if mode == "all":
        assert len(decided) >= 3, (seen, decided)
        assert caught == sorted(caught)
    else:
        assert len(decided) == 1, (seen, decided)


async def test_no_history_no_catch_up(lease_harness: Harness, schedulers: Make) -> None:
    seen: list[Trigger] = []

    async def record(ctx: RunContext) -> None:
        seen.append(ctx.trigger)

    [scheduler] = schedulers(1)
    scheduler.add(
        "fresh", "0 0 1 1 *", record, catch_up="all", catch_up_window_ms=315_360_000_000
    )  # the longest window: 10 years
    async with scheduler:
        await asyncio.sleep(0.3)
        assert await scheduler.last_run("fresh") is None
    assert seen == []


async def test_a_manual_run_handed_over_is_taken_over_by_an_instance_that_never_claimed_it(
    lease_harness: Harness, schedulers: Make
) -> None:
    # A manual run is claimed by the instance that runs it alone: no other lost its claim or
    # watches it. Its hand-over on stop still reaches every instance carrying the job.
    started: list[tuple[str, int]] = []

    async def held(ctx: RunContext) -> None:
        started.append((ctx.instance, ctx.attempt))
        if ctx.attempt == 1:
            await asyncio.Event().wait()

    runner, other = schedulers(1, grace_ms=300) + schedulers(1)  # other: every default
    for scheduler in (runner, other):
        scheduler.add("report", "0 0 1 1 *", held)
    await other.start()
    await runner.start()
    manual = asyncio.ensure_future(runner.run_now("report"))
    await until(lambda: started, 10, "the manual run's start")
    stopped_at = time.monotonic()
    await runner.stop()
    await manual
    # The default lease is 15 s: a takeover that waited for its expiry would come too late.
    await until(lambda: len(started) == 2, 8, "the takeover of the manual run")
    assert started == [(runner.instance_id, 1), (other.instance_id, 2)]
    assert time.monotonic() - stopped_at < 8
    await until(lambda: other.metrics()["running"] == 0, 10, "attempt 2's end")
    runs = await other.history("report")
    assert [(r.attempt, r.status, r.trigger) for r in runs] == [
        (2, RunStatus.SUCCEEDED, Trigger.MANUAL),
        (1, RunStatus.FAILED, Trigger.MANUAL),
    ]
    assert runs[1].reason and "handed over" in runs[1].reason


@pytest.mark.slow
async def test_run_now_runs_here_and_is_recorded(harness: Harness, schedulers: Make) -> None:
    contexts: list[RunContext] = []

    async def handler(ctx: RunContext) -> str:
        contexts.append(ctx)
        return "done"

    [scheduler] = schedulers(1)
    scheduler.add("report", "0 6 * * MON-FRI", handler)
    async with scheduler:
        first = await scheduler.run_now("report")
        second = await scheduler.run_now("report")
        history = await scheduler.history("report")
        with pytest.raises(JobNotFound, match="'nope'"):
            await scheduler.run_now("nope")
    assert first.status is RunStatus.SUCCEEDED and first.trigger is Trigger.MANUAL
    assert first.slot is None and first.instance == scheduler.instance_id
    assert first.fence is not None and second.fence is not None and second.fence > first.fence
    assert [r.run_id for r in history] == [second.run_id, first.run_id]
    assert [c.run_id for c in contexts] == [first.run_id, second.run_id]


async def test_run_now_respects_overlap(lease_harness: Harness, schedulers: Make) -> None:
    release = asyncio.Event()

    async def held(ctx: RunContext) -> None:
        await release.wait()

    [scheduler] = schedulers(1)
    scheduler.add("held", "0 0 1 1 *", held, lease_ms=5_000)
    async with scheduler:
        first = asyncio.ensure_future(scheduler.run_now("held"))
        await asyncio.sleep(0.3)
        second = await scheduler.run_now("held")
        release.set()
        assert (await first).status is RunStatus.SUCCEEDED
    assert second.status is RunStatus.SKIPPED and second.reason
    assert "overlap" in second.reason


async def test_failing_handlers_are_recorded_and_the_scheduler_goes_on(
    harness: Harness, schedulers: Make
) -> None:
    threads: list[str] = []

    async def boom(ctx: RunContext) -> None:
        raise RuntimeError("disk full")

    def plain(ctx: RunContext) -> None:
        threads.append(threading.current_thread().name)

    async def hang(ctx: RunContext) -> None:
        await asyncio.sleep(30)

    [scheduler] = schedulers(1)
    scheduler.add("boom", "0 0 1 1 *", boom)
    scheduler.add("plain", "0 0 1 1 *", plain)
    scheduler.add("hang", "0 0 1 1 *", hang, timeout_ms=300)
    async with scheduler:
        failed = await scheduler.run_now("boom")
        fine = await scheduler.run_now("plain")
        slow = await scheduler.run_now("hang")
        again = await scheduler.run_now("boom")
    assert failed.status is RunStatus.FAILED and failed.error == "RuntimeError: disk full"
    assert again.status is RunStatus.FAILED
    assert fine.status is RunStatus.SUCCEEDED and threads[0].startswith("anarchon-job")
    assert slow.status is RunStatus.FAILED and slow.error and "timeout_ms=300" in slow.error


async def test_bad_inputs_name_the_value_and_the_rule(harness: Harness, schedulers: Make) -> None:
    [scheduler] = schedulers(1)

    async def handler(ctx: RunContext) -> None:
        pass

    cases: list[tuple[type[Exception], str, dict[str, Any]]] = [
        (InvalidSchedule, "minute field '61'", {"schedule": "61 * * * *"}),
        (InvalidSchedule, "6 fields|5", {"schedule": "* * *"}),
        (InvalidSchedule, "@reboot", {"schedule": "@reboot"}),
        (InvalidTimezone, "Mars/Olympus", {"timezone": "Mars/Olympus"}),
        (InvalidTimezone, "'localtime' is not an IANA", {"timezone": "localtime"}),
        (InvalidJobName, "'a.b'", {"name": "a.b"}),
        (InvalidJobName, "128", {"name": "x" * 129}),
        (InvalidOption, "jitter_ms=-1", {"jitter_ms": -1}),
        (InvalidOption, "max_late_ms=-5", {"max_late_ms": -5}),
        (InvalidOption, "must be less than max_late_ms", {"jitter_ms": 5000, "max_late_ms": 1000}),
        (InvalidOption, "timeout_ms=0", {"timeout_ms": 0}),
        (InvalidOption, "overlap='sometimes'", {"overlap": "sometimes"}),
    ]
    for error, text, args in cases:
        kwargs: dict[str, Any] = {"name": "job", "schedule": "* * * * *", **args}
        with pytest.raises(error, match=text):
            scheduler.add(kwargs.pop("name"), kwargs.pop("schedule"), handler, **kwargs)
        assert isinstance(error("x"), ValueError)
    scheduler.add("job", "* * * * *", handler)
    with pytest.raises(DuplicateJob, match="'job'"):
        scheduler.add("job", "* * * * *", handler)
    with pytest.raises(JobNotFound):
        scheduler.remove("other")


async def test_lease_options_on_a_broker_are_refused(harness: Harness, schedulers: Make) -> None:
    [scheduler] = schedulers(1)

    async def handler(ctx: RunContext) -> None:
        pass

    lease_options: list[dict[str, Any]] = [
        {"lease_ms": 5_000},
        {"max_attempts": 2},
        {"overlap": "skip"},
        {"catch_up": "latest"},
        {"handover": True},
        {"history_ttl_ms": 3_600_000},
    ]
    for n, options in enumerate(lease_options):
        if harness.lease:
            scheduler.add(f"job{n}", "* * * * *", handler, **options)
        else:
            with pytest.raises(UnsupportedFeature, match="Redis, PostgreSQL or SQLite"):
                scheduler.add(f"job{n}", "* * * * *", handler, **options)
    # The defaults always pass.
    scheduler.add("plain", "* * * * *", handler)


async def test_jobs_can_be_added_and_removed_while_running(
    harness: Harness, schedulers: Make
) -> None:
    seen: list[str] = []

    async def record(ctx: RunContext) -> None:
        seen.append(ctx.job)

    [scheduler] = schedulers(1)
    async with scheduler:
        scheduler.add("late", EVERY_SECOND, record, jitter_ms=0)
        await until(lambda: "late" in seen, 5, "the added job to run")
        scheduler.remove("late")
        await asyncio.sleep(0.2)
        count = len(seen)
        await asyncio.sleep(1.5)
        assert len(seen) == count, "a removed job kept running"
        assert scheduler.jobs == {}
