"""Gather calls made in the same moment into one backend call.

When thousands of jobs share a slot, their results and lease renewals fall due together; sending
them as one batch turns thousands of round trips (and, on SQLite, thousands of fsyncs) into a few.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

In = TypeVar("In")
Out = TypeVar("Out")

# A larger batch would hold one transaction (SQLite's write lock) for too long.
MAX_BATCH = 2_000


class Coalescer(Generic[In, Out]):
    """Callers ``await submit(item)``; items submitted in one event-loop iteration go to ``call``
    together. ``call`` returns one result per item, in order: a value, or an exception that is
    raised to that item's caller. If ``call`` itself raises, every caller of the batch gets it."""

    def __init__(self, call: Callable[[Sequence[In]], Awaitable[Sequence[Out | BaseException]]]):
        self._call = call
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._tasks: set[asyncio.Future[None]] = set()

    async def submit(self, item: In) -> Out:
        """Queue ``item`` for the next batch and wait for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Out] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((item, future))
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_BATCH):
            task = asyncio.ensure_future(self._send(pending[start : start + MAX_BATCH]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        try:
            results = await self._call([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
