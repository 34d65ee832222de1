"""``wait_unless`` (the lease keeper's renewal against its deadline, the process's start against a
stop signal): waits for a task unless another awaitable ends first, cancels that other either
way, and never touches the task."""

from __future__ import annotations

import asyncio

from anarchon._supervisor import wait_unless


async def _rival(started: list[asyncio.Task[object]], seconds: float) -> None:
    task = asyncio.current_task()
    assert task is not None
    started.append(task)
    await asyncio.sleep(seconds)


async def test_the_task_done_first_is_true_and_the_other_cancelled() -> None:
    rivals: list[asyncio.Task[object]] = []
    task = asyncio.ensure_future(asyncio.sleep(0, "done"))
    assert await wait_unless(task, _rival(rivals, 3600)) is True
    assert task.result() == "done"
    await asyncio.sleep(0)
    assert rivals[0].cancelled()


async def test_the_other_done_first_is_false_and_the_task_left_running() -> None:
    rivals: list[asyncio.Task[object]] = []
    task = asyncio.ensure_future(asyncio.sleep(3600))
    assert await wait_unless(task, _rival(rivals, 0)) is False
    assert not task.done()  # the caller's to cancel
    assert rivals[0].done() and not rivals[0].cancelled()
    task.cancel()


async def test_a_cancelled_wait_cancels_the_other_not_the_task() -> None:
    rivals: list[asyncio.Task[object]] = []
    task = asyncio.ensure_future(asyncio.sleep(3600))
    waiting = asyncio.ensure_future(wait_unless(task, _rival(rivals, 3600)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.wait({waiting})
    await asyncio.sleep(0)
    assert waiting.cancelled() and rivals[0].cancelled()
    assert not task.done()
    task.cancel()
