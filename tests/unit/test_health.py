"""scheduler.health() and healthz(): what is alive, what the backend answers, the clock against
its budget, and a blocked event loop named by the handler that blocks it."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import typing
from typing import Any, Literal, assert_type

import pytest

from anarchon import Health, RunContext, RunStatus, Scheduler
from anarchon.errors import BackendUnavailable, InvalidOption
from anarchon.health import healthz
from anarchon.testing import MemoryBackend


def noop_scheduler(backend: MemoryBackend | None = None, **kwargs: Any) -> Scheduler:
    scheduler = Scheduler(backend or MemoryBackend(), instance_id="i1", **kwargs)

    async def quiet(ctx: RunContext) -> None:
        pass

    scheduler.add("quiet", "0 0 1 1 *", quiet)
    return scheduler


async def test_a_running_scheduler_is_healthy_and_says_why() -> None:
    scheduler = noop_scheduler(heartbeat_ms=100)
    async with scheduler:
        await asyncio.sleep(0.3)  # a heartbeat or two
        health = await scheduler.health()
    assert isinstance(health, Health)
    assert health.healthy and health.live, health.problems
    assert health.status in ("ok", "degraded")
    assert health.instance == "i1" and health.state == "running" and health.backend == "memory"
    assert health.backend_reachable is True and health.backend_error is None
    assert health.backend_latency_ms is not None and 0 <= health.backend_latency_ms < 1_000
    assert {"timer", "clock", "watcher", "requests", "heartbeat", "keeper thread"} <= set(
        health.loops
    )
    assert all(health.loops.values()), health.loops
    assert health.loop_lag_ms is not None and health.loop_blocked_ms is not None
    assert health.heartbeat_age_ms is not None and health.heartbeat_age_ms < 1_000
    assert health.leases_held == 0 and health.running == 0
    assert health.clock_budget_ms is not None  # the memory backend's: the history TTL
    json.dumps(health.as_dict())  # plain JSON


async def test_a_scheduler_not_started_or_stopped_is_not_live() -> None:
    scheduler = noop_scheduler()
    health = await scheduler.health()
    # Typed as Observation.state is: mypy --strict checks a reader's comparisons and match.
    assert_type(health.state, Literal["new", "running", "stopping", "stopped"])
    assert (
        typing.get_type_hints(Health)["state"] == Literal["new", "running", "stopping", "stopped"]
    )
    assert not health.healthy and not health.live and health.state == "new"
    assert health.problems == ("the scheduler is new, not running",)
    async with scheduler:
        pass
    assert (await scheduler.health()).state == "stopped"
    assert healthz(scheduler)[0] == 503


class Unreachable(MemoryBackend):
    async def server_time_ms(self) -> int | None:
        raise BackendUnavailable("connection refused to postgresql://app:s3cret@db/x")


async def test_an_unreachable_backend_is_unhealthy_but_live() -> None:
    scheduler = noop_scheduler(Unreachable())
    async with scheduler:
        health = await scheduler.health()
    assert health.live and not health.healthy
    assert health.backend_reachable is False
    assert "s3cret" not in (health.backend_error or "") and "***" in (health.backend_error or "")
    [problem] = health.problems
    assert problem.startswith("the memory backend cannot be reached: BackendUnavailable")


class Ahead(MemoryBackend):
    """A backend whose clock is five minutes ahead of this host's."""

    async def server_time_ms(self) -> int | None:
        return int(time.time() * 1000) + 300_000


async def test_a_clock_off_past_the_skew_budget_is_unhealthy() -> None:
    scheduler = Scheduler(Ahead(), instance_id="i1")

    async def quiet(ctx: RunContext) -> None:
        pass

    scheduler.add("quiet", "0 0 1 1 *", quiet, history_ttl_ms=100_000)
    async with scheduler:
        for _ in range(50):
            if scheduler.metrics().clock_offset_ms is not None:
                break
            await asyncio.sleep(0.02)
        health = await scheduler.health()
    assert health.clock_budget_ms == 100_000
    assert health.clock_offset_ms is not None and health.clock_offset_ms > 299_000
    assert not health.healthy and health.live
    assert any("past the skew budget of 100000 ms" in p for p in health.problems), health.problems


async def test_a_loop_that_ended_is_named() -> None:
    scheduler = noop_scheduler()
    async with scheduler:
        [timer] = [t for t in scheduler._services.loops.tasks if t.get_name() == "anarchon timer"]
        timer.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        health = await scheduler.health()
    assert not health.live and not health.healthy
    assert health.loops["timer"] is False
    assert "loop(s) not running: timer" in health.problems


async def test_healthz_answers_200_with_json_when_healthy() -> None:
    scheduler = noop_scheduler()
    async with scheduler:
        status, body = await asyncio.to_thread(healthz, scheduler)
        live_status, _ = await asyncio.to_thread(healthz, scheduler, live=True)
    assert status == 200 and live_status == 200
    shape = json.loads(body)
    assert shape["healthy"] is True and shape["status"] in ("ok", "degraded")
    assert shape["backend_reachable"] is True and shape["instance"] == "i1"


def test_timeout_must_be_positive() -> None:
    scheduler = noop_scheduler()
    with pytest.raises(ValueError, match=r"timeout_s=0 must be a number of seconds above 0"):
        asyncio.run(scheduler.health(0))


async def test_timeout_must_be_a_number_of_seconds_up_to_an_hour() -> None:
    scheduler = noop_scheduler()
    async with scheduler:
        for bad in (10**400, math.inf, math.nan, 3601, -1, True, "5"):
            with pytest.raises(InvalidOption) as caught:
                await scheduler.health(bad)  # type: ignore[arg-type]
            text = str(caught.value)
            assert f"timeout_s={bad!r}" in text and "above 0, at most 3600" in text, text
        assert (await scheduler.health(3600)).backend_reachable is True
        assert (await scheduler.health()).backend_reachable is True  # the default


@pytest.mark.slow
async def test_a_handler_blocking_the_loop_turns_health_red_and_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = noop_scheduler()

    async def stuck(ctx: RunContext) -> None:
        time.sleep(3.5)  # noqa: ASYNC251 - a blocking call in an async handler: the whole loop stops

    scheduler.add("stuck", "0 0 1 1 *", stuck)
    answers: list[tuple[int, bytes]] = []

    def probe() -> None:  # an HTTP server's thread, asking while the loop is blocked
        time.sleep(1.8)
        answers.append(healthz(scheduler, timeout_s=0.4))

    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        prober = threading.Thread(target=probe)
        prober.start()
        run = await scheduler.run_now("stuck")
        await asyncio.to_thread(prober.join)
        after = await scheduler.health()
    assert run.status is RunStatus.SUCCEEDED
    [(status, body)] = answers
    assert status == 503, body
    shape = json.loads(body)
    assert shape["live"] is False and shape["backend_reachable"] is None
    [problem] = [p for p in shape["problems"] if "event loop" in p]
    assert "job 'stuck'" in problem and "test_health" in problem, problem
    assert "job 'stuck'" in shape["blocked_by"]
    blocked = [r for r in caplog.records if getattr(r, "action", None) == "loop_blocked"]
    assert blocked and blocked[0].job == "stuck"  # type: ignore[attr-defined]
    assert "stuck" in blocked[0].getMessage()
    # Once the loop runs again, the late probe is a warning, not a problem.
    assert after.live, after.problems
