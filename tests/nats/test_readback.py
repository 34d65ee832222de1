"""The read-back of losing claims from the claims feed (``_readback``) on real servers: the stored
claim a duplicate ack points at comes from the feed once it runs, with the same answers as a read
by sequence, and by sequence again whenever the feed cannot give it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from anarchon import RunStatus
from anarchon.backend import ClaimOutcome, ClaimStatus
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats import _records as records
from anarchon.backends.nats import _timings as timings
from tests.nats.servers import connect
from tests.nats.test_claims import SLOT, Make, _count_reads, request, store_unheard


async def _feeding(backend: NatsBackend) -> None:
    """Wait until the backend's claims feed runs (it starts on its first duplicate ack)."""
    for _ in range(100):
        if backend._claims._readback.running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the claims feed did not start")


async def _lose_one(winner: NatsBackend, loser: NatsBackend, slot: int) -> ClaimOutcome:
    [won] = await winner.claim([request(slot=slot)])
    assert won.status is ClaimStatus.WON
    [lost] = await loser.claim([request(slot=slot, instance="i2")])
    return lost


async def _consumers(url: str, stream: str) -> list[str]:
    nc = await connect(url)
    try:
        return [c.name for c in await nc.jetstream().consumers_info(stream)]
    finally:
        await nc.close()


async def test_duplicates_are_read_from_the_feed_once_it_runs(make: Make) -> None:
    winner: NatsBackend = await make()
    loser: NatsBackend = await make()
    reads = _count_reads(loser)
    first = await _lose_one(winner, loser, SLOT)
    assert first.status is ClaimStatus.LOST and first.run.instance == "i1"
    assert len(reads) == 1, "the first duplicate is read by sequence; the feed starts then"
    await _feeding(loser)
    slots = [SLOT + n * 1000 for n in range(1, 51)]
    won = await winner.claim([request(slot=s) for s in slots])
    lost = await loser.claim([request(slot=s, instance="i2") for s in slots])
    for w, lo in zip(won, lost, strict=True):
        assert w.status is ClaimStatus.WON and w.ticket is not None
        assert lo.status is ClaimStatus.LOST and lo.ticket is None
        assert lo.run.run_id == w.run.run_id and lo.run.instance == "i1"
        assert lo.run.fence == w.ticket.fence and lo.run.status is RunStatus.RUNNING
    assert len(reads) == 1, "every later duplicate was settled from the feed, not by a request"


async def test_our_own_stored_claim_is_recognised_through_the_feed(
    make: Make, server_url: str
) -> None:
    """The seed's reason for the read-back, with the feed running: a publish of ours that was
    stored while its ack was lost is ours when the retry's duplicate ack comes back."""
    winner: NatsBackend = await make()
    backend: NatsBackend = await make()
    await _lose_one(winner, backend, SLOT)
    await _feeding(backend)
    mine = request(slot=SLOT + 1000, instance="i2")
    seq = await store_unheard(server_url, backend, mine)
    reads = _count_reads(backend)
    [retried] = await backend.claim([mine])
    assert retried.status is ClaimStatus.WON and retried.ticket is not None
    assert retried.ticket.fence == seq and retried.ticket.token == mine.token
    [other] = await winner.claim([request(slot=SLOT + 1000)])
    assert other.status is ClaimStatus.LOST and other.run.instance == "i2"
    assert reads == [], "read from the feed"


async def test_a_feed_that_stopped_delivering_falls_back_to_reads_by_sequence(
    make: Make, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timings, "FEED_RESTART_S", 0.0)
    winner: NatsBackend = await make()
    loser: NatsBackend = await make()
    await _lose_one(winner, loser, SLOT)
    await _feeding(loser)
    [consumer] = await _consumers(server_url, loser.stream)
    nc = await connect(server_url)
    try:
        await nc.jetstream().delete_consumer(loser.stream, consumer)
    finally:
        await nc.close()
    reads = _count_reads(loser)
    lost = await _lose_one(winner, loser, SLOT + 1000)
    assert lost.status is ClaimStatus.LOST and lost.run.instance == "i1"
    assert len(reads) == 1, "not delivered in time: read by sequence"
    for _ in range(100):  # and the feed is started again
        if await _consumers(server_url, loser.stream):
            break
        await asyncio.sleep(0.05)
    await _feeding(loser)
    lost = await _lose_one(winner, loser, SLOT + 2000)
    assert lost.status is ClaimStatus.LOST and lost.run.instance == "i1"


