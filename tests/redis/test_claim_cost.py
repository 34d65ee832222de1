"""The claim script's work on the server, counted on a private redis-server (INFO commandstats
counts the commands a script runs as well as the script itself).

A claim is the one call every instance makes for every slot; these budgets keep it short: a
won claim reads the job's META and the pauses in one command each and writes META in one, a
claim that meets a record reads two fields and answers the record as stored, and only a job's
very first claim needs the server's uptime (INFO), which the function library asks once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from anarchon import Overlap, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.redis import RedisBackend
from anarchon.backends.redis._rows import CLAIMS_PER_CALL, claim_arguments
from anarchon.backends.redis._timings import RESTART_MARGIN_MS
from tests.records import claim_request
from tests.redis.servers import RedisServer


def _request(job: str, slot: int, instance: str) -> ClaimRequest:
    # Every option at its default (overlap, history, no skip reason) but the lease.
    return claim_request(job, slot, instance, lease_ms=30_000)


async def _counted(
    client: Redis, backend: RedisBackend, requests: Sequence[ClaimRequest]
) -> tuple[list[Any], dict[str, int]]:
    await client.config_resetstat()
    outcomes = await backend.claim(requests)
    stats = await client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    calls.pop("config|resetstat", None)
    return outcomes, calls


@contextlib.asynccontextmanager
async def _two_instances(
    server: RedisServer,
) -> AsyncIterator[tuple[RedisBackend, RedisBackend, Redis]]:
    """Two started backends on ``server`` and a client of its own for INFO commandstats."""
    backend = RedisBackend(server.url)
    other = RedisBackend(server.url)
    client = Redis.from_url(server.url)
    await backend.start()
    await other.start()
    try:
        yield backend, other, client
    finally:
        await client.aclose()
        await other.stop()
        await backend.stop()


async def test_a_claim_runs_few_commands_and_the_uptime_is_asked_once(
    own_server: RedisServer,
) -> None:
    async with _two_instances(own_server) as (backend, other, client):
        slot = (int(time.time()) + 60) * 1000
        [first], calls = await _counted(client, backend, [_request("cost", slot, "a")])
        assert first.status is ClaimStatus.WON
        assert calls.pop("info") == 1, calls  # the job's first record: its known_from
        # Another job's first record, by another instance: the library knows the uptime.
        [new], calls = await _counted(client, other, [_request("cost2", slot, "b")])
        assert new.status is ClaimStatus.WON and "info" not in calls, calls
        assert calls["hset"] == 3, calls  # known_from written with the record, in one HSET

        [won], calls = await _counted(client, backend, [_request("cost", slot + 1000, "a")])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        assert first.ticket is not None and won.ticket.fence > first.ticket.fence
        # TIME, HGET slots, HMGET meta, HMGET pauses, HSET meta/runs/slots, ZADD order and
        # leases, PUBLISH the notice (the script's own call counts too).
        assert calls == {
            "fcall": 1,
            "time": 1,
            "hget": 1,
            "hmget": 2,
            "hset": 3,
            "zadd": 2,
            "publish": 1,
        }, calls

        [lost], calls = await _counted(client, other, [_request("cost", slot + 1000, "b")])
        assert lost.status is ClaimStatus.LOST and lost.run is not None
        assert (lost.run.run_id, lost.run.fence) == (won.run.run_id, won.ticket.fence)
        assert lost.lease_expires_at_ms == won.ticket.lease_expires_at_ms
        assert calls == {"fcall": 1, "time": 1, "hget": 2}, calls

        history = await backend.history("cost")
        assert [r.run_id for r in history] == [won.run.run_id, first.run.run_id]
        assert history[0] == won.run


async def test_a_batch_sends_its_claims_in_few_script_calls(own_server: RedisServer) -> None:
    """On one server a batch's claims go CLAIMS_PER_CALL to a script call (one command instead
    of one each), every claim decided on its own as if alone."""
    async with _two_instances(own_server) as (backend, other, client):
        slot = (int(time.time()) + 60) * 1000
        jobs = [f"b{n}" for n in range(2 * CLAIMS_PER_CALL + 3)]
        calls_made = -(-len(jobs) // CLAIMS_PER_CALL)
        won, calls = await _counted(client, backend, [_request(j, slot, "a") for j in jobs])
        assert [o.status for o in won] == [ClaimStatus.WON] * len(jobs)
        assert calls["fcall"] == calls_made and calls["time"] == calls_made, calls
        # Each job's first record (three HSETs, known_from among them); the uptime asked once.
        assert calls["hset"] // 3 == len(jobs) and calls["info"] == 1, calls
        # The batch's notices: one message after it (it may have gone out already), not one
        # PUBLISH per claim from the scripts.
        assert calls.get("publish", 0) <= 1, calls

        lost, calls = await _counted(client, other, [_request(j, slot, "b") for j in jobs])
        assert [o.status for o in lost] == [ClaimStatus.LOST] * len(jobs)
        assert [o.run.run_id for o in lost] == [o.run.run_id for o in won]
        assert calls == {"fcall": calls_made, "time": calls_made, "hget": 2 * len(jobs)}
        for job, outcome in zip(jobs, won, strict=True):
            assert await backend.history(job) == [outcome.run]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"slot": None, "key": "manual-1", "trigger": Trigger.MANUAL, "requested_by": "cli"},
        {"skip_reason": 'too late: "\u00e9t\u00e9"', "skip_status": RunStatus.MISSED},
        {"overlap": Overlap.SKIP, "instance": "h\u00f4te\n"},
    ],
)
@pytest.mark.parametrize("pauses", [None, {"cost": "{}", "*": "{}"}])
def test_the_claim_arguments_are_compact_json_of_the_request(
    changes: dict[str, Any], pauses: dict[str, str] | None
) -> None:
    """claim_arguments writes its JSON out by hand for speed: the first argument must stay the
    compact JSON of what the script decides by, in this order (the bench's same-work floor
    compares it), and the second the stored record's known fields, left open."""
    req = replace(_request("cost", 60_000, "a"), **changes)
    decide: dict[str, Any] = {
        "job": req.job,
        "slot_key": req.slot_key,
        "lease_ms": req.lease_ms,
        "overlap": req.overlap,
        "restart_margin_ms": RESTART_MARGIN_MS,
    }
    known: dict[str, Any] = {
        "job": req.job,
        "slot_key": req.slot_key,
        "attempt": 1,
        "run_id": req.run_id,
        "token": req.token,
        "instance": req.instance,
        "trigger": req.trigger,
    }
    if req.slot is not None:
        decide["slot"] = known["slot"] = req.slot
    if req.requested_by is not None:
        known["requested_by"] = req.requested_by
    if req.skip_reason is not None:
        decide["skip_reason"], decide["skip_status"] = req.skip_reason, req.skip_status
    elif req.trigger is not Trigger.MANUAL:
        decide["pausable"] = True
        if pauses is not None:
            decide["pauses"] = pauses
    decide["clock_offset_ms"] = -5
    decide["claims_channel"] = "app:_claims"
    compact = json.JSONEncoder(separators=(",", ":")).encode
    first, second, notice = claim_arguments(
        req, pauses, claims_channel="app:_claims", clock_offset_ms=-5
    )
    assert first == compact(decide)
    assert second + "}" == compact(known)
    assert notice == compact([req.job, req.slot_key, req.instance])[:-1] + ","
