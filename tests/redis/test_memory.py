"""Redis under maxmemory with noeviction: every change is refused alike (issue 11, defect 3).

Before, take_over.lua wrote first with ZREM (not a deny-OOM command), so Redis let the whole
script through while memory was full: backups took runs over (the handler ran again each time
a lease expired) while runners could not renew nor record results."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from anarchon import BackendUnavailable, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus, TakeoverRequest, TakeoverStatus
from anarchon.backends.redis import RedisBackend
from tests.redis.servers import RedisServer

SLOT = 1_800_000_000_000
LEASE_MS = 600


def claim(slot: int) -> ClaimRequest:
    return ClaimRequest(
        job="job",
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="runner",
        trigger=Trigger.SCHEDULE,
        lease_ms=LEASE_MS,
    )


def takeover(slot_key: str) -> TakeoverRequest:
    return TakeoverRequest(
        job="job",
        slot_key=slot_key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="backup",
        lease_ms=LEASE_MS,
        max_attempts=3,
    )


async def fill(server: RedisServer) -> None:
    """Fill memory past a limit set just below what Redis now uses."""
    from redis.asyncio import Redis

    client = Redis.from_url(server.url)
    try:
        await client.config_set("maxmemory-policy", "noeviction")
        for n in range(64):
            await client.set(f"ballast:{n}", b"x" * 16_384)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", str(used - 256 * 1024))
    finally:
        await client.aclose()


async def relieve(server: RedisServer) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(server.url)
    try:
        await client.config_set("maxmemory", "0")
    finally:
        await client.aclose()


async def test_a_full_redis_refuses_every_change_alike(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon.backends.redis")
    backend = RedisBackend(own_server.url, prefix="oom:")
    await backend.start()
    try:
        [held, done] = await backend.claim([claim(SLOT), claim(SLOT + 1000)])
        assert held.ticket is not None and done.ticket is not None
        await fill(own_server)
        await asyncio.sleep(LEASE_MS / 1000 + 0.3)  # held's lease expires while memory is full
        with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
            await backend.take_over(takeover(held.ticket.slot_key))
        with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
            await backend.renew(held.ticket)
        with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
            await backend.finish(done.ticket, RunStatus.SUCCEEDED, None)
        with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
            await backend.release(done.ticket, "handed over")
        with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
            await backend.claim([claim(SLOT + 2000)])
        [run] = [r for r in await backend.history("job") if r.slot_ms == SLOT]
        assert run.attempt == 1 and run.status is RunStatus.RUNNING, "taken over while full"
        await relieve(own_server)
        taken = await backend.take_over(takeover(held.ticket.slot_key))
        assert taken.status is TakeoverStatus.TAKEN
        finished = await backend.finish(done.ticket, RunStatus.SUCCEEDED, None)
        assert finished.status is RunStatus.SUCCEEDED
        [won] = await backend.claim([claim(SLOT + 2000)])
        assert won.status is ClaimStatus.WON
    finally:
        await backend.stop()
    # Refusals are answers: the log shows no outage (that is for a Redis that does not answer).
    assert not [r for r in caplog.records if getattr(r, "action", "").startswith("backend_")]
