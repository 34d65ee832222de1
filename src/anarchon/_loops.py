"""The scheduler's long-lived loops, owned by one :class:`asyncio.TaskGroup`.

A task group must be left by the task that entered it, and :meth:`Scheduler.start` and
:meth:`Scheduler.stop` may run in different tasks (the stop even runs in a task of its own). So
one task per scheduler, the *owner*, holds ``async with asyncio.TaskGroup()``; :class:`Loops` is
the async context manager that starts the owner and, on exit, tells it to end and waits for it
(APScheduler 4's ``AsyncScheduler.__aenter__`` enters its task group the same way, in its exit
stack). The scheduler enters it in its start's exit stack before the first loop, so it is left
after the last: each loop is still stopped at its own place in the stop's order (the timer
first, the lease keeper after the drain), and by the time the group ends nothing is left in it.
No loop outlives the stop, and a loop that ignores its cancellation is left behind, logged,
as :func:`~._supervisor.cancel_and_wait` leaves it, instead of holding the stop for ever.

What ends a loop (each runs :func:`~._supervisor.supervised` in a task of its own, which the
group's task for it *holds*):

* an ``Exception`` is logged (``loop_failed``) and the loop restarted after a pause that grows
  while it keeps failing;
* a ``CancelledError`` its task was not asked for (a driver that turns a timeout into one) is
  treated the same way (before, it ended the loop for the rest of the process, unlogged);
* ``KeyboardInterrupt`` and ``SystemExit`` leave the event loop from the loop's task, as
  asyncio always raises them, and end that loop (logged when the event loop runs again);
* any other ``BaseException`` ends that loop alone, logged (``loop_failed``).

The group's task for a loop never fails: it waits for the loop's own task and logs how it
ended. A task group cancels every task in it (and its owner) when one fails; that would take
the other loops down with one, the lease keeper among them, whose handlers would then lose their
leases while they run. A loop that ended shows in :meth:`Scheduler.health` (``loop(s) not
running``).

Not in the group: the guard (it must outlive the cancellation of every task at the end of
``asyncio.run()``, and it awaits the stop that ends the group), the short tasks the scheduler
spawns (claims, catch-up, takeovers' hooks: settled at the stop's step 2, and begun while it
drains), the lease keeper's thread (an event loop of its own) and the backends' change feeds
(started and stopped by the backend).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from ._supervisor import cancel_and_wait, supervised
from .logs import Action, log_fields

__all__ = ["Loops"]

logger = logging.getLogger("anarchon.scheduler")

# On exit, the owner gets this long to leave its group once every loop has ended (s).
END_S: Final = 5.0


class Loops:
    """The scheduler's long-lived loops in one task group, held by a task of its own.

    :param sleep: the pause before a failed loop is restarted (the scheduler's clock's).
    """

    def __init__(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        self._sleep = sleep
        #: The group's task of each loop started, named ``anarchon <loop>``, in start order.
        self.tasks: list[asyncio.Task[None]] = []
        self._group: asyncio.TaskGroup | None = None
        self._owner: asyncio.Task[None] | None = None
        self._entered: asyncio.Future[None] | None = None
        self._end: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Loops:
        """Start the owner and wait until it holds the group."""
        assert self._owner is None, "the loops of a scheduler are entered once"
        loop = asyncio.get_running_loop()
        self._entered, self._end = loop.create_future(), loop.create_future()
        self._owner = loop.create_task(self._own(), name="anarchon loops")
        try:
            # asyncio.wait: a start cancelled here leaves the owner and its future alone.
            await asyncio.wait([self._entered, self._owner], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self._close()  # the exit stack does not know of it yet
            raise
        if self._group is None:  # the owner ended before it held the group (cancelled)
            await self._close()
            raise RuntimeError("the scheduler's task group did not start")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """End the group (see :meth:`_close`)."""
        await self._close()

    async def _own(self) -> None:
        """The owner: hold the group until :meth:`_close` says to end. Cancelled (the end of
        ``asyncio.run()`` cancels every task), the group cancels its loops and waits for them."""
        assert self._entered is not None and self._end is not None
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                if not self._entered.done():
                    self._entered.set_result(None)
                await self._end
        except Exception:  # an exception group: a loop's holder failed, which it never does
            logger.exception(
                "the scheduler's loops failed", extra=log_fields(Action.INTERNAL_ERROR)
            )

    def start(self, name: str, loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run ``loop()`` supervised (see the module) in the group; return the group's task for
        it, named ``anarchon <name>``: cancelled, it cancels the loop and ends when the loop
        has."""
        assert self._group is not None, "Loops.start() before the group was entered"
        task = self._group.create_task(self._hold(name, loop), name=f"anarchon {name}")
        self.tasks.append(task)
        return task

    async def _hold(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """The group's task for one loop: run it in a task of its own and wait for that, so
        that what ends the loop is never the group's error (see the module)."""
        inner = asyncio.get_running_loop().create_task(
            supervised(name, loop, self._sleep), name=f"anarchon {name} (inner)"
        )
        cancelled = False
        while not inner.done():
            try:
                await asyncio.wait([inner])
            except asyncio.CancelledError:
                cancelled = True  # passed on: each cancellation of this task cancels the loop's
                inner.cancel()
        _ended(name, inner)
        if cancelled:
            raise asyncio.CancelledError

    async def _close(self) -> None:
        """Tell the owner to end its group and wait for it. Every loop was stopped by then, each
        at its place in the stop's order; one still running is cancelled (bounded), and one
        that ignores its cancellation is left behind with the owner (logged), not waited for."""
        owner, end = self._owner, self._end
        if owner is None or end is None:
            return
        if not end.done():
            end.set_result(None)
        await cancel_and_wait([task for task in self.tasks if not task.done()])
        if all(task.done() for task in self.tasks):
            # asyncio.wait, not await: an owner cancelled (the loop's end) must not look like a
            # cancellation of the stop.
            await asyncio.wait([owner], timeout=END_S)


def _ended(name: str, inner: asyncio.Future[None]) -> None:
    """Log how a loop's own task ended, unless it returned or was cancelled."""
    if inner.cancelled():
        return
    exc = inner.exception()
    if exc is None:
        return
    interrupt = isinstance(exc, KeyboardInterrupt | SystemExit)
    logger.log(
        logging.WARNING if interrupt else logging.ERROR,
        "background loop %r ended by %s; it is not restarted",
        name,
        type(exc).__name__,
        exc_info=None if interrupt else exc,
        extra=log_fields(Action.LOOP_FAILED, loop=name),
    )
