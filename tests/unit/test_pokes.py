"""The backend's release and finish notices reach the backup watcher only when it watches a run
(a burst's every result is one notice: posting each to the loop for nothing costs objects)."""

from __future__ import annotations

from typing import Any

import pytest

from anarchon import RunContext, Scheduler, Trigger
from anarchon._keeper import Mailbox
from anarchon._watcher import BackupWatcher
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START, until


def _count_pokes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Record every poke posted to a mailbox."""
    pokes: list[tuple[Any, ...]] = []
    post = Mailbox.post

    def counting(self: Mailbox, fn: Any, *args: Any) -> None:
        if getattr(fn, "__func__", None) is BackupWatcher.poke:
            pokes.append(args)
        post(self, fn, *args)

    monkeypatch.setattr(Mailbox, "post", counting)
    return pokes


async def test_a_run_nobody_watches_posts_no_poke(monkeypatch: pytest.MonkeyPatch) -> None:
    pokes = _count_pokes(monkeypatch)
    clock = FakeClock(START)
    ran: list[int] = []

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.attempt)

    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock, instance_id="alone")
    scheduler.add("work", "0 * * * *", work)
    async with scheduler:
        await clock.advance(60 * MINUTE + 5_000)
        await until(lambda: ran == [1], 5, "the run")
    assert ran == [1]
    assert pokes == [], "a finished run nobody watched was posted to the loop"


async def test_a_watched_run_that_is_released_is_taken_over_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pokes = _count_pokes(monkeypatch)
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    slot = START + 60 * MINUTE
    ran: list[str] = []

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.instance)

    backup = Scheduler(backend, clock=clock, instance_id="backup")
    backup.add("work", "0 * * * *", work, jitter_ms=0)
    async with backup:
        await clock.advance(60 * MINUTE - 1_000)
        # Another instance wins the slot with a lease of a minute; the backup's claim loses.
        [won] = await backend.claim(
            [
                ClaimRequest(
                    job="work",
                    slot=slot,
                    run_id="other-run",
                    token="other-token",
                    instance="other",
                    trigger=Trigger.SCHEDULE,
                    lease_ms=60_000,
                )
            ]
        )
        assert won.status is ClaimStatus.WON and won.ticket is not None
        await clock.advance(1_100)
        assert ran == []
        await backend.release(won.ticket, "handed over")
        await clock.advance(1_000)  # far less than the lease's minute
        await until(lambda: ran == ["backup"], 5, "the takeover")
    assert pokes == [("work", str(slot), True)]
