"""A run this instance has under way: :class:`ActiveRun`, the record that the executor
(:mod:`._runner`), the lease keeper (:mod:`._keeper`), the results (:mod:`._results`) and the
spans (:mod:`.otel`) share; :data:`new_active`, its constructor by plain stores (one per run,
thousands alive at once); and :func:`log_run`, the log record about a run's ticket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ._context import RunContext
from ._frozen import maker
from ._job import Job
from ._models import Run
from .backend import Ticket
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._runner import RunExecutor

__all__ = ["ActiveRun", "log_run", "new_active"]

logger = logging.getLogger("anarchon.scheduler")


@dataclass(eq=False, slots=True)
class ActiveRun:
    """An attempt this instance is running."""

    job: Job
    ticket: Ticket
    ctx: RunContext
    task: asyncio.Task[Run | None] | None = None
    in_handler: bool = False
    cancel_reason: str | None = None
    reserved: bool = False
    """A handler thread is reserved for this run (plain handlers) and not yet used."""
    thread_running: bool = False
    """The run stopped waiting for its handler's thread, which still runs (plain handlers)."""
    thread: concurrent.futures.Future[Any] | None = None
    """The call on its handler's thread (plain handlers), once submitted: waited for by the
    stop when the run's task was cancelled from outside while it ran (see
    :attr:`RunExecutor.abandoned`)."""
    fate: str | None = None
    """What became of a run that recorded no result on stop: ``handed_over``,
    ``handover_failed`` or ``left_to_expire`` (what its span says)."""
    # Lease bookkeeping, on the monotonic clock (ms): when to renew next (the keeper's), when
    # the lease surely ends unless renewed, and whether the keeper renews it.
    renew_at: int = 0
    deadline: int = 0
    kept: bool = False
    executor: RunExecutor | None = field(default=None, repr=False)
    """The executor running it: the run leaves its runs in progress when its task is done."""
    _result: asyncio.Future[Run | None] | None = field(default=None, repr=False)

    @property
    def result(self) -> asyncio.Future[Run | None]:
        """The recorded run (None if none was recorded: handed over, lease lost, refused), or
        what the run's task raised. Made when first asked for: a burst's runs need none."""
        future = self._result
        if future is None:
            future = self._result = asyncio.get_running_loop().create_future()
            if self.task is not None and self.task.done():
                _settle(future, self.task)
        return future

    def ended(self, task: asyncio.Task[Run | None]) -> None:
        """The run's task is done (a done callback): leave the executor's runs in progress,
        give back an unused thread reservation, settle :attr:`result` if it was asked for.

        Here rather than in the task's own ``finally``: a task cancelled before its first step
        never runs its coroutine. The run itself is the callback (``__call__``): no object made
        per run for it (a closure makes three, a bound method one), and ten thousand runs of
        one slot are all alive at once."""
        executor = self.executor
        if executor is not None:
            executor.active.pop(self.ticket.run_id, None)
            if self.reserved:
                self.reserved = False
                executor.threads.unreserve()
        if self._result is not None and not self._result.done():
            _settle(self._result, task)

    __call__ = ended

    def set_deadline(self, deadline: int) -> None:
        """The lease surely ends at ``deadline`` (monotonic ms) unless renewed; any thread."""
        self.deadline = deadline
        self.ctx._deadline = deadline


new_active: Final = maker(ActiveRun)
"""``ActiveRun(...)`` with the same arguments, the same object, built by plain stores into a
bare instance (:func:`anarchon._frozen.maker`): one per run, thousands at once, in about half
the time of the class's call (tests/unit/test_run_context.py checks every slot against the
constructor's)."""


def _settle(future: asyncio.Future[Run | None], task: asyncio.Task[Run | None]) -> None:
    """Give ``future`` the outcome of the done ``task``.

    An exception reaches whoever awaits ``future``; the task still reports it as the loop does
    for a task nobody awaited (taking it from the task marks it retrieved)."""
    if task.cancelled():
        future.cancel()
        return
    exc = task.exception()
    if exc is None:
        future.set_result(task.result())
        return
    future.set_exception(exc)
    future.exception()  # retrieved: reported below, once
    task.get_loop().call_exception_handler(
        {"message": "Task exception was never retrieved", "exception": exc, "future": task}
    )


def log_run(
    level: int,
    action: Action,
    ticket: Ticket,
    msg: str,
    *args: Any,
    exc_info: BaseException | None = None,
    **more: Any,
) -> None:
    """Log ``msg`` at ``level`` on ``anarchon.scheduler``, with ``action``'s fields about the
    run of ``ticket`` (:func:`~anarchon.logs.log_fields`) and ``more``."""
    logger.log(
        level, msg, *args, exc_info=exc_info, extra=log_fields(action, ticket=ticket, **more)
    )
