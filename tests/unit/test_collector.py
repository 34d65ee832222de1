"""The garbage collector is paused while a burst's runs are started, and given back as it was."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from anarchon import RunContext, Scheduler, _collector
from anarchon._claims import CLAIM_PART
from anarchon._collector import pause
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START


@pytest.fixture(autouse=True)
def _collecting() -> Iterator[None]:
    """Every test begins and ends with the collector enabled and no pause on."""
    gc.enable()
    yield
    assert not _collector._PAUSED.count
    gc.enable()


async def test_a_pause_disables_automatic_collection_until_it_ends() -> None:
    first = pause()
    assert not gc.isenabled()
    second = pause()  # another scheduler's burst meanwhile
    first.end()
    assert not gc.isenabled()
    second.end()
    assert gc.isenabled()
    second.end()  # ending again does nothing
    assert gc.isenabled() and not _collector._PAUSED.count


async def test_a_collector_the_application_disabled_stays_disabled() -> None:
    gc.disable()
    paused = pause()
    paused.end()
    assert not gc.isenabled()


async def test_a_pause_ends_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_collector, "MAX_PAUSE_S", 0.01)
    paused = pause()
    assert not gc.isenabled()
    await asyncio.sleep(0.05)
    assert gc.isenabled()
    paused.end()
    assert gc.isenabled()


async def test_a_child_forked_during_a_pause_collects() -> None:
    paused = pause()
    state = _collector._PAUSED
    lock = state.lock
    try:
        state.forked()  # what os.register_at_fork runs in the child
        assert gc.isenabled() and not state.count and state.lock is not lock
    finally:
        state.count, state.disabled = 1, False  # the parent's pause, as if never forked
        paused.end()


def _burst(jobs: int) -> tuple[FakeClock, Scheduler, list[bool]]:
    """A scheduler with ``jobs`` jobs due at one slot, whose handlers note whether automatic
    collection is on when they start."""
    clock = FakeClock(START)
    collecting: list[bool] = []

    async def work(ctx: RunContext) -> None:
        collecting.append(gc.isenabled())

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)
    for n in range(jobs):
        scheduler.add(f"j{n}", "0 * * * *", work, jitter_ms=0, catch_up="none")
    return clock, scheduler, collecting


async def test_a_burst_starts_its_runs_without_automatic_collection_and_gives_it_back() -> None:
    clock, scheduler, collecting = _burst(CLAIM_PART * 2 + 1)
    async with scheduler:
        await clock.advance(60 * MINUTE + 1_000, step_ms=MINUTE // 2)
        assert len(collecting) == CLAIM_PART * 2 + 1
        assert not any(collecting)
        assert gc.isenabled()
        assert scheduler.metrics()["runs_succeeded"] == CLAIM_PART * 2 + 1


async def test_slots_claimed_in_one_part_leave_the_collector_alone() -> None:
    clock, scheduler, collecting = _burst(CLAIM_PART)
    async with scheduler:
        await clock.advance(60 * MINUTE + 1_000, step_ms=MINUTE // 2)
    assert len(collecting) == CLAIM_PART and all(collecting)
