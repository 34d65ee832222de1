"""Testing your own jobs with ``anarchon.testing``: no server, no waiting, and the nights when the
clocks change. Run it with ``pytest test_my_jobs.py``.

The first part stands for your application's code: a function that builds the scheduler with the
backend and clock it is given, so tests can give it the in-memory ones.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from zoneinfo import ZoneInfo

from anarchon import Backend, RunContext, RunStatus, Scheduler
from anarchon.testing import FakeClock, MemoryBackend

ATHENS = ZoneInfo("Europe/Athens")
sent: list[str] = []  # what the job did; in your code, an e-mail or a row


def build(backend: Backend | None = None, clock: FakeClock | None = None) -> Scheduler:
    """Your application's scheduler (``build()`` in production: SQLite, the system clock)."""
    scheduler = Scheduler(backend, clock=clock)

    @scheduler.job("digest", "30 3 * * *", timezone="Europe/Athens", jitter_ms=0)
    async def digest(ctx: RunContext) -> None:
        assert ctx.slot is not None
        if ctx.slot.astimezone(ATHENS).month == 2:
            raise RuntimeError("no digest in February")
        sent.append(ctx.slot.astimezone(ATHENS).isoformat())

    return scheduler


# -- the tests ---------------------------------------------------------------------------------


async def run_for(hours: int, start: datetime) -> Scheduler:
    """Build the scheduler on a fake clock at ``start`` and let ``hours`` pass (in one-minute
    steps: each due slot fires, at no cost in real time)."""
    clock = FakeClock(start_ms=int(start.timestamp() * 1000))
    scheduler = build(MemoryBackend(clock=clock), clock)
    async with scheduler:
        await clock.advance(hours * 3_600_000, step_ms=60_000)
    return scheduler


def test_a_time_that_spring_forward_skips_runs_once_right_after_the_gap() -> None:
    # 2027-03-28: Athens moves from 03:00 to 04:00, so 03:30 does not exist that night.
    sent.clear()
    asyncio.run(run_for(48, datetime(2027, 3, 27, 12, tzinfo=ATHENS)))
    assert sent == ["2027-03-28T04:00:00+03:00", "2027-03-29T03:30:00+03:00"]


def test_a_time_that_fall_back_repeats_runs_once_at_the_first() -> None:
    # 2027-10-31: Athens moves from 04:00 back to 03:00, so 03:30 happens twice that night.
    sent.clear()
    asyncio.run(run_for(24, datetime(2027, 10, 30, 12, tzinfo=ATHENS)))
    assert sent == ["2027-10-31T03:30:00+03:00"]


def test_a_failing_run_is_recorded_with_its_error() -> None:
    async def scenario() -> None:
        clock = FakeClock(start_ms=int(datetime(2027, 2, 1, tzinfo=ATHENS).timestamp() * 1000))
        scheduler = build(MemoryBackend(clock=clock), clock)
        async with scheduler:
            await clock.advance(24 * 3_600_000, step_ms=60_000)
            (run,) = await scheduler.history("digest")
        assert run.status is RunStatus.FAILED and "no digest in February" in (run.error or "")
        assert run.slot == datetime(2027, 2, 1, 3, 30, tzinfo=ATHENS)

    asyncio.run(scenario())
