"""The scheduler's side of steering (issue 13) on the memory backend with a clock moved by hand:
pause and resume, triggered runs, retries with backoff, the on_failure hook, missed slots."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from anarchon import (
    BackendUnavailable,
    MemoryBackend,
    Run,
    RunContext,
    RunStatus,
    Scheduler,
    SchedulerStateError,
    Trigger,
    steering,
)
from anarchon._job import DEFAULT_RETRY_BACKOFF_MAX_MS, DEFAULT_RETRY_BACKOFF_MS
from anarchon._missed import MARGIN_MS, MAX_RECORDED, Gap, gap_slots, missed_reason
from anarchon._retrying import retry_number, retry_request_id
from anarchon._schedule import CronSchedule
from anarchon.backend import ClaimOutcome, ClaimRequest
from anarchon.control import ALL_JOBS, RunRequest
from anarchon.errors import InvalidJobName, InvalidOption, UnsupportedFeature
from anarchon.testing import FakeClock

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


async def _noop(ctx: RunContext) -> None:
    pass


def _ms(when: datetime | None) -> int:
    assert when is not None
    return round(when.timestamp() * 1000)


# -- pause and resume -------------------------------------------------------------------------


async def test_a_pause_holds_every_instance_until_resumed(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    ran: list[int] = []

    async def handler(ctx: RunContext) -> None:
        ran.append(_ms(ctx.slot))

    fleet = [Scheduler(backend, clock=clock, instance_id=f"i{n}") for n in range(3)]
    for scheduler in fleet:
        scheduler.add("tick", "* * * * *", handler, jitter_ms=0)
        await scheduler.start()
    try:
        await clock.advance(MINUTE + 500)
        assert ran == [START + MINUTE]
        pause = await fleet[1].pause("tick", by="alice@ops")
        assert pause.job == "tick" and pause.by == "alice@ops" and pause.until_ms is None
        assert await fleet[2].paused() == [pause]
        await clock.advance(2 * MINUTE)
        assert ran == [START + MINUTE]
        skipped = [r for r in await fleet[0].history("tick") if r.status is RunStatus.SKIPPED]
        assert [r.reason for r in skipped] == ["paused by alice@ops"] * 2
        # Counted once, by the instance whose claim wrote each skip record (as history).
        assert sum(s.metrics().slots_paused for s in fleet) == 2
        assert sum(s.metrics().skipped for s in fleet) == 2
        assert await fleet[0].resume("tick") is True
        assert await fleet[0].resume("tick") is False
        await clock.advance(MINUTE)
        assert ran == [START + MINUTE, START + 4 * MINUTE]
    finally:
        for scheduler in fleet:
            await scheduler.stop()


async def test_a_cluster_pause_with_an_end_and_a_job_not_carried_here(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    ran: list[int] = []

    async def handler(ctx: RunContext) -> None:
        ran.append(_ms(ctx.slot))

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("tick", "* * * * *", handler, jitter_ms=0)
    async with scheduler:
        until = datetime.fromtimestamp(START / 1000, UTC) + timedelta(minutes=2, seconds=30)
        everything = await scheduler.pause_all(until=until, by="ops")
        elsewhere = await scheduler.pause("report", by="ops")  # carried by other instances
        assert [p.job for p in await scheduler.paused()] == [ALL_JOBS, "report"]
        assert everything.until_ms == _ms(until)
        await clock.advance(2 * MINUTE + 500)
        assert ran == []
        [last, _] = await scheduler.history("tick")
        assert last.reason is not None
        assert last.reason.startswith("paused by ops (all jobs) until 2026-01-01T00:02:30")
        await clock.advance(MINUTE)  # the cluster pause ended by itself
        assert ran == [START + 3 * MINUTE]
        assert [p.job for p in await scheduler.paused()] == [elsewhere.job]
        assert await scheduler.resume_all() is False
        assert await scheduler.resume("report") is True


async def test_steering_needs_a_started_scheduler_and_good_input(clock: FakeClock) -> None:
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    for call in (
        scheduler.pause("tick"),
        scheduler.pause_all(),
        scheduler.resume("tick"),
        scheduler.resume_all(),
        scheduler.paused(),
        scheduler.trigger("tick"),
    ):
        with pytest.raises(SchedulerStateError, match=r"call 'await scheduler\.start"):
            await call
    async with scheduler:
        with pytest.raises(InvalidOption, match="must be an aware datetime"):
            await scheduler.pause("tick", until=datetime(2030, 1, 1))
        with pytest.raises(InvalidOption, match="is not in the future"):
            await scheduler.pause("tick", until=datetime(2020, 1, 1, tzinfo=UTC))
        with pytest.raises(InvalidOption, match=r"\(2100-01-01T00:00:00Z\) is more than 10 years"):
            await scheduler.pause("tick", until=datetime(2100, 1, 1, tzinfo=UTC))
        with pytest.raises(InvalidOption, match="leave the end out to pause until resumed"):
            await scheduler.pause_all(until=datetime.max.replace(tzinfo=UTC))
        assert await scheduler.paused() == []
        with pytest.raises(InvalidJobName):
            await scheduler.trigger("no such")


async def test_who_paused_or_asked_follows_the_instance_id_rule(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``by=""`` became user@host and ``by="x\ny"`` was stored (instance_id refuses both);
    ``by`` had no length bound. Each is refused naming it, and nothing is stored."""
    monkeypatch.delenv("ANARCHON_REQUESTER", raising=False)
    longest = 256  # docs/operations.md
    control = (backend := MemoryBackend(clock=clock)).control()
    scheduler = Scheduler(backend, clock=clock)
    long = "x" * (longest + 1)
    async with scheduler:
        for by, said in (
            ("", "by='' must be a non-empty string of at most 256 characters"),
            (long, f"by={long[:40]!r}... (257 characters) must be a non-empty string of at most"),
            (5, "by=5 must be a non-empty string of at most 256 characters"),
            ("x\ny", "by='x\\ny' must be printable: no newline, tab or other control character"),
            ("\x1b[31mred", "by='\\x1b[31mred' must be printable"),
        ):
            for call in (
                scheduler.pause("tick", by=by),  # type: ignore[arg-type]
                scheduler.pause_all(by=by),  # type: ignore[arg-type]
                scheduler.trigger("tick", by=by),  # type: ignore[arg-type]
            ):
                with pytest.raises(InvalidOption) as caught:
                    await call
                assert str(caught.value).startswith(said), caught.value
        assert await control.pauses() == [] and await control.requests(["tick"]) == []
        # At the default (None): user@host; the longest allowed is kept whole.
        pause = await scheduler.pause("tick")
        assert pause.by == steering.requester() and "@" in pause.by
        assert (await scheduler.trigger("tick", by="x" * longest)).requested_by == "x" * longest
        monkeypatch.setenv("ANARCHON_REQUESTER", "ops\tteam")
        with pytest.raises(InvalidOption, match=r"^\$ANARCHON_REQUESTER='ops\\tteam' must be"):
            await scheduler.pause_all()


