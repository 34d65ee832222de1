"""OpenTelemetry's ``slot <job>`` span (docs/observability.md): every slot nobody ran, skipped
or missed, has exactly one on the whole fleet, from the instance whose claim wrote its record,
with the record's fate, skip cause and reason; so a tracing-only operator sees the fate of every
recorded slot (a ``run`` span, or this one). Real instances on real backends: worker processes
with every option at its default, and two schedulers recording missed slots; the SDK's
in-memory exporter records the spans."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from anarchon import Backend, Run, RunContext, RunStatus, Scheduler, SkipCause, Trigger, otel
from anarchon.testing._requests import lease, request
from tests.conformance.procs import Fleet, busy_then_paused
from tests.harness import Harness, Namespace

BACKENDS = ["sqlite", "postgres"]
JOB = "tick"
MINUTE = 60_000
SLOT_TRIGGERS = (Trigger.SCHEDULE, Trigger.CATCH_UP)


def _not_run(history: list[Run]) -> dict[int, Run]:
    """The records of slots nobody ran, by slot."""
    return {
        r.slot_ms: r
        for r in history
        if r.slot_ms is not None
        and r.trigger in SLOT_TRIGGERS
        and r.status in (RunStatus.SKIPPED, RunStatus.MISSED)
    }


def _check(spans: list[dict[str, Any]], history: list[Run]) -> Counter[SkipCause | None]:
    """One ``slot`` span per record of a slot nobody ran, none for any other slot, each saying
    what the record says; the records' skip causes."""
    by_slot: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_slot[span["attributes"]["anarchon.slot"]].append(span)
    records = _not_run(history)
    assert sorted(by_slot) == sorted(records), (sorted(by_slot), sorted(records))
    for slot, record in records.items():
        assert len(by_slot[slot]) == 1, (record, by_slot[slot])
        [span] = by_slot[slot]
        key = str(slot)
        assert span["name"] == f"slot {JOB}"
        assert span["trace_id"] == otel.trace_id(JOB, key)  # the slot's trace
        assert span["parent"] == otel.attempt_parent(JOB, key, 1).span_id  # beside its claims
        cause = None if record.skip_cause is None else record.skip_cause.value
        wanted = {
            "anarchon.job": JOB,
            "anarchon.slot": slot,
            "anarchon.slot_key": key,
            "anarchon.outcome": record.status.value,
            "anarchon.skip_cause": cause,
            "anarchon.reason": record.reason,
            "anarchon.instance": record.instance,
            "anarchon.run_id": record.run_id,
            "anarchon.trigger": record.trigger.value,
        }
        got = {k: span["attributes"].get(k) for k in wanted}
        assert got == wanted, (got, wanted)
    return Counter(r.skip_cause for r in records.values())


@pytest.mark.slow
@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_over_real_instances_each_skipped_slot_has_one_slot_span_with_the_defaults(
    harness: Harness, fleet: Fleet, backend: Backend
) -> None:
    # Two worker processes, every option at its default: an every-second job whose handler
    # takes 2.5 s (the slots meanwhile are skipped for overlap), then a pause of 3.5 s (each
    # slot skipped, paused). Both instances claim each slot; only the writer of its record
    # gives it a span. Before, no span told of a skipped slot but the claims' (every instance's).
    await busy_then_paused(fleet, backend, JOB, 5, seconds=60, spans=1)
    fleet.stop_all()
    history = await backend.history(JOB, limit=1_000)
    exported = fleet.records("spans")
    assert len(exported) == 2, fleet.logs()
    causes = _check([s for r in exported for s in r["spans"]], history)
    assert causes[SkipCause.OVERLAP] >= 1 and causes[SkipCause.PAUSED] >= 1, causes


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_each_missed_slot_has_one_slot_span_from_the_instance_that_recorded_it(
    harness: Harness, ns: Namespace, spans: InMemorySpanExporter
) -> None:
    # The job's last record is ten minutes old: both instances that start now claim the gap's
    # slots as missed; each gets one span, from the instance whose claim wrote it. Before, a
    # missed slot had no span at all.
    writer = ns.make()
    await writer.start()
    try:
        now = await writer.server_time_ms()
        assert now is not None
        last = now - now % MINUTE - 10 * MINUTE
        [won] = await writer.claim([request(JOB, last, instance="old", **lease(writer))])
        assert won.ticket is not None
        await writer.finish(won.ticket, RunStatus.SUCCEEDED, None)
    finally:
        await writer.stop()

    async def tick(ctx: RunContext) -> None:
        pass

    # A short max_late_ms: the gap's newest slots are recorded max_late_ms + 5 s after start.
    instances = [Scheduler(ns.make(), instance_id=f"i{n}") for n in range(2)]
    for scheduler in instances:
        scheduler.add(JOB, "* * * * *", tick, jitter_ms=0, max_late_ms=1_000)
    async with instances[0], instances[1]:
        reader = instances[0]

        async def gap_recorded() -> int:
            # Every slot from the last record to the first an instance ran (catch-up, or on
            # time) is recorded missed: those within max_late_ms + 5 s of the start that much
            # later (a minute begun since ``now``).
            slots = [(r.slot_ms, r.status) for r in await reader.history(JOB, limit=100)]
            ran = [s for s, status in slots if s and s > last and status is not RunStatus.MISSED]
            missed = {s for s, status in slots if status is RunStatus.MISSED}
            return bool(ran) and missed == set(range(last + MINUTE, min(ran), MINUTE))

        await until_async(gap_recorded, 1, 30)
        history = await reader.history(JOB, limit=1_000)
    exported = [
        {
            "name": s.name,
            "attributes": dict(s.attributes or {}),
            "trace_id": s.context.trace_id,
            "parent": s.parent.span_id if s.parent else None,
            "kind": s.kind,
        }
        for s in spans.get_finished_spans()
        if s.name.startswith("slot ")
    ]
    assert all(s["kind"] is SpanKind.INTERNAL for s in exported)
    causes = _check(exported, history)
    assert causes == Counter({None: len(_not_run(history))}), causes
    assert len(_not_run(history)) >= 9, history
    assert {s["attributes"]["anarchon.outcome"] for s in exported} == {"missed"}


async def until_async(count: Any, at_least: int, timeout_s: float) -> None:
    """Wait until the coroutine function ``count`` returns at least ``at_least``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await count() < at_least:
        assert asyncio.get_running_loop().time() < deadline, f"fewer than {at_least} in time"
        await asyncio.sleep(0.2)
