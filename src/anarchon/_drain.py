"""The executor's stop: :class:`Drain`, a mixin of :class:`~anarchon._runner.RunExecutor`.

:meth:`Drain.drain` lets running handlers finish within ``grace_ms`` (or until
:meth:`Drain.hurry`) while their leases are still renewed, then cancels what is left and hands it
over (:meth:`Drain._release`; or records it failed), within :data:`CANCEL_GRACE_S`. Runs cancelled
from outside while their handler ran (the event loop ending under the scheduler) are settled
there too: a plain handler's thread that still works keeps its lease and is waited for within
the grace, and one that returns before the stop (an orphan) has its result recorded then. A
handler that ignores its cancellation is not handed over (:meth:`Drain.stubborn`).

Not on the per-run path, but for :meth:`Drain._release` of a run won after the grace and the
watch of an orphan's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

from ._active import ActiveRun
from ._active import log_run as _log
from ._handler import thread_outcome
from ._models import Run, RunStatus
from ._supervisor import consume
from .backend import HANDED_OVER, LeaseBackend
from .errors import BackendError
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._clock import Clock
    from ._handler import Outcome
    from ._keeper import LeaseKeeper
    from ._metrics import Counters
    from ._results import ResultRecorder
    from .backend import Backend

__all__ = ["CANCEL_GRACE_S", "HANDED_OVER_FATE", "LEFT_TO_EXPIRE", "STOPPED", "Drain"]

logger = logging.getLogger("anarchon.scheduler")


STOPPED: Final = "stopped"
# The fates of a run that recorded no result on stop (ActiveRun.fate), named as their log actions.
HANDED_OVER_FATE: Final = Action.HANDED_OVER.value
LEFT_TO_EXPIRE: Final = Action.LEFT_TO_EXPIRE.value
# After the grace period, cancelled handlers and their hand-over calls get this long (s).
CANCEL_GRACE_S: Final = 10.0


class Drain:
    """The executor's stop (a mixin of :class:`~anarchon._runner.RunExecutor`, whose fields
    these are): grace, cancellation, hand-over, the runs cancelled from outside and their
    threads."""

    backend: Backend
    clock: Clock
    counters: Counters
    grace_ms: int
    active: dict[str, ActiveRun]
    keeper: LeaseKeeper | None
    closed: bool
    results: ResultRecorder
    abandoned: list[ActiveRun]
    _settling: set[asyncio.Task[None]]
    _hurried: asyncio.Event

    if TYPE_CHECKING:

        def _cancel(self, active: ActiveRun, reason: str) -> None:
            """Stop waiting for the handler of ``active`` (:class:`RunExecutor`'s)."""

        async def _record(self, active: ActiveRun, outcome: Outcome) -> Run | None:
            """Record ``outcome`` (:class:`RunExecutor`'s)."""

    async def _release(self, active: ActiveRun) -> Run | None:
        """Hand the run over on stop (a lease backend, ``handover`` on), else record it failed
        (``stopped: ...``); the run recorded, or None (its :attr:`ActiveRun.fate` says why)."""
        ticket = active.ticket
        backend = self.backend
        if isinstance(backend, LeaseBackend) and active.job.policy.handover:
            try:
                await backend.release(ticket, HANDED_OVER)
            except BackendError as exc:
                active.fate = Action.HANDOVER_FAILED.value
                _log(
                    logging.WARNING,
                    Action.HANDOVER_FAILED,
                    ticket,
                    "could not hand %s over (%s); a backup takes over at lease expiry",
                    ticket.job,
                    exc,
                )
                return None
            active.fate = HANDED_OVER_FATE
            self.counters.count(ticket.job, "handed_over")
            _log(
                logging.INFO,
                Action.HANDED_OVER,
                ticket,
                "handed %s attempt %d over to a backup",
                ticket.job,
                ticket.attempt,
            )
            return None
        reason = (
            f"{STOPPED}: the scheduler stopped before the handler finished "
            f"(grace_ms={self.grace_ms})"
        )
        return await self.results.finish(active, RunStatus.FAILED, reason, None)

    def hurry(self) -> None:
        """End the grace period now (a second SIGINT or SIGTERM): :meth:`drain`, running or to
        come, stops waiting and cancels and hands over what still runs."""
        self._hurried.set()

    async def drain(self, deadline_ms: int) -> None:
        """Let running handlers finish until ``deadline_ms`` (monotonic) or :meth:`hurry`, while
        their leases are still renewed; then cancel what is left and hand it over (or record it
        failed)."""
        # Waits on the tasks themselves: a result future may be cancelled by whoever awaited
        # it (a catch-up), while the run goes on.
        pending = [a.task for a in self.active.values() if a.task is not None]
        left_s = (deadline_ms - self.clock.monotonic_ms()) / 1000
        if pending and left_s > 0 and not self._hurried.is_set():
            # The clock's sleep; and never longer than the grace in real time, so that a test
            # clock nobody moves cannot make stop() hang.
            await _all_or_sleep(pending, self.clock.sleep(left_s), left_s, self._hurried)
        self.closed = True
        leftover = [a for a in self.active.values() if a.task is not None and not a.task.done()]
        for active in leftover:
            self._cancel(active, HANDED_OVER)
        if self.abandoned:
            await self._settle_abandoned(deadline_ms)
        if self._settling:  # orphaned threads that returned: their results being recorded
            settling = list(self._settling)
            await _all_or_sleep(settling, self.clock.sleep(CANCEL_GRACE_S), CANCEL_GRACE_S)
        if not leftover:
            return
        # Give the cancelled handlers and the release/finish calls a bounded time; a call
        # still stuck after that (an unreachable backend) is abandoned: the lease expires
        # and a backup takes the run over.
        tasks = [a.task for a in leftover if a.task is not None]
        await _all_or_sleep(tasks, self.clock.sleep(CANCEL_GRACE_S), CANCEL_GRACE_S)
        # A handler still in its code swallowed the cancellation and works on. Handing its run
        # over now would let a backup run the slot beside it: its lease stays renewed until it
        # ends (a process that exits meanwhile ends it; the lease then expires).
        for active in filter(_still_in_handler, leftover):
            self.counters.cancel_ignored += 1
            _log(
                logging.WARNING,
                Action.CANCEL_IGNORED,
                active.ticket,
                "job %s attempt %d ignores its cancellation (it caught CancelledError and works "
                "on): not handed over; its lease stays renewed while it runs, and expires if the "
                "process exits first. Let handlers end on CancelledError",
                active.job.name,
                active.ticket.attempt,
            )
        for active in leftover:
            if active.task is not None and not active.task.done() and not active.in_handler:
                active.task.cancel()  # stuck in a release or finish call: abandoned

    async def _settle_abandoned(self, deadline_ms: int) -> None:
        """Settle the runs cancelled from outside (:attr:`abandoned`): wait for the plain
        handlers' threads that still work (:meth:`_await_threads`), and hand the others over
        (or record them failed), bounded as the cancelled handlers' hand-over is."""
        abandoned, self.abandoned = self.abandoned, []
        working = [a for a in abandoned if a.thread is not None and not a.thread.cancelled()]
        gone = [a for a in abandoned if a not in working]
        if gone:
            await self._hand_over_abandoned(gone)
        if working:
            await self._await_threads(working, deadline_ms)

    async def _hand_over_abandoned(self, abandoned: list[ActiveRun]) -> None:
        """Hand over (or record failed) runs cancelled from outside, bounded as the cancelled
        handlers' hand-over is."""
        releases = [asyncio.ensure_future(self._release(active)) for active in abandoned]
        done, pending = await asyncio.wait(releases, timeout=CANCEL_GRACE_S)
        for release in pending:
            release.cancel()  # an unreachable backend: the lease expires
        for release in done:
            failed = release.exception()
            if failed is not None:
                logger.error(
                    "handing over a run cancelled from outside failed",
                    exc_info=failed,
                    extra=log_fields(Action.INTERNAL_ERROR),
                )

    async def _await_threads(self, working: list[ActiveRun], deadline_ms: int) -> None:
        """Wait for the threads of plain handlers whose runs were cancelled from outside (the
        event loop ending under the scheduler) until ``deadline_ms`` (monotonic: the grace),
        their leases still renewed, and record each result, as a stop does for a thread that
        ends within the grace. A thread cannot be stopped, so handing its run over at once
        would let a backup run the slot beside it. A thread still working after the grace
        keeps the stop's rule: not handed over, its lease left to expire."""
        calls = [a.thread for a in working if a.thread is not None]
        left_s = (deadline_ms - self.clock.monotonic_ms()) / 1000
        if left_s > 0 and not all(call.done() for call in calls):
            # Never cancelled from here (that would cancel a call not begun): left to settle.
            waits = [asyncio.wrap_future(call) for call in calls]
            for wait in waits:
                wait.add_done_callback(consume)
            await _all_or_sleep(waits, self.clock.sleep(left_s), left_s)
        for active in working:
            call = active.thread
            assert call is not None
            self._stop_keeping(active)
            if not call.done():
                active.fate = LEFT_TO_EXPIRE
                _log(
                    logging.WARNING,
                    Action.LEFT_TO_EXPIRE,
                    active.ticket,
                    "job %s attempt %d: its thread still runs after the grace period (the event "
                    "loop ended under the scheduler); not handed over: a backup takes the run "
                    "over when its lease expires",
                    active.job.name,
                    active.ticket.attempt,
                )
                continue
            outcome = thread_outcome(active, call)
            if outcome is None:
                continue  # the handler saw its lease lost: left to a backup
            try:
                await self._record(active, outcome)
            except Exception:
                logger.exception(
                    "recording the result of a run cancelled from outside failed",
                    extra=log_fields(Action.INTERNAL_ERROR),
                )

    def _watch_orphan(self, active: ActiveRun) -> None:
        """When the thread of ``active`` (a run whose task was cancelled from outside while its
        plain handler worked) returns, settle it on the event loop (:meth:`_settle_orphan`).
        Before, its lease was renewed, and its slot held, until the scheduler stopped."""
        call = active.thread
        assert call is not None
        loop = asyncio.get_running_loop()

        def returned(_: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the stop settled it
                loop.call_soon_threadsafe(self._settle_orphan, active)

        call.add_done_callback(returned)

    def _settle_orphan(self, active: ActiveRun) -> None:
        """The thread of an orphaned run returned: record its result now (:meth:`drain`
        waits for the recording), unless a stop has taken the run over already."""
        if active not in self.abandoned:
            return  # drain() waits for it and records it
        self.abandoned.remove(active)
        task = asyncio.ensure_future(self._await_threads([active], self.clock.monotonic_ms()))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _stop_keeping(self, active: ActiveRun) -> None:
        """Stop renewing ``active``'s lease (an orphaned thread's, kept until now)."""
        if self.keeper is not None and active.kept:
            self.keeper.discard(active)
        active.ctx._deadline = None

    def stubborn(self) -> list[asyncio.Task[Any]]:
        """Runs whose handlers ignored their cancellation and still work (after :meth:`drain`)."""
        return [a.task for a in self.active.values() if _still_in_handler(a) and a.task]


def _still_in_handler(active: ActiveRun) -> bool:
    """The run's task is alive and still inside the handler's code."""
    return active.in_handler and active.task is not None and not active.task.done()


async def _all_or_sleep(
    tasks: Sequence[asyncio.Future[Any]],
    sleep: Coroutine[Any, Any, None],
    limit_s: float,
    until: asyncio.Event | None = None,
) -> None:
    """Wait until every task is done, ``sleep`` (a clock's sleep) ends, ``limit_s`` pass, or
    ``until`` is set."""
    waits: set[asyncio.Future[Any]] = {
        asyncio.ensure_future(sleep),
        asyncio.ensure_future(asyncio.wait(tasks)),
    }
    if until is not None:
        waits.add(asyncio.ensure_future(until.wait()))
    try:
        await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
