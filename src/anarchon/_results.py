"""Recording results: each run's ``finish``, batched with others', held while a burst starts,
retried while the backend is unavailable, and logged.

The executor (:mod:`._runner`) hands every result it has to :class:`ResultRecorder`: the
results of runs that end together go to the backend in one ``finish_many`` call
(:class:`~anarchon._batch.Coalescer`); while a burst's claims are still being sent they are held
back, no longer than their leases allow; a result the backend could not take (unavailable) is
retried on the backoff, the outage logged once; a result refused (the lease lost) or refused for
good is logged and not retried.

It is also where a run's error leaves the process, so the one place its secrets are masked
(:func:`masked`: passwords and tokens in URLs): in the finish request sent to the backend (and
so in history, the recorded run, its span's status, the retry and failure hooks), in the log
lines and the run span's event (:func:`anarchon.otel.handler_done`), and in the tracebacks
logged on ``anarchon.scheduler`` (:class:`~anarchon._redact.MaskedTracebacks`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ._batch import Coalescer
from ._clock import Clock
from ._metrics import Counters
from ._models import Run, RunStatus
from ._redact import MaskedTracebacks, redact_url
from ._retry import backoff
from .backend import Backend, FinishRequest, Ticket
from .control import RunRequest
from .errors import BackendError, BackendUnavailable, LeaseLost
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._active import ActiveRun

__all__ = ["ResultRecorder", "masked"]

logger = logging.getLogger("anarchon.scheduler")
# A failed run's traceback (run_failed, result_refused) is printed by whatever formatter the
# application chose: masked once, here, for all of them.
logger.addFilter(MaskedTracebacks())

# A time no held result is due by (monotonic ms, about 285 000 years).
_NEVER: Final = 2**63 - 1


@dataclass(eq=False)
class ResultRecorder:
    """Records the results of runs: batched, held while a burst starts, retried, logged."""

    backend: Backend
    clock: Clock
    counters: Counters
    _batches: Coalescer[FinishRequest, Run] = field(init=False)
    # An outage of result recording: logged once when the first result fails, once when one
    # is recorded again (see _failed), with the retries in between counted.
    _outage: bool = field(default=False, init=False)
    _retries: int = field(default=0, init=False)
    # While results are held: when the first held result may wait no longer (monotonic ms),
    # and the task that sends them then.
    _held_by: int = field(default=_NEVER, init=False)
    _held_due: asyncio.Task[None] | None = field(default=None, init=False)
    on_refused: Callable[[Ticket], None] | None = field(default=None, init=False)
    """Set by the scheduler: a result was refused because its lease is lost (the backup
    watcher then watches the slot's newer attempt)."""

    def __post_init__(self) -> None:
        self._batches = Coalescer(
            self.backend.finish_many, lambda item: item[0].job, "recording the result"
        )

    def hold(self) -> None:
        """Keep results back while a burst's claims are still being sent
        (:class:`~anarchon._claims.Claims` holds them from its first part to its last, then
        calls :meth:`release`): they would otherwise go to the backend between its parts, ahead
        of the next part's claims (on SQLite one thread and one write lock serve both), and
        start its runs later. A result of a leased run waits no longer than its lease allows
        (see :meth:`submit`)."""
        self._batches.hold()

    def release(self) -> None:
        """End :meth:`hold`: the results kept back go in batches."""
        self._batches.release()
        if not self._batches.held:
            self._held_by = _NEVER
            if self._held_due is not None:
                self._held_due.cancel()
                self._held_due = None

    def submit(
        self,
        active: ActiveRun,
        ticket: Ticket,
        status: RunStatus,
        error: str | None,
        retry: RunRequest | None = None,
    ) -> asyncio.Future[Run]:
        """Queue the result of ``active``'s run for the next batch. While results are held,
        one whose lease the keeper no longer renews waits at most until two thirds of its
        lease are left, where a renewal would have been due: everything held goes then. So a
        held result never goes out closer to its lease's end than a kept lease comes.
        ``retry``: a failed run's retry, stored by the backend with the result.

        The caller calls :meth:`recorded` when the future gives the run, or :meth:`finish`
        with the :class:`~anarchon.errors.BackendError` it raised."""
        batches = self._batches
        if batches.held and ticket.lease_expires_at_ms is not None:
            by = active.deadline - ticket.lease_ms * 2 // 3
            if by < self._held_by:
                self._held_by = by
                if self._held_due is not None:
                    self._held_due.cancel()
                self._held_due = asyncio.ensure_future(self._flush_by(by))
        return batches.submit(FinishRequest(ticket, status, masked(error), retry))

    async def finish(
        self,
        active: ActiveRun,
        status: RunStatus,
        error: str | None,
        exc: BaseException | None,
        failed: BackendError | None = None,
        retry: RunRequest | None = None,
    ) -> Run | None:
        """Record the run's result (with its ``retry``, see :meth:`submit`), retrying while
        the backend is unavailable; the run recorded, or None if it was refused. ``failed``:
        how the caller's own first try (:meth:`submit`) failed; the executor tries once
        without this coroutine."""
        ticket = active.ticket
        delays: Iterator[float] | None = None  # made on the first failure: rare
        while True:
            if failed is None:
                try:
                    run = await self.submit(active, ticket, status, error, retry)
                except BackendError as refused:
                    failed = refused
                else:
                    self.recorded(ticket, status, error, exc)
                    return run
            if isinstance(failed, LeaseLost):
                self.counters.count(ticket.job, "result_refused")
                logger.warning(
                    "result of %s attempt %d (%s%s) refused: %s",
                    ticket.job,
                    ticket.attempt,
                    status.value,
                    f": {masked(error)}" if error else "",
                    failed,
                    exc_info=exc,
                    extra=log_fields(Action.RESULT_REFUSED, ticket=ticket),
                )
                if self.on_refused is not None:
                    self.on_refused(ticket)
                return None
            if not isinstance(failed, BackendUnavailable):  # refused for good
                self.counters.result_errors += 1
                logger.warning(
                    "the result of %s attempt %d (%s) could not be recorded: %s",
                    ticket.job,
                    ticket.attempt,
                    status.value,
                    failed,
                    extra=log_fields(Action.RESULT_FAILED, ticket=ticket),
                )
                return None
            self._failed(ticket, failed)
            failed = None
            delays = delays or backoff()
            await self.clock.sleep(next(delays))

    def recorded(
        self, ticket: Ticket, status: RunStatus, error: str | None, exc: BaseException | None
    ) -> None:
        """The result of ``ticket``'s run is recorded: count and log it."""
        if self._outage:
            self._recovered(ticket)
        self.counters.count_run(status, ticket.job, self.clock.now_ms())
        if status is RunStatus.SUCCEEDED:
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "job %s succeeded (attempt %d)",
                    ticket.job,
                    ticket.attempt,
                    extra=log_fields(Action.RUN_SUCCEEDED, ticket=ticket),
                )
        else:
            # One ERROR line per failed run, with the handler's traceback: what alerting
            # (Sentry's logging integration, log-based alerts) looks for.
            logger.error(
                "job %s %s (attempt %d): %s",
                ticket.job,
                status.value,
                ticket.attempt,
                masked(error),
                exc_info=exc,
                extra=log_fields(Action.RUN_FAILED, ticket=ticket),
            )

    async def _flush_by(self, by: int) -> None:
        """At ``by`` (monotonic ms), send the results held so far."""
        await self.clock.sleep(max(0, by - self.clock.monotonic_ms()) / 1000)
        self._held_due = None
        self._held_by = _NEVER
        self._batches.flush()

    def _failed(self, ticket: Ticket, error: BackendUnavailable) -> None:
        """Recording ``ticket``'s result failed on an unavailable backend: one WARNING per
        outage (thousands of results retry together in a burst), DEBUG for each retry."""
        self._retries += 1
        if self._outage:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "recording %s failed again: %s",
                    ticket.job,
                    error,
                    extra=log_fields(Action.FINISH_RETRY, ticket=ticket),
                )
            return
        self._outage = True
        logger.warning(
            "recording %s failed, retrying (and every result that fails until the backend "
            "answers, logged once): %s",
            ticket.job,
            error,
            extra=log_fields(Action.FINISH_RETRY, ticket=ticket),
        )

    def _recovered(self, ticket: Ticket) -> None:
        """A result was recorded after an outage: say so once, with how many retries it took."""
        retries, self._retries, self._outage = self._retries, 0, False
        logger.warning(
            "recording results works again (%d failed attempt(s) during the outage retried)",
            retries,
            extra=log_fields(Action.FINISH_RECOVERED, ticket=ticket, retries=retries),
        )


def masked(error: str | None) -> str | None:
    """A run's error as it leaves the process (stored, logged, exported): every secret in a URL
    masked (:func:`~anarchon._redact.redact_url`, which gives the same text each time, so a
    retried finish sends what the first sent). None, a success, costs nothing."""
    return None if error is None else redact_url(error)