# -- triggered runs ---------------------------------------------------------------------------


async def test_a_trigger_runs_once_on_one_of_three_instances(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    ran: list[tuple[str, RunContext]] = []

    async def handler(ctx: RunContext) -> None:
        ran.append((ctx.instance, ctx))

    fleet = [
        Scheduler(backend, clock=clock, instance_id=f"i{n}", control_poll_ms=500) for n in range(3)
    ]
    for scheduler in fleet:
        scheduler.add("report", "0 6 * * *", handler)
        await scheduler.start()
    try:
        # Asked from a process that carries nothing: the backend alone.
        request = await steering.trigger(backend, "report", by="bob@laptop")
        await clock.advance(1_000)
        assert len(ran) == 1
        ctx = ran[0][1]
        assert ctx.trigger is Trigger.MANUAL and ctx.slot is None and ctx.retry == 0
        assert ctx.run_id == request.id
        [run] = await fleet[0].history("report")
        assert run.status is RunStatus.SUCCEEDED and run.trigger is Trigger.MANUAL
        assert run.requested_by == "bob@laptop" and run.run_id == request.id
        assert await backend.control().requests() == []
        assert sum(s.metrics().requests_run for s in fleet) == 1
        await clock.advance(5_000)
        assert len(ran) == 1
        # From a scheduler, for a job it does not carry: stored, run by none of these.
        other = await fleet[0].trigger("elsewhere", by="carol")
        await clock.advance(3_000)
        assert await backend.control().requests() == [other]
    finally:
        for scheduler in fleet:
            await scheduler.stop()


async def test_a_trigger_waits_out_an_outage_of_the_control_store_logged_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(clock=clock)
    store = backend.control()
    broken = {"on": True}
    original = store.requests

    async def requests(jobs: Sequence[str] | None = None) -> list[RunRequest]:
        if broken["on"]:
            raise BackendUnavailable("control store down (test)")
        return await original(jobs)

    store.requests = requests  # type: ignore[method-assign]
    ran: list[str] = []

    async def handler(ctx: RunContext) -> None:
        ran.append(ctx.run_id)

    scheduler = Scheduler(backend, clock=clock)
    scheduler.add("report", "0 6 * * *", handler)
    caplog.set_level(logging.INFO, "anarchon")
    async with scheduler:
        request = await scheduler.trigger("report")
        await clock.advance(10_000)
        assert ran == []
        broken["on"] = False
        await clock.advance(1_500)
        assert ran == [request.id]
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("control_unavailable") == 1
    assert actions.count("control_recovered") == 1


async def test_run_now_still_runs_here(clock: FakeClock) -> None:
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("report", "0 6 * * *", _noop)
    async with scheduler:
        run = await scheduler.run_now("report")
        assert run.status is RunStatus.SUCCEEDED and run.trigger is Trigger.MANUAL


# -- retries and on_failure -------------------------------------------------------------------


async def test_a_failing_handler_is_retried_with_backoff_until_it_succeeds(
    clock: FakeClock,
) -> None:
    backend = MemoryBackend(clock=clock)
    calls: list[tuple[int, Trigger, int, str]] = []

    async def handler(ctx: RunContext) -> None:
        calls.append((ctx.retry, ctx.trigger, clock.now_ms(), ctx.instance))
        if len(calls) <= 2:
            raise RuntimeError(f"failure {len(calls)}")

    failures: list[Run] = []
    fleet = [Scheduler(backend, clock=clock, instance_id=f"i{n}") for n in range(2)]
    for scheduler in fleet:
        scheduler.add(
            "sync",
            "* * * * *",
            handler,
            jitter_ms=0,
            retries=3,
            retry_backoff_ms=2_000,
            retry_backoff_max_ms=3_000,
            on_failure=failures.append,
        )
        await scheduler.start()
    try:
        await clock.advance(MINUTE + 12_000)
    finally:
        for scheduler in fleet:
            await scheduler.stop()
    assert [(retry, trigger) for retry, trigger, _, _ in calls] == [
        (0, Trigger.SCHEDULE),
        (1, Trigger.RETRY),
        (2, Trigger.RETRY),
    ]
    starts = [at for _, _, at, _ in calls]
    # Retry 1 after 2 s jittered down to 1 s, retry 2 after 4 s capped at 3 s (down to 1.5 s);
    # each found by the next poll (1 s) of either instance.
    assert 1_000 <= starts[1] - starts[0] <= 2_000 + 1_100, starts
    assert 1_500 <= starts[2] - starts[1] <= 3_000 + 1_100, starts
    runs = list(reversed(await backend.history("sync")))
    slot = START + MINUTE
    assert [(r.trigger, r.status, r.slot_ms) for r in runs] == [
        (Trigger.SCHEDULE, RunStatus.FAILED, slot),
        (Trigger.RETRY, RunStatus.FAILED, slot),
        (Trigger.RETRY, RunStatus.SUCCEEDED, slot),
    ]
    fences = [r.fence for r in runs]
    assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(fences))
    assert runs[1].requested_by == f"retry 1 of 3 after run {runs[0].run_id}"
    assert runs[2].requested_by == f"retry 2 of 3 after run {runs[1].run_id}"
    assert runs[1].run_id == retry_request_id("sync", str(slot), 1)
    assert sum(s.metrics().retries_scheduled for s in fleet) == 2
    assert failures == []
    assert await backend.control().requests() == []


