"""OpenTelemetry: one span per attempt and per claim, in one trace per slot, with the handler's
own spans nested and a takeover linked to the attempt it took over (the SDK's in-memory
exporter records them)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from anarchon import RunContext, RunStatus, Scheduler, SkipCause, Trigger, otel
from anarchon.backend import TOO_LATE, ClaimRequest, ClaimStatus
from anarchon.testing import FakeClock, MemoryBackend
from anarchon.testing._requests import request
from tests.docs.blocks import block
from tests.unit.core_helpers import MINUTE, START

SLOT = START + 60 * MINUTE


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


async def test_a_scheduled_run_has_a_claim_and_a_run_span_in_the_slots_trace(
    spans: InMemorySpanExporter,
) -> None:
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock, instance_id="a")
    seen: list[int] = []

    async def report(ctx: RunContext) -> None:
        seen.append(trace.get_current_span().get_span_context().span_id)

    scheduler.add("report", "0 * * * *", report, jitter_ms=0)
    async with scheduler:
        await clock.advance(60 * MINUTE + 1_000)
    [claim] = named(spans, "claim report")
    [run] = named(spans, "run report")
    key = str(SLOT)
    assert claim.context.trace_id == run.context.trace_id == otel.trace_id("report", key)
    assert claim.kind is SpanKind.CLIENT and run.kind is SpanKind.INTERNAL
    assert attrs(claim)["anarchon.outcome"] == "won"
    assert attrs(claim)["anarchon.instance"] == "a"
    assert attrs(claim)["anarchon.slot"] == SLOT
    attributes = attrs(run)
    assert attributes["anarchon.job"] == "report"
    assert attributes["anarchon.slot"] == SLOT
    assert attributes["anarchon.slot_iso"] == "2026-01-01T01:00:00.000+00:00"
    assert attributes["anarchon.attempt"] == 1
    assert isinstance(attributes["anarchon.fence"], int)
    assert attributes["anarchon.trigger"] == "schedule"
    assert attributes["anarchon.instance"] == "a"
    assert attributes["anarchon.outcome"] == "succeeded"
    assert run.parent is not None and run.parent.is_remote
    assert run.parent.span_id == otel.attempt_parent("report", key, 1).span_id
    assert seen == [run.context.span_id], "the handler does not run inside its span"
    assert run.status.status_code is StatusCode.UNSET


async def test_the_handlers_own_spans_nest_in_async_and_plain_handlers(
    spans: InMemorySpanExporter,
) -> None:
    provider = otel._state["provider"]
    tracer = provider.get_tracer("app")
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)

    async def fetch(ctx: RunContext) -> None:
        with tracer.start_as_current_span("fetch rows"):
            pass

    def export(ctx: RunContext) -> None:  # on a handler thread
        with tracer.start_as_current_span("write file"):
            pass

    scheduler.add("fetch", "0 0 1 1 *", fetch)
    scheduler.add("export", "0 0 1 1 *", export)
    async with scheduler:
        assert (await scheduler.run_now("fetch")).status is RunStatus.SUCCEEDED
        assert (await scheduler.run_now("export")).status is RunStatus.SUCCEEDED
    for run_name, child_name in (("run fetch", "fetch rows"), ("run export", "write file")):
        [run] = named(spans, run_name)
        [child] = named(spans, child_name)
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
        assert attrs(run)["anarchon.trigger"] == "manual"
        assert "anarchon.slot" not in attrs(run)  # a manual run has no slot


async def test_a_failure_sets_the_status_and_records_the_exception_once(
    spans: InMemorySpanExporter,
) -> None:
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)

    async def broken(ctx: RunContext) -> None:
        raise ConnectionError("the export server closed the connection")

    scheduler.add("broken", "0 0 1 1 *", broken)
    async with scheduler:
        run = await scheduler.run_now("broken")
    assert run.status is RunStatus.FAILED
    [span] = named(spans, "run broken")
    assert span.status.status_code is StatusCode.ERROR
    assert "ConnectionError" in (span.status.description or "")
    assert attrs(span)["anarchon.outcome"] == "failed"
    [event] = [e for e in span.events if e.name == "exception"]
    assert attrs(event)["exception.type"] == "ConnectionError"
    assert "the export server closed" in attrs(event)["exception.message"]
    assert "raise ConnectionError" in attrs(event)["exception.stacktrace"]


async def test_a_takeover_is_in_the_same_trace_and_links_to_the_attempt_it_took_over(
    spans: InMemorySpanExporter,
) -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    # A runner claimed the slot and crashed: its lease runs out; the backup takes over.
    [crashed] = await backend.claim(
        [
            ClaimRequest(
                job="work",
                slot=SLOT,
                run_id="crashed",
                token="crashed-token",
                instance="crashed",
                trigger=Trigger.SCHEDULE,
                lease_ms=3_000,
            )
        ]
    )
    assert crashed.ticket is not None

    async def work(ctx: RunContext) -> None:
        pass

    await clock.advance(2 * MINUTE)
    backup = Scheduler(backend, clock=clock, instance_id="backup")
    # The crashed attempt started before the catch-up window: the backup does not watch it from
    # its start (see BackupWatcher.adopt) but meets it at the slot's claim.
    backup.add("work", "0 * * * *", work, jitter_ms=0, lease_ms=3_000, catch_up_window_ms=MINUTE)
    async with backup:
        await clock.advance(58 * MINUTE + 5_000)
    [claim] = named(spans, "claim work")
    assert attrs(claim)["anarchon.outcome"] == "lost"
    assert attrs(claim)["anarchon.holder"] == "crashed"
    [run] = named(spans, "run work")
    key = str(SLOT)
    assert attrs(run)["anarchon.attempt"] == 2
    assert attrs(run)["anarchon.outcome"] == "succeeded"
    assert run.context.trace_id == claim.context.trace_id == otel.trace_id("work", key)
    [link] = run.links
    assert link.context.trace_id == run.context.trace_id
    assert link.context.span_id == otel.attempt_parent("work", key, 1).span_id
    assert link.attributes == {"anarchon.link": "took_over", "anarchon.attempt": 1}
    assert run.parent is not None
    assert run.parent.span_id == otel.attempt_parent("work", key, 2).span_id


def test_ids_are_the_same_on_every_instance_and_differ_by_slot_and_attempt() -> None:
    key = str(SLOT)
    assert otel.trace_id("report", key) == otel.trace_id("report", key)
    assert otel.trace_id("report", key) != otel.trace_id("report", str(SLOT + MINUTE))
    assert otel.trace_id("report", key) != otel.trace_id("export", key)
    first, second = (otel.attempt_parent("report", key, n) for n in (1, 2))
    assert first.trace_id == second.trace_id and first.span_id != second.span_id
    assert first.is_remote and first.trace_flags.sampled
    assert len(format(otel.trace_id("report", key), "032x")) == 32


async def test_turned_off_nothing_is_recorded(spans: InMemorySpanExporter) -> None:
    otel.configure(otel._state["provider"], enabled=False)
    assert not otel.enabled()
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)

    async def quiet(ctx: RunContext) -> None:
        pass

    scheduler.add("quiet", "0 0 1 1 *", quiet)
    async with scheduler:
        assert (await scheduler.run_now("quiet")).status is RunStatus.SUCCEEDED
    assert spans.get_finished_spans() == ()


def test_configure_refuses_what_is_not_a_provider() -> None:
    with pytest.raises(TypeError, match=r"tracer_provider=42 is not an OpenTelemetry"):
        otel.configure(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"enabled='no' must be True or False"):
        otel.configure(enabled="no")  # type: ignore[arg-type]


def test_with_no_provider_set_nothing_is_traced() -> None:
    # The API installed, no provider set (the global one is the API's proxy): off.
    otel.configure()
    assert not otel.enabled()


WITHOUT_OTEL = """
import asyncio, sys

