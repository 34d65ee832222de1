"""On every backend, with every option at its default: start() and stop() in tasks of their own
leave no task pending, the scheduler's loops (owned by one task group) and the backend's alike."""

from __future__ import annotations

import asyncio

from anarchon import RunContext, Scheduler
from tests.harness import Namespace


async def test_stop_leaves_no_task_pending(ns: Namespace) -> None:
    ran = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        ran.set()

    before = asyncio.all_tasks()
    scheduler = Scheduler(ns.make(), instance_id="owner")
    scheduler.add("work", "* * * * * *", work)
    await asyncio.ensure_future(scheduler.start())
    loops = list(scheduler._services.loops.tasks)
    assert loops and not any(task.done() for task in loops)
    await asyncio.wait_for(ran.wait(), 10)  # a slot ran
    await asyncio.ensure_future(scheduler.stop())
    assert all(task.done() for task in loops)
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert not left, sorted(task.get_name() for task in left)