async def test_retries_exhausted_call_on_failure_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(clock=clock)
    seen: list[Run] = []

    async def handler(ctx: RunContext) -> None:
        raise ValueError(f"broken (retry {ctx.retry})")

    async def alert(run: Run) -> None:
        seen.append(run)
        raise RuntimeError("the pager is down too")  # logged, never raised

    fleet = [Scheduler(backend, clock=clock, instance_id=f"i{n}") for n in range(3)]
    for scheduler in fleet:
        scheduler.add(
            "sync",
            "0 * * * *",
            handler,
            jitter_ms=0,
            retries=2,
            retry_backoff_ms=0,
            on_failure=alert,
        )
        await scheduler.start()
    caplog.set_level(logging.INFO, "anarchon")
    try:
        await clock.advance(60 * MINUTE + 6_000, step_ms=500)
    finally:
        for scheduler in fleet:
            await scheduler.stop()
    assert len(seen) == 1
    [final] = seen
    assert final.status is RunStatus.FAILED and final.trigger is Trigger.RETRY
    assert final.error == "ValueError: broken (retry 2)"
    history = await backend.history("sync")
    assert [r.status for r in history] == [RunStatus.FAILED] * 3
    assert sum(s.metrics().failure_hook_errors for s in fleet) == 1
    assert [getattr(r, "action", None) for r in caplog.records].count("failure_hook_failed") == 1


