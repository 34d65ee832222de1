"""Two prefixes on one stream: JetStream de-duplicates message ids across the whole stream, so
a job of the same name under two prefixes must not lose its slots to the other prefix's claims,
and an instance of an older version (claim id ``<job>:<slot>`` only) and a newer one never both
win a slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from anarchon import RunStatus
from anarchon.backend import ClaimNotice, ClaimStatus
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats._records import encode_claim
from tests.nats.servers import connect, delete_stream, read_subject
from tests.nats.test_claims import SLOT, request

Make = Callable[..., Any]


async def old_claim(url: str, stream: str, prefix: str, instance: str) -> tuple[str, bool]:
    """Publish a claim of ``sync`` at SLOT as an older version does (id ``sync:<slot>``, the same
    payload): its run id, and whether JetStream answered it a duplicate."""
    req = request(instance=instance)
    nc = await connect(url)
    try:
        ack = await nc.jetstream().publish(
            f"{prefix}sync.claims",
            encode_claim(req),
            stream=stream,
            headers={"Nats-Msg-Id": f"sync:{SLOT}"},
        )
    finally:
        await nc.close()
    return req.run_id, bool(ack.duplicate)


async def listen(backend: NatsBackend) -> list[ClaimNotice]:
    heard: list[ClaimNotice] = []

    def on_claims(notices: Sequence[ClaimNotice]) -> None:
        heard.extend(notices)

    await backend.subscribe_claims(on_claims)
    return heard


async def two_apps(make: Make, prefix: str) -> tuple[NatsBackend, NatsBackend, str]:
    """A backend under ``prefix`` and one under another prefix, on the same stream."""
    other = f"o{prefix}"
    return await make(), await make(prefix=other), other


async def test_two_prefixes_on_one_stream_both_run_their_slot(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    a, b, other = await two_apps(make, prefix)
    b2: NatsBackend = await make(prefix=other)
    heard_a, heard_b = await listen(a), await listen(b2)
    [won_a] = await a.claim([request(instance="a1")])
    assert won_a.status is ClaimStatus.WON and won_a.ticket is not None
    # An older instance of the other prefix loses that slot (its id is taken), runs nothing.
    _, duplicate = await old_claim(server_url, stream, other, "b-old")
    assert duplicate
    await asyncio.sleep(0.5)  # a's notice reached b2, had it been sent where b2 listens
    [won_b] = await b.claim([request(instance="b1")])
    assert won_b.status is ClaimStatus.WON and won_b.ticket is not None
    [lost_b] = await b2.claim([request(instance="b2")])
    assert lost_b.status is ClaimStatus.LOST
    assert lost_b.run.run_id != won_a.run.run_id  # b1's win (heard or read), not a's run
    ran_a = await a.finish(won_a.ticket, RunStatus.SUCCEEDED, None)
    ran_b = await b.finish(won_b.ticket, RunStatus.SUCCEEDED, None)
    assert ran_a.status is RunStatus.SUCCEEDED and ran_b.status is RunStatus.SUCCEEDED
    [run_a] = await a.history("sync")
    [run_b] = await b.history("sync")
    assert (run_a.run_id, run_a.status) == (won_a.run.run_id, RunStatus.SUCCEEDED)
    assert (run_b.run_id, run_b.status) == (won_b.run.run_id, RunStatus.SUCCEEDED)
    await asyncio.sleep(0.5)
    assert [n.instance for n in heard_a] == ["a1"]
    assert [n.instance for n in heard_b] == ["b1"]


async def test_an_older_instance_holding_the_slot_wins_it_alone(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    a, b, other = await two_apps(make, prefix)
    # An older instance of prefix `other` wins the slot first, under `sync:<slot>`.
    old_run, duplicate = await old_claim(server_url, stream, other, "b-old")
    assert not duplicate
    # A newer instance of the same prefix loses to it: never both.
    [lost] = await b.claim([request(instance="b1")])
    assert lost.status is ClaimStatus.LOST and lost.run.run_id == old_run
    # The other prefix's slot still runs, under its own id.
    [won] = await a.claim([request(instance="a1")])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    [again] = await b.claim([request(instance="b2")])
    assert again.status is ClaimStatus.LOST and again.run.run_id == old_run
    claims = await read_subject(server_url, stream, f"{other}sync.claims")
    assert len(claims) == 1


async def test_a_newer_winner_is_a_duplicate_for_an_older_instance(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    a, b, _ = await two_apps(make, prefix)
    await b.claim([request(instance="b1")])  # another prefix holds `sync:<slot>`
    [won] = await a.claim([request(instance="a1")])
    assert won.status is ClaimStatus.WON
    # An older instance of a's prefix publishes `sync:<slot>`: a duplicate of b's claim, so it
    # reads b's claim, not its own token, and runs nothing.
    _, duplicate = await old_claim(server_url, stream, prefix, "a-old")
    assert duplicate
    [lost] = await (await make()).claim([request(instance="a2")])
    assert lost.status is ClaimStatus.LOST and lost.run.run_id == won.run.run_id


async def test_defaults_share_the_stream_with_another_prefix(server_url: str, version: str) -> None:
    if version != "current":
        pytest.skip("the default stream CRON is made on this session's private server only")
    first = NatsBackend(server_url)  # stream CRON, prefix cron., every option at its default
    second = NatsBackend(server_url, prefix="billing.")
    await first.start()
    await second.start()
    try:
        heard = await listen(second)
        [won] = await first.claim([request(instance="i1")])
        assert won.status is ClaimStatus.WON
        await asyncio.sleep(0.5)
        [also] = await second.claim([request(instance="i2")])
        assert also.status is ClaimStatus.WON and also.ticket is not None
        for _ in range(50):  # the notice of its own win arrives, and no other
            if heard:
                break
            await asyncio.sleep(0.1)
        assert [n.instance for n in heard] == ["i2"]
        done = await second.finish(also.ticket, RunStatus.SUCCEEDED, None)
        assert done.status is RunStatus.SUCCEEDED
    finally:
        await first.stop()
        await second.stop()
        await delete_stream(server_url, "CRON")
