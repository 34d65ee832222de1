"""Pauses and run requests on the real shared server (one prefix per test): the claim script's
pause check, the exact reason, the keys, takeovers keeping ``requested_by``."""

from __future__ import annotations

import asyncio
import json

import pytest

from anarchon import RunStatus, Trigger
from anarchon.backend import ClaimStatus, TakeoverStatus
from anarchon.control import ALL_JOBS, Pause, RunRequest, paused_reason
from tests.backends.redis import SERVER
from tests.redis.conftest import Make
from tests.redis.test_scripts import SLOT, claim_request, takeover_request

# Until-times whose ISO text is awkward: whole seconds, milliseconds, leap days, far years.
UNTILS = (
    4_102_444_800_000,  # 2100-01-01T00:00:00+00:00
    4_102_444_800_123,
    1_835_395_200_007,  # 2028-02-29
    253_402_300_799_999,  # 9999-12-31T23:59:59.999
)


async def _keys(prefix: str) -> list[bytes]:
    from redis.asyncio import Redis

    client = Redis.from_url(SERVER)
    try:
        return [key async for key in client.scan_iter(match=f"{prefix}{{*")]
    finally:
        await client.aclose()


async def test_reads_of_a_store_never_written_create_nothing(make: Make, prefix: str) -> None:
    store = (await make()).control()
    assert await store.pauses() == []
    assert await store.requests() == []
    assert await store.requests(["job"]) == []
    assert await store.resume("job") is None
    await store.done("nothing")
    assert await _keys(prefix) == []


@pytest.mark.parametrize("until", UNTILS)
@pytest.mark.parametrize("job", ["job", ALL_JOBS])
async def test_the_reason_is_paused_reason_exactly(make: Make, job: str, until: int) -> None:
    backend = await make()
    now = await backend.server_time_ms()
    assert now is not None
    pause = Pause(job=job, by="alice@web-1", at_ms=now, until_ms=until)
    await backend.control().pause(pause)
    [held] = await backend.claim([claim_request(trigger=Trigger.RETRY, requested_by="r")])
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)
    assert held.run.requested_by == "r"
    [stored] = await backend.history("job")
    assert (stored.status, stored.reason) == (RunStatus.SKIPPED, paused_reason(pause))


@pytest.mark.parametrize("until", [None, *UNTILS])
async def test_a_pause_stored_without_its_reason_is_rendered_by_the_script(
    make: Make, until: int | None
) -> None:
    """A pause written by hand (no ``reason`` field) still records paused_reason's text."""
    from redis.asyncio import Redis

    backend = await make()
    pause = Pause(job=ALL_JOBS, by="ops", at_ms=1, until_ms=until)
    client = Redis.from_url(SERVER)
    try:
        await client.hset(backend._keys.control.pauses, ALL_JOBS, pause.to_json())
    finally:
        await client.aclose()
    assert await backend.control().pauses() == [pause]
    [held] = await backend.claim([claim_request()])
    assert held.run.reason == paused_reason(pause)


async def test_the_job_pause_wins_over_the_cluster_pause_and_ends_on_redis_clock(
    make: Make,
) -> None:
    backend = await make()
    store = backend.control()
    now = await backend.server_time_ms()
    assert now is not None
    await store.pause(Pause(job=ALL_JOBS, by="everyone", at_ms=now))
    own = Pause(job="job", by="me", at_ms=now)
    await store.pause(own)
    [held] = await backend.claim([claim_request()])
    assert held.run.reason == paused_reason(own)
    # An expired pause of the job gives way to the cluster pause.
    await store.pause(Pause(job="job", by="me", at_ms=now - 10, until_ms=now - 5))
    [held] = await backend.claim([claim_request(slot=SLOT + 1000)])
    assert held.run.reason == "paused by everyone (all jobs)"
    await store.resume(ALL_JOBS)
    # Ends at until_ms on Redis's clock: moved past it by the test-only offset.
    await store.pause(Pause(job="job", by="me", at_ms=now, until_ms=now + 60_000))
    [held] = await backend.claim([claim_request(slot=SLOT + 2000)])
    assert held.status is ClaimStatus.SKIPPED
    backend._test_clock_offset_ms = 61_000
    [won] = await backend.claim([claim_request(slot=SLOT + 3000)])
    assert won.status is ClaimStatus.WON


async def test_a_skip_reason_and_an_existing_record_come_before_the_pause(make: Make) -> None:
    backend = await make()
    [won] = await backend.claim([claim_request()])
    assert won.status is ClaimStatus.WON
    await backend.control().pause(Pause(job="job", by="ops", at_ms=0))
    [again] = await backend.claim([claim_request()])
    assert again.status is ClaimStatus.LOST and again.run.run_id == won.run.run_id
    [late] = await backend.claim([claim_request(slot=SLOT + 1000, skip_reason="too late: test")])
    assert late.run.reason == "too late: test"


async def test_a_takeover_keeps_who_asked(make: Make) -> None:
    backend = await make()
    [won] = await backend.claim(
        [claim_request(slot=None, key="manual-x", requested_by="alice@ops", lease_ms=100)]
    )
    assert won.ticket is not None and won.run.requested_by == "alice@ops"
    await asyncio.sleep(0.2)
    taken = await backend.take_over(takeover_request("job", "manual-x"))
    assert taken.status is TakeoverStatus.TAKEN and taken.run is not None
    assert taken.run.attempt == 2 and taken.run.requested_by == "alice@ops"
    assert [r.requested_by for r in await backend.history("job")] == ["alice@ops"] * 2


async def test_pauses_and_requests_live_in_two_hashes(make: Make) -> None:
    from redis.asyncio import Redis

    backend = await make()
    store = backend.control()
    request = RunRequest(
        id="a" * 32,
        job="job",
        trigger=Trigger.MANUAL,
        key="manual-" + "a" * 32,
        slot=None,
        due_ms=5,
        requested_by="alice",
        requested_at_ms=5,
    )
    assert await store.request(request) is True
    await store.pause(Pause(job="job", by="ops", at_ms=1, until_ms=2))
    keys = backend._keys.control
    assert keys.pauses == f"{backend.prefix}{{control}}:pauses"
    client = Redis.from_url(SERVER)
    try:
        assert json.loads(await client.hget(keys.requests, request.id)) == json.loads(
            request.to_json()
        )
        stored = json.loads(await client.hget(keys.pauses, "job"))
        assert stored == {
            "job": "job",
            "by": "ops",
            "at_ms": 1,
            "until_ms": 2,
            "reason": paused_reason(Pause(job="job", by="ops", at_ms=1, until_ms=2)),
        }
    finally:
        await client.aclose()


async def test_bad_input_is_refused_by_name(make: Make) -> None:
    store = (await make()).control()
    with pytest.raises(TypeError, match=r"must be an anarchon\.control\.Pause"):
        await store.pause("job")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be an anarchon\.control\.RunRequest"):
        await store.request({"id": "x"})  # type: ignore[arg-type]
