"""More slots due at once than one claim() call can send in time: every slot still runs once.

One ``NatsBackend.claim`` call sends all its publishes within ``CLAIM_RETRY_S`` of the call
(``CLAIM_MARGIN_MS`` relies on it). A burst larger than that was one call: the publishes past
the limit failed the call, the whole batch was retried and failed the same way until every slot
was too late, so none ran (50 000 slots on three instances). The core now sends parts of
``CLAIM_PART``. Here the sizes are scaled down (a server slowed to 80 publishes a second,
``CLAIM_RETRY_S`` 1 s, parts of 50) so that the burst of 300 takes seconds, not minutes; the
full size runs in ``make chaos`` (tests/chaos/test_burst.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from anarchon import RunContext, RunStatus, Scheduler
from anarchon.backends.nats import NatsBackend

JOBS = 300
PUBLISH_S = 0.05  # each publish answered this much later (a slow server)
GATE = 4  # publishes in flight: 80 a second, 80 per CLAIM_RETRY_S


@pytest.mark.parametrize("version", ["current"])
async def test_a_burst_larger_than_one_claim_call_runs_every_slot_once(
    server_url: str, names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from anarchon import _claims as core_claims
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 1.0)
    monkeypatch.setattr(core_claims, "CLAIM_PART", 50)  # 50 publishes: 0.625 s
    stream, prefix = names
    backend = NatsBackend(server_url, stream=stream, prefix=prefix)
    scheduler = Scheduler(backend)
    starts: list[str] = []
    all_started = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        starts.append(ctx.job)
        if len(starts) == JOBS:
            all_started.set()

    slot_s = math.ceil(time.time() + 5)
    moment = datetime.fromtimestamp(slot_s, UTC)
    schedule = f"{moment.second} {moment.minute} {moment.hour} * * *"
    jobs = [f"b{n}" for n in range(JOBS)]
    for job in jobs:
        scheduler.add(job, schedule, handler, jitter_ms=0, max_late_ms=10_000)
    async with scheduler:
        conn = backend._conn
        conn.in_flight = asyncio.Semaphore(GATE)
        publish = conn.publish

        async def slow(*args: Any) -> Any:
            await asyncio.sleep(PUBLISH_S)
            return await publish(*args)

        conn.publish = slow  # type: ignore[method-assign,assignment]
        assert time.time() < slot_s - 0.5, "start-up took past the slot: raise the lead"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_started.wait(), slot_s + 20 - time.time())
        await asyncio.sleep(1.0)  # a late duplicate would show by now
        conn.publish = publish  # type: ignore[method-assign]
        histories = {job: await scheduler.history(job) for job in jobs}
    assert sorted(starts) == sorted(jobs), f"{len(starts)} of {JOBS} started"
    for job, runs in histories.items():
        assert [(r.attempt, r.slot_ms) for r in runs] == [(1, slot_s * 1000)], (job, runs)
        assert runs[0].status in (RunStatus.SUCCEEDED, RunStatus.RUNNING), (job, runs)
