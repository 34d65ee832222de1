"""``Scheduler.observe()``: what a scheduler shows of itself, read from any thread without its
event loop (``anarchon.Observation``). Health and the Prometheus scrape read it instead of the
scheduler's private attributes (tests/unit/test_health.py, test_prometheus.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Literal, assert_type

import pytest

import anarchon.prometheus
from anarchon import JobMetrics, MemoryBackend, Observation, RunContext, Scheduler
from tests.unit.test_start_cancel import _Stuck

LOOPS = {"watcher", "adopt", "timer", "clock", "requests", "heartbeat"}


async def _work(ctx: RunContext) -> None:
    pass


async def test_observe_with_the_defaults_before_during_and_after_a_run() -> None:
    scheduler = Scheduler(MemoryBackend())
    scheduler.add("tick", "* * * * * *", _work)
    scheduler.add("tock", "0 * * * * *", _work)
    before = scheduler.observe()
    assert isinstance(before, Observation)
    # Typed: mypy --strict checks the names where observe() builds it, and a reader's match.
    assert_type(before.state, Literal["new", "running", "stopping", "stopped"])
    assert (before.state, dict(before.loops), before.event_loop) == ("new", {}, None)
    assert before.jobs == {} and before.metrics.jobs == 2 and before.metrics.by_job == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.state = "running"  # type: ignore[misc]
    async with scheduler:
        seen = scheduler.observe()
        assert seen.state == "running"
        assert seen.event_loop is asyncio.get_running_loop()
        assert set(seen.loops) >= LOOPS and all(seen.loops.values()), seen.loops
        assert seen.jobs == {} and seen.blocked_by is None and seen.shared_with is None
        assert seen.leases_held == 0 and seen.metrics.running == 0
        # Each job's public figures by name, as metrics().by_job gives them.
        jobs = scheduler.observe(jobs=True).jobs
        assert list(jobs) == ["tick", "tock"] and list(scheduler.metrics().by_job) == list(jobs)
        # The type is exported from anarchon, the same class as anarchon.prometheus.JobMetrics.
        assert isinstance(jobs["tick"], JobMetrics) and jobs["tick"].running == 0
        assert anarchon.prometheus.JobMetrics is JobMetrics
        assert jobs["tick"].interval_ms == 1000 and jobs["tock"].interval_ms == 60_000
        # From another thread, as /healthz and /metrics read it: it does not wait for the loop.
        elsewhere: list[Observation] = []
        reader = threading.Thread(target=lambda: elsewhere.append(scheduler.observe(jobs=True)))
        reader.start()
        reader.join(10)
        assert list(elsewhere[0].jobs) == ["tick", "tock"]
    assert scheduler.observe().state == "stopped"


async def test_observe_reads_running_in_the_last_part_of_a_start() -> None:
    # The public `state` says "starting" until start() ends; observe() reads "running" from
    # the moment the services run, as `running` does, so health does not call a slow start down.
    backend = _Stuck("subscribe_claims")
    scheduler = Scheduler(backend)
    scheduler.add("tick", "* * * * * *", _work)
    stop = asyncio.Event()
    serving = asyncio.create_task(scheduler.serve(stop))
    await asyncio.wait_for(backend.waiting.wait(), 30)
    assert scheduler.state == "starting"
    assert scheduler.observe().state == "running"
    health = await scheduler.health()
    assert health.state == "running" and "not running" not in " ".join(health.problems)
    stop.set()
    await asyncio.wait_for(serving, 10)


def test_run_stops_when_its_stop_event_is_set() -> None:
    # `anarchon run` passes the event its early signal handlers set (before, a private method).
    stop = asyncio.Event()
    ran: list[int] = []

    async def work(ctx: RunContext) -> None:
        ran.append(1)
        stop.set()

    scheduler = Scheduler(MemoryBackend())
    scheduler.add("tick", "* * * * * *", work)
    scheduler.run(stop)
    assert ran and scheduler.state == "stopped"
