"""The in-memory backend's overlap check (``overlap='skip'``) through a job's life: it names
the running attempt whatever the job's history holds, follows a takeover to the new attempt,
and lets the job run again once that attempt has ended."""

from __future__ import annotations

from anarchon import Overlap, RunStatus
from anarchon.backend import ClaimRequest, ClaimStatus, FinishRequest, TakeoverStatus
from anarchon.testing import FakeClock, MemoryBackend
from anarchon.testing.contract import SLOT, request, takeover

MINUTE = 60_000


def skipping(slot: int) -> ClaimRequest:
    """A claim of ``slot`` with a minute's lease that skips while the job runs."""
    return request(slot=slot, lease_ms=MINUTE, overlap=Overlap.SKIP)


async def test_the_overlap_holder_is_the_running_attempt_among_many_recorded() -> None:
    clock = FakeClock(SLOT)
    backend = MemoryBackend(clock=clock)
    for n in range(50):  # a recorded history: every attempt ended
        [won] = await backend.claim([request(slot=SLOT + n * MINUTE, lease_ms=MINUTE)])
        assert won.ticket is not None
        await backend.finish_many([FinishRequest(won.ticket, RunStatus.SUCCEEDED, None)])
    [free] = await backend.claim([skipping(SLOT + 50 * MINUTE)])
    assert free.status is ClaimStatus.WON, "an ended attempt was taken for a live holder"
    assert free.ticket is not None

    [skip] = await backend.claim([skipping(SLOT + 51 * MINUTE)])
    assert skip.status is ClaimStatus.SKIPPED and skip.run.reason is not None
    assert free.run.run_id in skip.run.reason, skip.run.reason

    # Its lease runs out; a backup takes the run over: the new attempt is the holder now.
    await clock.advance(2 * MINUTE)
    taken = await backend.take_over(takeover("job", free.ticket.slot_key, lease_ms=MINUTE))
    assert taken.status is TakeoverStatus.TAKEN and taken.ticket is not None
    [skip] = await backend.claim([skipping(SLOT + 52 * MINUTE)])
    assert skip.status is ClaimStatus.SKIPPED and skip.run.reason is not None
    assert taken.ticket.run_id in skip.run.reason, skip.run.reason

    # The new attempt ends: nothing of the job runs any more.
    await backend.finish_many([FinishRequest(taken.ticket, RunStatus.SUCCEEDED, None)])
    [again] = await backend.claim([skipping(SLOT + 53 * MINUTE)])
    assert again.status is ClaimStatus.WON


async def test_an_expired_or_released_attempt_holds_nothing() -> None:
    clock = FakeClock(SLOT)
    backend = MemoryBackend(clock=clock)
    [first] = await backend.claim([request(lease_ms=MINUTE)])
    assert first.ticket is not None
    await clock.advance(2 * MINUTE)  # its lease ran out, nobody took it over
    [second] = await backend.claim([skipping(SLOT + MINUTE)])
    assert second.status is ClaimStatus.WON and second.ticket is not None
    await backend.release(second.ticket, "handed over")
    [third] = await backend.claim([skipping(SLOT + 2 * MINUTE)])
    assert third.status is ClaimStatus.WON
