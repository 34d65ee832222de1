"""A catch-up slot claimed while another instance's live slot of the same job wins: on every lease
backend the job's ``overlap`` holds, however the two claims interleave.

The catch-up of a missed slot waits until no run of the job is going, then claims. Another
instance's live slot may win between the wait's last look and that claim. The claim used to
allow overlap after the wait, so the missed slot ran beside the live run of a job that asked
for ``overlap="skip"``. The test holds the catch-up claim in flight (a gate on the instance's
``claim``) until the other instance has won its live slot, then lets it go: the claim is
decided by the backend, in its atomic step, with the live run holding its lease. No sleeps: the
interleaving is forced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from anarchon import Overlap, RunContext, RunStatus, Scheduler, SkipCause, Trigger
from anarchon.backend import ClaimOutcome, ClaimRequest, ClaimStatus, LeaseBackend
from tests.harness import Harness, Namespace
from tests.records import claim_request

MINUTE_MS = 60_000


def _gate(scheduler: Scheduler) -> tuple[asyncio.Event, asyncio.Event, list[ClaimOutcome]]:
    """Hold ``scheduler``'s catch-up claims until the second event is set: (sent, go, their
    outcomes). Every other claim goes through at once."""
    backend = scheduler.backend
    real = backend.claim
    sent, go = asyncio.Event(), asyncio.Event()
    outcomes: list[ClaimOutcome] = []

    async def claim(requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        if not any(r.trigger is Trigger.CATCH_UP for r in requests):
            return await real(requests)
        sent.set()
        await go.wait()
        answers = await real(requests)
        outcomes.extend(answers)
        return answers

    backend.claim = claim  # type: ignore[method-assign]
    return sent, go, outcomes


async def test_a_catch_up_slot_never_runs_beside_a_live_run_that_won_during_its_claim(
    lease_harness: Harness, ns: Namespace
) -> None:
    other = ns.make()  # the other instance, whose live slot wins during the catch-up's claim
    await other.start()
    assert isinstance(other, LeaseBackend)
    started: list[Trigger] = []

    async def handler(ctx: RunContext) -> None:
        started.append(ctx.trigger)

    try:
        now = await other.server_time_ms() or int(time.time() * 1000)
        this_minute = now - now % MINUTE_MS
        # History: the slot five minutes ago ran; the four after it were missed.
        seed = _request("tick", this_minute - 5 * MINUTE_MS, "seed")
        [seeded] = await other.claim([seed])
        assert seeded.ticket is not None
        await other.finish(seeded.ticket, RunStatus.SUCCEEDED, None)

        scheduler = Scheduler(ns.make(), instance_id="catching-up")
        sent, go, outcomes = _gate(scheduler)
        scheduler.add("tick", "* * * * *", handler)  # every option at its default
        async with scheduler:
            await asyncio.wait_for(sent.wait(), 20)  # the catch-up claim is on its way
            # Meanwhile the other instance wins a live slot (a later one than any this instance
            # catches up, should a minute begin meanwhile), overlap "skip" as the job's
            # default, and its run holds its lease.
            live = _request("tick", this_minute + 2 * MINUTE_MS, "other")
            [won] = await other.claim([live])
            assert won.status is ClaimStatus.WON, won
            go.set()
            await _until(lambda: bool(outcomes), "the catch-up claim's answer")
            [caught] = outcomes
            history = await other.history("tick", limit=20)
            assert won.ticket is not None
            await other.finish(won.ticket, RunStatus.SUCCEEDED, None)
    finally:
        await other.stop()

    assert caught.run.trigger is Trigger.CATCH_UP
    assert caught.run.slot_ms == this_minute or caught.run.slot_ms == this_minute + MINUTE_MS, (
        caught.run
    )
    assert caught.status is ClaimStatus.SKIPPED, (
        f"the catch-up slot ran beside the other instance's live run ({caught.status}): "
        f"{caught.run}"
    )
    assert caught.run.skip_cause is SkipCause.OVERLAP, caught.run
    assert live.run_id in (caught.run.reason or ""), caught.run.reason
    [record] = [r for r in history if r.trigger is Trigger.CATCH_UP]
    assert record.status is RunStatus.SKIPPED, record
    assert Trigger.CATCH_UP not in started, started


def _request(job: str, slot: int, instance: str) -> ClaimRequest:
    """A live slot's claim as an instance sends it, every option at its default."""
    return replace(claim_request(job, slot, instance, lease_ms=15_000), overlap=Overlap.SKIP)


async def _until(predicate: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    """Wait (polling the loop, not the clock) until ``predicate()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
