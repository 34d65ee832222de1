"""Runs open from before an instance carried their job: watched from its start (or its
``add()``) and taken over when their lease ends, so a run whose runner dies is not lost when
every instance that lost its claim is gone too (a restart, a rolling deploy)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from anarchon import BackendUnavailable, Run, RunContext, RunStatus, Scheduler, Trigger
from anarchon.backend import ClaimRequest
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, Recording

YEARLY = "0 0 1 1 *"  # START is one of its slots; no other comes during a test


async def _crashed_run(backend: Recording, key: str | None = None) -> None:
    """A runner claimed the slot START under a 3 s lease, then died without a word."""
    [outcome] = await backend.claim(
        [
            ClaimRequest(
                job="work",
                slot=None if key else START,
                run_id="crashed",
                token="crashed-token",
                instance="crashed",
                trigger=Trigger.MANUAL if key else Trigger.SCHEDULE,
                lease_ms=3_000,
                key=key,
            )
        ]
    )
    assert outcome.ticket is not None


async def _work(ctx: RunContext) -> None:
    pass


def _actions(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


@pytest.mark.parametrize("key", [None, "manual-request-1"], ids=["scheduled", "triggered"])
async def test_a_run_open_before_the_start_is_taken_over_when_its_lease_ends(
    key: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "anarchon")
    clock = FakeClock(START)
    backend = Recording(clock)
    await _crashed_run(backend, key)
    later = Scheduler(backend, clock=clock, instance_id="later")
    later.add("work", YEARLY, _work)  # every option at its default
    async with later:
        await clock.advance(4_000)
        runs = await later.history("work")
    assert [(r.instance, r.attempt, r.status) for r in runs] == [
        ("later", 2, RunStatus.SUCCEEDED),
        ("crashed", 1, RunStatus.FAILED),
    ]
    assert runs[1].reason == "lease lost"
    assert runs[0].slot_key == runs[1].slot_key == (key or str(START))
    [adopted] = _actions(caplog, "runs_adopted")
    assert adopted.job == "work" and adopted.runs == 1  # type: ignore[attr-defined]


async def test_a_job_added_while_running_adopts_its_open_runs() -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    await _crashed_run(backend)
    later = Scheduler(backend, clock=clock, instance_id="later")
    async with later:
        later.add("work", YEARLY, _work)
        await clock.advance(4_000)
        [last] = (await later.history("work"))[:1]
    assert (last.instance, last.attempt, last.status) == ("later", 2, RunStatus.SUCCEEDED)


async def test_a_run_older_than_the_catch_up_window_is_left_alone() -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    await _crashed_run(backend)
    await clock.advance(60 * MINUTE + 1_000)  # the default catch_up_window_ms is one hour
    later = Scheduler(backend, clock=clock, instance_id="later")
    later.add("work", YEARLY, _work)
    async with later:
        await clock.advance(4_000)
        runs = await later.history("work")
    assert backend.named("take_over") == []
    assert [(r.instance, r.status) for r in runs] == [("crashed", RunStatus.RUNNING)]


class NoHistory(Recording):
    """A backend whose open runs cannot be read."""

    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        raise BackendUnavailable("open runs: connection refused")


async def test_a_history_that_cannot_be_read_is_logged_and_the_start_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "anarchon")
    clock = FakeClock(START)
    backend = NoHistory(clock)
    ran: list[int] = []

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.attempt)

    later = Scheduler(backend, clock=clock, instance_id="later")
    later.add("work", "* * * * *", work, jitter_ms=0)
    async with later:
        await clock.advance(MINUTE + 2_000)
    [failed] = _actions(caplog, "adopt_failed")
    assert failed.levelno == logging.WARNING
    assert "1 job(s) (work)" in failed.getMessage()
    assert "connection refused" in failed.getMessage()
    assert ran == [1], "the scheduler did not go on firing"


def _keys(runs: Sequence[Run]) -> list[str | None]:
    return [r.slot_key for r in runs]


async def test_history_names_each_runs_slot_key() -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    await _crashed_run(backend)
    await _crashed_run(backend, "manual-request-1")
    assert _keys(await backend.history("work")) == ["manual-request-1", str(START)]
