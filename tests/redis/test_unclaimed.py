"""Slots lost in an outage of a private redis-server, counted and traced: those not claimed
while Redis was down (``claim_failed``) and those the restarted server, without its data, cannot
vouch for (``claim_refused_unknown``). Each is ``unclaimed`` in the job's slots (reason ``error``
or ``refused``) and has a claim span (outcome ``error`` or ``refused``); none is a lost claim."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from anarchon import RunContext, Scheduler
from anarchon.backends.redis import RedisBackend
from tests.redis.servers import RedisServer

pytestmark = pytest.mark.slow


async def test_slots_lost_in_an_outage_are_counted_and_traced(
    own_server: RedisServer, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    async def tick(ctx: RunContext) -> None:
        ran.append(1)

    # The defaults, but for a short max_late_ms: a slot is given up 1 s after its time.
    scheduler = Scheduler(RedisBackend(own_server.url, prefix="unclaimed:"), instance_id="alone")
    scheduler.add("tick", "* * * * * *", tick, max_late_ms=1_000)
    with caplog.at_level(logging.INFO, logger="anarchon"):
        async with scheduler:
            await asyncio.sleep(3)
            assert ran, "no run before the outage"
            own_server.kill()
            await asyncio.sleep(5)
            own_server.start()  # without its data: slots of its first 2 s are refused
            before = len(ran)
            for _ in range(200):  # up to 20 s
                if len(ran) > before:
                    break
                await asyncio.sleep(0.1)
            assert len(ran) > before, "no run after the outage"
    actions = Counter(getattr(r, "action", None) for r in caplog.records)
    for record in caplog.records:
        if getattr(record, "action", None) == "claim_refused_unknown":
            assert record.slot_iso is not None  # type: ignore[attr-defined]
    slots = scheduler.metrics().by_job["tick"].slots
    assert actions["claim_failed"] >= 1 and actions["claim_refused_unknown"] >= 1, actions
    assert slots["unclaimed_error"] == actions["claim_failed"], (slots, actions)
    assert slots["unclaimed_refused"] == actions["claim_refused_unknown"], (slots, actions)
    assert (
        scheduler.metrics().slots_unclaimed
        == actions["claim_failed"] + actions["claim_refused_unknown"]
    )
    assert scheduler.metrics().claims_lost == 0, "alone, it lost no claim to anyone"

    claims = [s for s in spans.get_finished_spans() if s.name == "claim tick"]
    outcomes = Counter(dict(s.attributes or {})["anarchon.outcome"] for s in claims)
    assert outcomes["error"] == slots["unclaimed_error"], outcomes
    assert outcomes["refused"] == slots["unclaimed_refused"], outcomes
    assert "lost" not in outcomes, outcomes
    for span in claims:
        attributes = dict(span.attributes or {})
        if attributes["anarchon.outcome"] in ("error", "refused"):
            assert span.status.status_code is StatusCode.ERROR
            assert attributes["anarchon.slot_iso"]