async def test_the_feed_stops_when_idle_and_on_stop_and_leaves_no_consumer(
    make: Make, server_url: str, names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, prefix = names
    nc = await connect(server_url)
    try:
        winner: NatsBackend = await make()
        mine = NatsBackend(connection=nc, stream=stream, prefix=prefix)
        await mine.start()
        await _lose_one(winner, mine, SLOT)
        await _feeding(mine)
        assert len(await _consumers(server_url, stream)) == 1
        await mine._claims._readback.upkeep()
        assert mine._claims._readback.running, "still in use"
        monkeypatch.setattr(timings, "FEED_IDLE_S", 0.0)
        await mine._claims._readback.upkeep()
        assert not mine._claims._readback.running
        assert await _consumers(server_url, stream) == []
        await _lose_one(winner, mine, SLOT + 1000)  # starts it again
        await _feeding(mine)
        await mine.stop()
        assert await _consumers(server_url, stream) == [], "stop() deletes the feed's consumer"
        assert nc.is_connected, "and leaves your connection open"
    finally:
        await nc.close()


async def test_a_delivered_claim_of_another_id_is_read_by_sequence(make: Make) -> None:
    """A feed message under the duplicate's sequence but of another slot (a stream deleted and
    made again under its name numbers anew) is not trusted: the claim is read by sequence."""
    winner: NatsBackend = await make()
    loser: NatsBackend = await make()
    await _lose_one(winner, loser, SLOT)
    await _feeding(loser)
    feed = loser._claims._readback
    real = feed.wait
    stale = records.Stored(
        seq=0, subject="x", time_ms=0, data=records.encode_claim(request(slot=SLOT - 1000))
    )

    async def stale_wait(seq: int) -> Any:
        await real(seq)
        return stale

    real_take = feed.take

    def stale_take(seq: int) -> Any:  # delivered already, or wait() waits for it
        return stale if real_take(seq) is not None else None

    feed.wait = stale_wait  # type: ignore[method-assign]
    feed.take = stale_take  # type: ignore[method-assign]
    reads = _count_reads(loser)
    lost = await _lose_one(winner, loser, SLOT + 1000)
    assert lost.status is ClaimStatus.LOST and lost.run.slot is not None
    assert lost.run.slot.timestamp() * 1000 == SLOT + 1000, "the stored claim, not the stale one"
    assert len(reads) == 1


async def test_a_claim_the_feed_delivered_already_is_taken_without_waiting(make: Make) -> None:
    """A duplicate ack whose stored claim the feed delivered before it came (the usual order in
    a race: the winner's claim is stored, and delivered, before the losers' publishes arrive)
    is settled from what was delivered, with no wait on the feed (``take``, no ``wait``)."""
    winner: NatsBackend = await make()
    loser: NatsBackend = await make()
    await _lose_one(winner, loser, SLOT)
    await _feeding(loser)
    feed = loser._claims._readback
    [won] = await winner.claim([request(slot=SLOT + 1000)])
    assert won.ticket is not None and won.ticket.fence is not None
    for _ in range(200):  # delivered to the loser's feed
        if feed._last >= won.ticket.fence:
            break
        await asyncio.sleep(0.01)
    waited: list[int] = []
    real = feed.wait

    async def counted(seq: int) -> Any:
        waited.append(seq)
        return await real(seq)

    feed.wait = counted  # type: ignore[method-assign]
    [lost] = await loser.claim([request(slot=SLOT + 1000, instance="i2")])
    assert lost.status is ClaimStatus.LOST and lost.run.run_id == won.run.run_id
    assert waited == []


async def test_the_feed_does_not_keep_this_instances_own_first_ack_wins(make: Make) -> None:
    """Only duplicate acks are read back, so the feed keeps other instances' claims for them,
    not this instance's own wins on their ack: those once filled its places in a burst (then
    4 096, under a second at 3 x 5 000 every-second jobs) and sent most reads by sequence."""
    other: NatsBackend = await make()
    mine: NatsBackend = await make()
    first = await _lose_one(other, mine, SLOT)  # a duplicate: this instance's feed starts
    assert first.status is ClaimStatus.LOST
    await _feeding(mine)
    slots = [SLOT + n * 1000 for n in range(1, 101)]
    won = await mine.claim([request(slot=s, instance="i2") for s in slots])
    fences = {o.ticket.fence for o in won if o.ticket is not None and o.ticket.fence is not None}
    assert len(fences) == len(slots)
    feed = mine._claims._readback
    for _ in range(100):
        if feed._last >= max(fences):
            break
        await asyncio.sleep(0.05)
    assert feed._last >= max(fences), "the feed did not deliver the wins"
    assert not fences & set(feed._kept), "own wins kept"
    [theirs] = await other.claim([request(slot=SLOT + 200_000)])
    assert theirs.ticket is not None and theirs.ticket.fence is not None
    for _ in range(100):
        if theirs.ticket.fence in feed._kept:
            break
        await asyncio.sleep(0.05)
    assert theirs.ticket.fence in feed._kept, "another instance's claim is kept for a read"