async def test_a_plain_on_failure_hook_runs_without_retries(clock: FakeClock) -> None:
    seen: list[Run] = []

    def handler(ctx: RunContext) -> None:
        raise RuntimeError("no")

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("sync", "0 6 * * *", handler, on_failure=seen.append)
    async with scheduler:
        run = await scheduler.run_now("sync")
    assert run.status is RunStatus.FAILED
    assert [r.run_id for r in seen] == [run.run_id]


def test_retry_numbers_and_ids() -> None:
    assert retry_number("1767225660000") == 0
    assert retry_number("1767225660000-retry-3") == 3
    assert retry_number("manual-abc-retry-12") == 12
    first = retry_request_id("sync", "1767225660000", 1)
    assert len(first) == 32 and int(first, 16) >= 0
    assert first == retry_request_id("sync", "1767225660000-retry-2", 1)
    assert first != retry_request_id("sync", "1767225660000", 2)
    assert first != retry_request_id("other", "1767225660000", 1)


def test_retry_options_are_checked_at_add(clock: FakeClock) -> None:
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    scheduler.add("ok", "* * * * *", _noop, retries=1000, retry_backoff_ms=0)
    for bad, rule in (
        (
            {"retries": -1},
            "retries=-1 for job 'bad' is out of range: it must be an integer from 0 to 1000",
        ),
        ({"retries": 1001}, "retries=1001 for job 'bad' is out of range"),
        ({"retries": "3"}, "retries='3' for job 'bad' must be an integer from 0 to 1000"),
        ({"retry_backoff_ms": -1}, "retry_backoff_ms=-1 for job 'bad' is out of range"),
        (
            {"retry_backoff_ms": 5_000, "retry_backoff_max_ms": 1_000},
            "retry_backoff_max_ms=1000 for job 'bad' must be at least retry_backoff_ms=5000",
        ),
        ({"on_failure": "pager"}, "on_failure='pager' for job 'bad' must be None or a callable"),
        ({"on_failure": lambda: None}, "cannot be called with one positional argument"),
    ):
        with pytest.raises(InvalidOption) as info:
            scheduler.add("bad", "* * * * *", _noop, **bad)
        assert rule in str(info.value)

    class NoControl(MemoryBackend):
        def control(self) -> None:  # type: ignore[override]
            return None

    bare = Scheduler(NoControl(clock=clock), clock=clock)
    bare.add("fine", "* * * * *", _noop, on_failure=print)
    with pytest.raises(UnsupportedFeature, match="asks for retries=2, but the memory backend"):
        bare.add("sync", "* * * * *", _noop, retries=2)


def test_every_new_option_defaults_to_off(clock: FakeClock) -> None:
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    assert scheduler.control_poll_ms == 1_000
    scheduler.add("job", "* * * * *", _noop)
    job = scheduler._jobs["job"]
    assert job.retry.retries == 0
    assert job.retry.backoff_ms == DEFAULT_RETRY_BACKOFF_MS == 1_000
    assert job.retry.backoff_max_ms == DEFAULT_RETRY_BACKOFF_MAX_MS == 300_000
    assert job.options.on_failure is None
    assert scheduler._services.catching_up._missed is not None  # missed slots are recorded
    metrics = scheduler.metrics()
    for name in (
        "slots_missed",
        "slots_paused",
        "retries_scheduled",
        "requests_run",
        "failure_hook_errors",
    ):
        assert metrics[name] == 0
    with pytest.raises(InvalidOption, match="control_poll_ms=50 for Scheduler is out of range"):
        Scheduler(MemoryBackend(clock=clock), clock=clock, control_poll_ms=50)
    assert job.retry.delay_ms(1) == 1_000 and job.retry.delay_ms(3) == 4_000
    assert job.retry.delay_ms(40) == 300_000


