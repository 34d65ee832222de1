"""anarchon.integrations.starlette.lifespan in one process, entered as Starlette enters a
lifespan (``async with lifespan(app)``): the order of the application's own lifespan and the
scheduler's, the state passed on, a scheduler made per start by a function, and the errors for
what is not a scheduler; and, through Starlette's own ASGI lifespan, the guide's advice for
mounted applications. The real servers are in test_asgi.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from anarchon import InvalidOption, RunContext, Scheduler, SchedulerStateError
from anarchon.integrations.starlette import lifespan
from anarchon.testing import MemoryBackend
from tests.docs.blocks import block
from tests.redis.servers import RedisServer

APP = object()  # the application object Starlette passes; the lifespan only hands it on


def make_scheduler(events: list[str]) -> Scheduler:
    scheduler = Scheduler(MemoryBackend(), instance_id="web-1")

    @scheduler.job("report", "0 6 * * *")
    async def report(ctx: RunContext) -> None:
        opened = "pool opened" in events and "pool closed" not in events
        events.append(f"report ran, pool {'open' if opened else 'closed'}")

    return scheduler


def resources_for(events: list[str]) -> Any:
    @asynccontextmanager
    async def resources(app: object) -> AsyncIterator[dict[str, Any]]:
        assert app is APP
        events.append("pool opened")
        try:
            yield {"pool": "the pool"}
        finally:
            events.append("pool closed")

    return resources


async def test_the_scheduler_runs_inside_the_apps_own_lifespan() -> None:
    events: list[str] = []
    scheduler = make_scheduler(events)
    running = lifespan(scheduler, resources_for(events))
    async with running(APP) as state:
        assert scheduler.running and events == ["pool opened"]
        assert state == {"pool": "the pool"}  # the app's lifespan state, passed on
        run = await scheduler.run_now("report")
    assert run.status == "succeeded" and not scheduler.running
    assert events == ["pool opened", "report ran, pool open", "pool closed"]
    with pytest.raises(SchedulerStateError, match="can start only once"):
        async with running(APP):
            pass


async def test_the_defaults_no_app_lifespan() -> None:
    scheduler = make_scheduler([])
    async with lifespan(scheduler)(APP) as state:
        assert state is None and scheduler.running
    assert not scheduler.running


async def test_a_function_makes_a_scheduler_for_each_start() -> None:
    made: list[Scheduler] = []

    def factory() -> Scheduler:
        made.append(make_scheduler([]))
        return made[-1]

    running = lifespan(factory)
    for _ in range(2):
        async with running(APP):
            assert made[-1].running
    assert len(made) == 2 and not any(s.running for s in made)


async def test_a_failed_start_leaves_the_apps_lifespan_closed() -> None:
    events: list[str] = []
    scheduler = make_scheduler(events)
    await scheduler.stop()  # a stopped scheduler cannot start
    with pytest.raises(SchedulerStateError):
        async with lifespan(scheduler, resources_for(events))(APP):
            pass
    assert events == ["pool opened", "pool closed"]


async def test_what_is_not_a_scheduler_is_refused() -> None:
    with pytest.raises(InvalidOption, match="must be an anarchon Scheduler or a function"):
        lifespan("scheduler")  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="app_lifespan=42 must be a lifespan"):
        lifespan(Scheduler(MemoryBackend()), 42)  # type: ignore[arg-type]
    running = lifespan(lambda: "nope")  # type: ignore[arg-type, return-value]
    with pytest.raises(InvalidOption, match="returned 'nope', not an anarchon Scheduler"):
        async with running(APP):
            pass


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[None]:
    """``app``'s ASGI lifespan run as uvicorn runs it: startup, the block, shutdown."""
    to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    running = asyncio.create_task(app(scope, to_app.get, from_app.put))
    await to_app.put({"type": "lifespan.startup"})
    assert (await from_app.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        assert (await from_app.get())["type"] == "lifespan.shutdown.complete"
        await running


async def test_the_lifespan_goes_on_the_served_app_not_a_mounted_one() -> None:
    """docs/guides/fastapi.md: Starlette never enters a mounted application's lifespan, so a
    scheduler given to one never starts; on the application served, with others mounted in
    it, it runs."""
    from fastapi import FastAPI

    unstarted = make_scheduler([])
    api = FastAPI(lifespan=lifespan(unstarted))
    app = FastAPI()
    app.mount("/api", api)
    async with served(app):
        await asyncio.sleep(0.1)
        assert not unstarted.running  # what the guide warns about

    scheduler = make_scheduler([])
    guide: dict[str, Any] = {"scheduler": scheduler}
    exec(block("docs/guides/fastapi.md", "mounted-app"), guide)
    async with served(guide["app"]):
        assert scheduler.running
        assert (await scheduler.run_now("report")).status == "succeeded"
    assert not scheduler.running


async def test_a_backend_out_of_reach_at_start_is_tried_again(tmp_path: Path) -> None:
    """The application starts without the scheduler while its backend (a private Redis) does
    not answer, and the scheduler starts once it does; an application that stops meanwhile
    stops the retries (test_backend_down.py runs this under real servers)."""
    redis = RedisServer(tmp_path / "redis")  # not started yet
    idle = Scheduler(redis.url)
    began = time.monotonic()
    async with lifespan(idle)(APP):
        assert not idle.running
    assert not idle.running and time.monotonic() - began < 5  # no wait for a retry
    scheduler = Scheduler(redis.url)  # every option at its default
    try:
        async with lifespan(scheduler)(APP):
            assert not scheduler.running
            redis.start()
            for _ in range(200):  # the retry after the start failed, within 20 s
                if scheduler.running:
                    break
                await asyncio.sleep(0.1)
            assert scheduler.running
        assert not scheduler.running
    finally:
        redis.stop()


async def test_a_start_tried_again_keeps_one_instance_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry of the start names the same default instance id, and so does the start that
    succeeds: one worker's log lines name one instance (each retry used to draw a new suffix)."""
    redis = RedisServer(tmp_path / "redis")  # not started yet
    scheduler = Scheduler(redis.url)  # every option at its default
    caplog.set_level("INFO", logger="anarchon.scheduler")

    def named(action: str) -> list[str]:
        return [str(r.args[0]) for r in caplog.records if getattr(r, "action", "") == action]  # type: ignore[index]

    try:
        async with lifespan(scheduler)(APP):
            for _ in range(100):  # failed at once, then 1 s and 2 s later: within 10 s
                if len(named("start_failed")) >= 3:
                    break
                await asyncio.sleep(0.1)
            redis.start()
            for _ in range(400):
                if scheduler.running:
                    break
                await asyncio.sleep(0.1)
            assert scheduler.running
            ids = {*named("start_failed"), *named("started"), scheduler.instance_id}
            assert len(named("start_failed")) >= 3
            assert ids == {scheduler.instance_id}, ids
    finally:
        redis.stop()
