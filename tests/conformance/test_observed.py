"""What the metrics and spans say, on each backend, against what history records: a run span
says its run's real fate on stop, and over real instances the counters add up to history."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from anarchon import Backend, Run, RunContext, RunStatus, Scheduler, Trigger, steering
from anarchon._metrics import RUN_STATUSES, SLOT_OUTCOMES, skip_class
from tests.conformance.procs import Fleet, Worker, busy_then_paused
from tests.conformance.test_scheduling import until
from tests.harness import Harness, Namespace

NEVER = "0 0 1 1 *"  # slots nobody waits for: the runs below are manual


def run_span(exporter: InMemorySpanExporter, job: str) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans() if s.name == f"run {job}"]
    return span


async def test_a_run_span_on_stop_says_what_became_of_the_run(
    harness: Harness, ns: Namespace, spans: InMemorySpanExporter
) -> None:
    # Two runs still in their handlers when the grace period ends: a plain handler's thread,
    # which cannot be stopped (left to its lease: nothing handed over), and an async handler,
    # cancelled (handed over on a lease backend; recorded failed, "stopped", on a broker). The
    # span said handed_over for both.
    release = threading.Event()
    started: set[str] = set()

    def plain(ctx: RunContext) -> None:
        started.add("plain")
        release.wait(30)

    async def hung(ctx: RunContext) -> None:
        started.add("hung")
        await asyncio.sleep(3600)

    scheduler = Scheduler(ns.make(), instance_id="stopping", grace_ms=300)
    scheduler.add("plain", NEVER, plain)
    scheduler.add("hung", NEVER, hung)
    await scheduler.start()
    try:
        runs = [asyncio.ensure_future(scheduler.run_now(job)) for job in ("plain", "hung")]
        await until(lambda: started == {"plain", "hung"}, 15, "both handlers to start")
        await scheduler.stop()
    finally:
        release.set()
        await scheduler.stop()
    await asyncio.gather(*runs, return_exceptions=True)
    metrics = scheduler.metrics()

    plain_span = run_span(spans, "plain")
    assert plain_span.attributes["anarchon.outcome"] == "left_to_expire"  # type: ignore[index]
    assert metrics.by_job["plain"].handed_over == 0

    hung_span = run_span(spans, "hung")
    async with Scheduler(ns.make()) as reader:
        [record] = await reader.history("hung")
    if harness.lease:
        assert hung_span.attributes["anarchon.outcome"] == "handed_over"  # type: ignore[index]
        assert hung_span.status.status_code is StatusCode.UNSET
        assert metrics.by_job["hung"].handed_over == 1
    else:  # a broker: no hand-over; the run is recorded failed, and its span says so
        assert record.status is RunStatus.FAILED and (record.error or "").startswith("stopped")
        assert hung_span.attributes["anarchon.outcome"] == "failed"  # type: ignore[index]
        assert hung_span.status.status_code is StatusCode.ERROR
        assert hung_span.status.description == record.error
        assert metrics.by_job["hung"].runs["failed"] == 1


def _wait_for_start(fleet: Fleet, workers: list[Worker], timeout: float = 30) -> Worker:
    """Wait until one of ``workers`` starts a handler from now on; return that one."""
    after = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in workers:
            if any(r["event"] == "start" and r["t"] > after for r in worker.records()):
                return worker
        time.sleep(0.02)
    raise AssertionError(f"no run started\n{fleet.logs()}")


async def _history_until(backend: Backend, done: Callable[[list[Run]], bool], cap_s: float) -> None:
    """Read ``tick``'s history until ``done`` holds of it, for at most ``cap_s`` (the fixed
    wait this poll replaced; past it the test goes on as it did, its assertions deciding)."""
    deadline = time.monotonic() + cap_s
    while True:
        if done(await backend.history("tick", limit=1_000)) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)


def _stop_settled(lease: bool, history: list[Run]) -> bool:
    """Whether the run a stop handed over is over: on a lease backend, the other instance's
    attempt 2 of its slot has ended; on a broker, the stopped run is recorded failed."""
    if not lease:
        return any((r.error or "").startswith("stopped") for r in history)
    handed = {r.slot_ms for r in history if (r.attempt, r.reason) == (1, "handed over")}
    return any(r.slot_ms in handed and r.attempt == 2 and r.status.finished for r in history)


@pytest.mark.slow
async def test_over_real_instances_the_counters_add_up_to_history(
    harness: Harness, fleet: Fleet, backend: Backend
) -> None:
    # Two instances, options at their defaults but a short grace: an every-second job whose
    # handler takes 2.5 s (on a lease backend the slots meanwhile are skipped for overlap), a
    # pause, a trigger while a run holds its lease (claimed within a poll, about a second),
    # and a stop while a run is in its handler (handed over to the other instance, or recorded
    # failed on a broker). Added over the instances, the per-job slots and runs, skipped and
    # slots_paused equal history.
    workers = await busy_then_paused(fleet, backend, "tick", 4, seconds=90, grace_ms=300)
    _wait_for_start(fleet, workers)
    request = await steering.trigger(backend, "tick", by="test")  # while that run holds its lease
    await _history_until(backend, lambda runs: any(r.run_id == request.id for r in runs), 3)
    # The next instance to start a run, either: each slot's claim ranks them anew, and one of
    # two was seen to run nothing for 30 s while the other won every free slot.
    busy = _wait_for_start(fleet, workers)
    await asyncio.sleep(0.2)
    busy.kill(signal.SIGTERM)  # in its handler: past the grace, handed over
    busy.wait(30)
    await _history_until(backend, partial(_stop_settled, harness.lease), 6)
    fleet.stop_all()
    history = await backend.history("tick", limit=1_000)
    exits = fleet.records("exit")
    assert len(exits) == 2, fleet.logs()

    counted: Counter[str] = Counter()
    for exit_record in exits:
        figures = exit_record["by_job"]["tick"]
        counted.update({f"slots.{k}": v for k, v in figures["slots"].items()})
        counted.update({f"runs.{k}": v for k, v in figures["runs"].items()})
        counted.update({k: exit_record["metrics"][k] for k in ("skipped", "slots_paused")})

    recorded: Counter[str] = Counter()
    for run in history:
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            recorded[f"runs.{run.status.value}"] += 1
        if run.status is RunStatus.SKIPPED:
            recorded["skipped"] += 1
        if run.trigger in (Trigger.SCHEDULE, Trigger.CATCH_UP) and run.attempt == 1:
            if run.status is RunStatus.SKIPPED:
                recorded[f"slots.{skip_class(run.skip_cause)}"] += 1
                recorded["slots_paused"] += skip_class(run.skip_cause) == "skipped_paused"
            elif run.status is RunStatus.MISSED:
                recorded["slots.missed"] += 1
            else:
                recorded["slots.ran"] += 1
        elif run.status is RunStatus.SKIPPED:
            recorded["runs.skipped"] += 1
    wanted = {f"slots.{k}" for k in SLOT_OUTCOMES if not k.startswith("unclaimed")}
    wanted |= {f"runs.{k}" for k in RUN_STATUSES} | {"skipped", "slots_paused"}
    print(f"\n{harness.name}: counted {dict(+counted)}")
    assert {k: counted[k] for k in wanted} == {k: recorded[k] for k in wanted}, fleet.logs()
    # What the test set out to meet happened: a pause, a stop in a handler (handed over, or
    # recorded failed on a broker), and on a lease backend a trigger skipped for overlap.
    assert recorded["slots_paused"] >= 1
    reasons = Counter((r.attempt, r.status, r.reason) for r in history)
    if harness.lease:
        assert reasons[(1, RunStatus.FAILED, "handed over")] >= 1, reasons
        assert recorded["runs.skipped"] >= 1, reasons
    else:
        assert any((r.error or "").startswith("stopped") for r in history), reasons


async def test_a_secret_in_a_handlers_error_is_masked_where_it_is_stored_and_exported(
    harness: Harness, ns: Namespace, spans: InMemorySpanExporter
) -> None:
    # docs/observability.md: secrets in URLs are masked as everywhere. The logs masked this
    # one; history's error, `anarchon history` and the span carried it raw.
    async def leaky(ctx: RunContext) -> None:
        raise RuntimeError("cannot reach postgresql://app:Hunter2pw@db.internal/x")

    async with Scheduler(ns.make(), instance_id="leaky") as scheduler:
        scheduler.add("leaky", NEVER, leaky)
        run = await scheduler.run_now("leaky")
        [stored] = await scheduler.history("leaky")
    masked = "RuntimeError: cannot reach postgresql://app:***@db.internal/x"
    assert run.error == stored.error == masked
    span = run_span(spans, "leaky")
    assert span.status.description == masked
    [event] = [e for e in span.events if e.name == "exception"]
    assert event.attributes is not None
    assert (
        event.attributes["exception.message"] == "cannot reach postgresql://app:***@db.internal/x"
    )
    assert "Hunter2pw" not in str(event.attributes["exception.stacktrace"])
    assert "raise RuntimeError" in str(event.attributes["exception.stacktrace"])
    if ns.url is not None:  # what `anarchon history` prints, as text and as JSON
        for extra in ([], ["--json"]):
            shown = await asyncio.to_thread(_history_command, ns.url, *extra)
            assert shown.returncode == 0, shown.stderr
            assert "postgresql://app:***@db.internal" in shown.stdout
            assert "Hunter2pw" not in shown.stdout + shown.stderr


def _history_command(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "anarchon", "history", "leaky", "--backend", url, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)