class NoOtel:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("no opentelemetry here")
        return None

sys.meta_path.insert(0, NoOtel())
from anarchon import RunStatus, Scheduler, otel
from anarchon.testing import MemoryBackend

async def main():
    scheduler = Scheduler(MemoryBackend())

    async def job(ctx):
        pass

    scheduler.add("job", "0 0 1 1 *", job)
    async with scheduler:
        run = await scheduler.run_now("job")
    assert run.status is RunStatus.SUCCEEDED, run
    assert not otel.enabled()
    assert not any(m.startswith("opentelemetry") for m in sys.modules)
    print("ok")

asyncio.run(main())
"""


def test_without_opentelemetry_installed_runs_go_on_and_nothing_is_imported() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


STARTED = """
import asyncio, sys
from anarchon import Scheduler, otel
from anarchon.testing import MemoryBackend

async def main(enabled):
    otel.configure(enabled=enabled)
    scheduler = Scheduler(MemoryBackend())
    await scheduler.start()
    print(enabled, "opentelemetry.trace" in sys.modules)
    await scheduler.stop()

asyncio.run(main(True))
"""


def test_the_opentelemetry_api_is_imported_as_the_scheduler_starts_not_on_a_claim() -> None:
    """Imported on the first claim, it held that claim's event loop (3.7 s once under load);
    start() imports it in a thread. With tracing turned off it is not imported at all."""
    for enabled in (True, False):
        script = STARTED.replace("main(True)", f"main({enabled})")
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(enabled), str(enabled)]


PAGE_RUN = """
import asyncio
from anarchon import Scheduler
from anarchon.testing import MemoryBackend

