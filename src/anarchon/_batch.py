"""Gather calls made in the same moment into one backend call, and keep one bad item from failing
the rest of its batch.

When thousands of jobs share a slot, their results and lease renewals fall due together; sending
them as one batch turns thousands of round trips (and, on SQLite, thousands of fsyncs) into a few.
A batch is only as good as its worst item, though: a request the backend refuses outright (a
number out of its range, a bug) would fail every claim, result or renewal beside it.
:func:`isolate` splits such a batch in halves until only the bad item fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .errors import BackendUnavailable
from .logs import Action, log_fields

__all__ = ["Coalescer", "isolate"]

logger = logging.getLogger("anarchon.scheduler")

In = TypeVar("In")
Out = TypeVar("Out")

# A larger batch would hold one transaction (SQLite's write lock) for too long.
MAX_BATCH = 2_000
# A hold keeps at most this many items back: each held result keeps its run alive (task,
# coroutine, records), and the garbage collector walks them all at every full pass.
MAX_HELD = 5 * MAX_BATCH
# Item failures logged with their traceback per batch; the rest are counted in one line (a
# backend that refuses everything would otherwise log every item of a burst).
MAX_LOGGED = 5


async def isolate(
    call: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
    items: Sequence[In],
    job_of: Callable[[In], str],
    what: str,
) -> list[Out | Exception]:
    """``call(items)``, one result per item; if the call fails with anything but
    :class:`~anarchon.errors.BackendUnavailable`, call again with each half, down to single
    items, so that only the item the backend refuses gets the error (returned in its place and
    logged with its job). :class:`~anarchon.errors.BackendUnavailable` is raised as it is: the
    backend is down for everyone, and the caller retries the whole batch (every call is
    idempotent per token)."""
    failed: list[str] = []
    results = await _split(call, items, job_of, what, failed)
    if len(failed) > MAX_LOGGED:
        logger.error(
            "%s failed for %d items in all (jobs %s ...); the others of the batch went through",
            what,
            len(failed),
            ", ".join(failed[:20]),
            extra=log_fields(Action.BATCH_ITEM_FAILED, failed[0]),
        )
    return results


async def _split(
    call: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
    items: Sequence[In],
    job_of: Callable[[In], str],
    what: str,
    failed: list[str],
) -> list[Out | Exception]:
    try:
        return list(await call(items))
    except BackendUnavailable:
        raise
    except Exception as exc:
        if len(items) > 1:
            middle = len(items) // 2
            left = await _split(call, items[:middle], job_of, what, failed)
            return left + await _split(call, items[middle:], job_of, what, failed)
        for item in items:
            job = job_of(item)
            failed.append(job)
            if len(failed) <= MAX_LOGGED:
                logger.error(
                    "%s of job %s failed; the other items of its batch are not affected: %s",
                    what,
                    job,
                    exc,
                    exc_info=exc,
                    extra=log_fields(Action.BATCH_ITEM_FAILED, job),
                )
        return [exc for _ in items]


class Coalescer(Generic[In, Out]):
    """Callers ``await submit(item)``; items submitted in one event-loop iteration go to ``call``
    together. ``call`` returns one result per item, in order: a value, or an exception that is
    raised to that item's caller. If ``call`` itself fails, the batch is split (:func:`isolate`)
    so that only the item at fault gets the error; a
    :class:`~anarchon.errors.BackendUnavailable` reaches every caller of the batch."""

    def __init__(
        self,
        call: Callable[[Sequence[In]], Awaitable[Sequence[Out | BaseException]]],
        job_of: Callable[[In], str],
        what: str,
    ):
        self._call = call
        self._job_of = job_of
        self._what = what
        # Two parallel lists, not a list of (item, future) pairs: in a burst thousands wait
        # at once, and each pair would be one more object for the garbage collector to walk.
        self._items: list[In] = []
        self._futures: list[asyncio.Future[Out]] = []
        self._tasks: set[asyncio.Future[None]] = set()
        self._held = 0

    @property
    def held(self) -> bool:
        """Items are kept back (see :meth:`hold`)."""
        return self._held > 0

    def hold(self) -> None:
        """Keep the items submitted from now on back until :meth:`release` (holds nest),
        :meth:`flush`, or until :data:`MAX_HELD` wait."""
        self._held += 1

    def release(self) -> None:
        """End one :meth:`hold`; the last one sends what was kept back, in batches."""
        self._held -= 1
        if not self._held and self._items:
            asyncio.get_running_loop().call_soon(self.flush)

    def submit(self, item: In) -> asyncio.Future[Out]:
        """Queue ``item`` for the next batch (kept back while held); await the returned future
        for its result.

        A plain function returning the future, not a coroutine: in a burst, ten thousand
        results wait at once, and each coroutine would be one more object for the garbage
        collector to walk while they wait."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Out] = loop.create_future()
        if not self._items and not self._held:
            loop.call_soon(self.flush)
        elif len(self._items) == MAX_HELD - 1:
            loop.call_soon(self.flush)  # held or not, MAX_HELD waiting go now
        self._items.append(item)
        self._futures.append(future)
        return future

    def flush(self) -> None:
        """Send every item waiting, those kept back by a hold too, in batches of at most
        MAX_BATCH."""
        items, futures = self._items, self._futures
        if not items:
            return
        self._items, self._futures = [], []
        whole = len(items) <= MAX_BATCH  # the usual case: no copies
        for start in range(0, len(items), MAX_BATCH):
            end = start + MAX_BATCH
            batch = self._send(
                items if whole else items[start:end], futures if whole else futures[start:end]
            )
            task = asyncio.ensure_future(batch)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[In], futures: list[asyncio.Future[Out]]) -> None:
        try:
            results = await isolate(self._call, items, self._job_of, self._what)
        except BaseException as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for future, result in zip(futures, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