# -- missed slots -----------------------------------------------------------------------------


async def test_slots_nobody_ran_are_recorded_missed_on_restart(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(clock=clock)
    first = Scheduler(backend, clock=clock, instance_id="first")
    first.add("tick", "* * * * *", _noop, jitter_ms=0)
    async with first:
        await clock.advance(2 * MINUTE + 500)
    last = START + 2 * MINUTE
    await clock.advance(60 * MINUTE)  # nobody carries the job for an hour
    start = clock.now_ms()
    caplog.set_level(logging.INFO, "anarchon")
    second = Scheduler(backend, clock=clock, instance_id="second")
    second.add("tick", "* * * * *", _noop, jitter_ms=0)
    async with second:
        await clock.advance(1_000)
        runs = await backend.history("tick", limit=1000)
        recorded_at_once = [r.slot_ms or 0 for r in runs if r.status is RunStatus.MISSED]
        await clock.advance(65_000)  # max_late_ms + jitter_ms + the margin after the start
        metrics = second.metrics()
    runs = await backend.history("tick", limit=1000)
    missed = sorted((r for r in runs if r.status is RunStatus.MISSED), key=lambda r: r.slot_ms or 0)
    # The slots after the last run and before the start, but the newest (catch_up='latest'
    # runs it): 59 slots, the newest 20 recorded; those older than start - max_late_ms -
    # the margin at once, the one after them 65 s later (a running instance could claim it).
    cutoff = start - 60_000 - MARGIN_MS
    expected = list(range(last + MINUTE, start - MINUTE, MINUTE))
    assert len(expected) == 59
    assert sorted(recorded_at_once) == [s for s in expected[-MAX_RECORDED:] if s <= cutoff]
    assert len(recorded_at_once) == MAX_RECORDED - 1
    assert len(missed) == MAX_RECORDED
    assert [r.slot_ms for r in missed] == expected[-MAX_RECORDED:]
    assert {r.trigger for r in missed} == {Trigger.SCHEDULE}
    assert {r.instance for r in missed} == {"second"}
    assert {r.reason for r in missed} == {
        "missed: no instance carried the job from 2026-01-01T00:02:00.000+00:00 to "
        f"2026-01-01T01:02:00.500+00:00; {len(expected)} slots missed in all, the newest 20 "
        "recorded"
    }
    caught_up = [r for r in runs if r.trigger is Trigger.CATCH_UP]
    assert [r.slot_ms for r in caught_up] == [START + 62 * MINUTE]
    assert metrics.slots_missed == MAX_RECORDED
    logged = [r for r in caplog.records if getattr(r, "action", None) == "slots_missed"]
    assert [r.count for r in logged] == [MAX_RECORDED - 1, 1]  # type: ignore[attr-defined]
    for record in logged:
        assert record.levelno == logging.WARNING
        assert record.job == "tick"  # type: ignore[attr-defined]
        assert getattr(record, "from") == "2026-01-01T00:02:00.000+00:00"
        assert record.to == "2026-01-01T01:02:00.500+00:00"  # type: ignore[attr-defined]


async def test_missed_slots_of_many_jobs_are_recorded_in_parts(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More missed claims than one part goes to the backend in parts (a NATS claim call must
    send all of its publishes within CLAIM_RETRY_S); every slot of every part is recorded."""
    monkeypatch.setattr("anarchon._missed.PART", 7)
    calls: list[int] = []

    class Counting(MemoryBackend):
        async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
            if all(r.skip_status is RunStatus.MISSED for r in requests):
                calls.append(len(requests))
            return await super().claim(requests)

    backend = Counting(clock=clock)
    jobs = ["a", "b", "c"]
    first = Scheduler(backend, clock=clock)
    for job in jobs:
        first.add(job, "* * * * *", _noop, jitter_ms=0, catch_up="none")
    async with first:
        await clock.advance(MINUTE + 500)
    await clock.advance(10 * MINUTE)
    second = Scheduler(backend, clock=clock)
    for job in jobs:
        second.add(job, "* * * * *", _noop, jitter_ms=0, catch_up="none")
    async with second:
        await clock.advance(500)
    # 00:02 to 00:09 of each job (8 slots, those newer wait max_late_ms): 24 claims, parts of 7.
    assert calls == [7, 7, 7, 3]
    for job in jobs:
        missed = [r for r in await backend.history(job) if r.status is RunStatus.MISSED]
        assert sorted(r.slot_ms or 0 for r in missed) == [START + n * MINUTE for n in range(2, 10)]


async def test_a_short_gap_is_recorded_whole_and_a_job_without_history_has_none(
    clock: FakeClock,
) -> None:
    backend = MemoryBackend(clock=clock)
    first = Scheduler(backend, clock=clock)
    first.add("tick", "* * * * *", _noop, jitter_ms=0, catch_up="none")
    async with first:
        await clock.advance(MINUTE + 500)
    await clock.advance(5 * MINUTE)
    second = Scheduler(backend, clock=clock)
    second.add("tick", "* * * * *", _noop, jitter_ms=0, catch_up="none")
    second.add("fresh", "* * * * *", _noop, jitter_ms=0)
    async with second:
        await clock.advance(500)
        early = [r for r in await backend.history("tick") if r.status is RunStatus.MISSED]
        await clock.advance(65_000)
    missed = [r for r in await backend.history("tick") if r.status is RunStatus.MISSED]
    # 00:02 to 00:04 at once; 00:05 and 00:06 are within max_late_ms + the margin of the start
    # (00:06:00.500): recorded once that much time has passed.
    assert sorted(r.slot_ms or 0 for r in early) == [START + n * MINUTE for n in (2, 3, 4)]
    assert sorted(r.slot_ms or 0 for r in missed) == [START + n * MINUTE for n in range(2, 7)]
    assert all(r.reason is not None and "in all" not in r.reason for r in missed)
    fresh = await backend.history("fresh")
    assert [r.slot_ms for r in fresh] == [START + 7 * MINUTE]  # ran; nothing recorded missed


async def test_gap_slots_counts_to_a_limit_then_finds_the_newest() -> None:
    schedule = CronSchedule("* * * * * *")  # every second
    day = 86_400_000
    gap = await gap_slots(schedule, START, START + day, limit=10_000)
    assert not gap.exact and gap.total == 10_000
    assert gap.newest == [START + day - 19_000 + n * 1000 for n in range(20)]
    assert "more than 10000 slots missed in all" in missed_reason(START, START + day, gap)
    small = await gap_slots(schedule, START, START + 5_000, exclude=frozenset({START + 5_000}))
    assert small == Gap([START + n * 1000 for n in range(1, 5)], 4)


async def test_last_slots_are_looked_up_in_parts_and_a_failed_part_skips_only_its_jobs(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At start, the last slots of many jobs are read in parts (100 000 jobs in one Redis
    pipeline took longer than a call may); a part the backend fails skips catch-up for its jobs
    alone, logged once, and the other parts' jobs are caught up."""
    monkeypatch.setattr("anarchon._catchup.CLAIM_PART", 2)
    asked: list[list[str]] = []

    class FailingSecondPart(MemoryBackend):
        async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
            asked.append(list(jobs))
            if len(asked) == 2:
                raise BackendUnavailable("down for one part (test)")
            return await super().last_slots(jobs)

    backend = FailingSecondPart(clock=clock)
    jobs = ["a", "b", "c", "d", "e"]
    first = Scheduler(backend, clock=clock)
    for job in jobs:
        first.add(job, "* * * * *", _noop, jitter_ms=0)
    async with first:
        await clock.advance(MINUTE + 500)
    await clock.advance(10 * MINUTE)
    asked.clear()
    caplog.clear()
    caplog.set_level(logging.WARNING, "anarchon")
    second = Scheduler(backend, clock=clock)
    for job in jobs:
        second.add(job, "* * * * *", _noop, jitter_ms=0)
    async with second:
        await clock.advance(5_000)
    assert asked == [["a", "b"], ["c", "d"], ["e"]]
    caught_up = {
        job for job in jobs for r in await backend.history(job) if r.trigger is Trigger.CATCH_UP
    }
    assert caught_up == {"a", "b", "e"}
    skipped = [r.getMessage() for r in caplog.records if "catch-up skipped" in r.getMessage()]
    assert skipped == ["catch-up skipped for 2 job(s) (c and 1 more): down for one part (test)"]