async def main():
    scheduler = Scheduler(MemoryBackend(), instance_id="docs")

    async def report(ctx):
        pass

    scheduler.add("report", "0 0 1 1 *", report)
    async with scheduler:
        await scheduler.run_now("report")

asyncio.run(main())
"""


def test_the_observability_page_setup_traces_runs() -> None:
    """The block of docs/observability.md marked otel-page-setup, then a run: its spans print."""
    setup = block("docs/observability.md", "otel-page-setup")
    out = subprocess.run(
        [sys.executable, "-c", setup + PAGE_RUN], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert '"name": "run report"' in out.stdout and '"name": "claim report"' in out.stdout
    assert '"anarchon.instance": "docs"' in out.stdout


async def test_a_slot_span_comes_only_from_the_claim_that_wrote_the_slots_skip_record(
    spans: InMemorySpanExporter,
) -> None:
    # Two instances reach a slot too late: both answers are SKIPPED (the second with the
    # first's record), one slot span. A run request's skip is no slot, and a skip a broker
    # answered without storing it (NOT_RECORDED) is no record: no slot span for either.
    backend = MemoryBackend(clock=FakeClock(SLOT))
    late = {"skip_reason": f"{TOO_LATE}test", "skip_cause": SkipCause.TOO_LATE}
    first = request("report", SLOT, instance="a", **late)
    second = request("report", SLOT, instance="b", **late)
    manual = request("report", None, instance="a", trigger=Trigger.MANUAL, **late)
    answers = [*await backend.claim([first]), *await backend.claim([second])]
    answers += await backend.claim([manual])
    assert [a.status for a in answers] == [ClaimStatus.SKIPPED] * 3
    assert answers[1].run.run_id == first.run_id
    unrecorded = replace(answers[0], run=replace(answers[0].run, skip_cause=SkipCause.NOT_RECORDED))
    otel.claimed([first, second, manual, first], [*answers, unrecorded], 0, "memory", 0)
    [span] = named(spans, "slot report")
    assert span.kind is SpanKind.INTERNAL and span.status.status_code is StatusCode.UNSET
    assert span.context.trace_id == otel.trace_id("report", str(SLOT))
    assert span.parent is not None
    assert span.parent.span_id == otel.attempt_parent("report", str(SLOT), 1).span_id
    assert attrs(span) == {
        "anarchon.job": "report",
        "anarchon.slot": SLOT,
        "anarchon.slot_iso": "2026-01-01T01:00:00.000+00:00",
        "anarchon.slot_key": str(SLOT),
        "anarchon.instance": "a",
        "anarchon.trigger": "schedule",
        "anarchon.backend": "memory",
        "anarchon.outcome": "skipped",
        "anarchon.skip_cause": "too_late",
        "anarchon.reason": f"{TOO_LATE}test",
        "anarchon.run_id": first.run_id,
    }
    assert len(named(spans, "claim report")) == 4  # every claim still has its own
