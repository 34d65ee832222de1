"""A stop asked while the scheduler still starts cancels the start (``serve()``, so ``run()``
and ``anarchon run``). Before, the stop waited for the start to end: up to the backend's
connect timeout (5 s by default), or for ever for a start that never ends, and a start that
then succeeded began claiming only to be stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from anarchon import MemoryBackend, Scheduler
from anarchon.backend import ClaimListener, ClaimOutcome, ClaimRequest
from anarchon.errors import BackendError

STAGES = ("backend_start", "subscribe_claims")


class _Stuck(MemoryBackend):
    """A MemoryBackend whose ``stage`` of the start waits until cancelled (a backend that
    accepts the connection and never answers); counts claims and stops."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.waiting = asyncio.Event()
        self.cancelled = False
        self.stops = 0
        self.claims = 0

    async def _hang(self) -> None:
        self.waiting.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def start(self) -> None:
        await super().start()
        if self.stage == "backend_start":
            await self._hang()

    async def subscribe_claims(self, on_claims: ClaimListener) -> bool:
        heard = await super().subscribe_claims(on_claims)
        if self.stage == "subscribe_claims":
            await self._hang()
        return heard

    async def stop(self) -> None:
        self.stops += 1
        await super().stop()

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        self.claims += len(requests)
        return await super().claim(requests)


@pytest.mark.parametrize("stage", STAGES)
async def test_a_stop_during_the_start_cancels_it_and_leaves_nothing(
    stage: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Every option at its default; a job due every second, so a start that went on would claim.
    backend = _Stuck(stage)
    scheduler = Scheduler(backend)
    scheduler.add("tick", "* * * * * *", lambda ctx: None)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="anarchon")
    serving = asyncio.create_task(scheduler.serve(stop))
    await asyncio.wait_for(backend.waiting.wait(), 30)
    stop.set()
    await asyncio.wait_for(serving, 10)  # before: waited for the start, for ever here
    assert backend.cancelled and not scheduler.running
    # The backend is stopped (by the scheduler and its lease keeper, which shares it) if the
    # start had got past it, undone with the rest; not if its own start was cancelled.
    assert (backend.stops > 0) is (stage != "backend_start"), backend.stops
    await asyncio.sleep(2.5)  # two slots of 'tick' come due: nothing claims them
    assert backend.claims == 0
    assert await backend.registry().instances() == []
    assert await backend.history("tick") == []
    cancelled = [r for r in caplog.records if getattr(r, "action", None) == "start_cancelled"]
    assert len(cancelled) == 1 and cancelled[0].levelno == logging.WARNING, caplog.text
    assert not any(getattr(r, "action", None) == "started" for r in caplog.records), caplog.text


async def test_a_start_that_ends_first_is_stopped_as_usual(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The stop comes once the start is over: no cancellation, the usual stop.
    backend = _Stuck("none")
    scheduler = Scheduler(backend)
    scheduler.add("tick", "* * * * * *", lambda ctx: None)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="anarchon")
    serving = asyncio.create_task(scheduler.serve(stop))
    for _ in range(300):
        if scheduler.running:
            break
        await asyncio.sleep(0.1)
    assert scheduler.running
    stop.set()
    await asyncio.wait_for(serving, 60)
    assert not backend.cancelled and backend.stops > 0
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "started" in actions and "stopped" in actions and "start_cancelled" not in actions


class _Unreachable(MemoryBackend):
    """A MemoryBackend whose start fails, as an unreachable server's does."""

    async def start(self) -> None:
        raise BackendError("connection refused (test)")


def _state(scheduler: Scheduler) -> str:
    """Its state, read anew (mypy would keep what an earlier assert narrowed it to)."""
    return scheduler.state


@pytest.mark.parametrize("stage", STAGES)
async def test_state_says_starting_until_the_start_has_ended(stage: str) -> None:
    # `anarchon run --metrics-linger` reads it (not the scheduler's private attributes) to
    # tell a stop that cancelled the start from one after it. `running` is already True in
    # the last part of the start (subscribe_claims); `state` is "starting" until it ends.
    backend = _Stuck(stage)
    scheduler = Scheduler(backend)
    scheduler.add("tick", "* * * * * *", lambda ctx: None)
    assert _state(scheduler) == "new"
    stop = asyncio.Event()
    serving = asyncio.create_task(scheduler.serve(stop))
    await asyncio.wait_for(backend.waiting.wait(), 30)
    assert _state(scheduler) == "starting"
    assert scheduler.running is (stage == "subscribe_claims")
    stop.set()
    await asyncio.wait_for(serving, 10)
    assert _state(scheduler) == "stopped"


async def test_state_follows_the_life_of_a_scheduler() -> None:
    # Every option at its default.
    scheduler = Scheduler(MemoryBackend())
    scheduler.add("tick", "* * * * * *", lambda ctx: None)
    assert _state(scheduler) == "new" and not scheduler.running
    await scheduler.start()
    assert _state(scheduler) == "running" and scheduler.running
    stopping = asyncio.create_task(scheduler.stop())
    await asyncio.sleep(0)  # the stop has begun
    assert _state(scheduler) == "stopping" and not scheduler.running
    await asyncio.wait_for(stopping, 60)
    assert _state(scheduler) == "stopped"
    # A start whose backend cannot be reached changed nothing: "new", it may be tried again.
    failed = Scheduler(_Unreachable())
    with pytest.raises(BackendError):
        await failed.start()
    assert _state(failed) == "new"
