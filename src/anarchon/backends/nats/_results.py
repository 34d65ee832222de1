"""The results path: results go to ``<prefix><job>.results`` once, by message id.

The claim path (:mod:`._claims`) hands out the tickets; the settling of claims nobody runs
(:mod:`._settle`) records through :class:`Results` too, and shares its gate
(:data:`RESULTS_IN_FLIGHT`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

from ...backend import FinishRequest, Ticket
from ...errors import BackendError, BackendUnavailable, LeaseLost
from ...kit import Run, RunStatus, SystemClock, Trigger
from . import _records as records
from . import _subjects as subjects
from ._connection import Connection, in_flight

#: The local clock: the start of a claim won on its ack, and the end finish() answers with.
CLOCK: Final = SystemClock()

# Results published at once by finish_many. Far fewer than a batch's claims: a result is not
# due at an instant, and the stream stores one publish at a time, so results in flight (one
# instance's burst, recorded) queue ahead of the other instances' claims of the same burst
# (256 of them made their last claims later). One after another, 2 000 results took 0.4 s of
# round trips and 130 us of client CPU each; 8 at once, 0.16 s and 50 us. But under a load that
# goes on (3 x 5 000 every-second jobs) a batch's 256 claims are always in flight ahead of
# them: 8 at once recorded one result of twenty runs, and the rest were still unrecorded
# (``running``) when the instances stopped. A quarter of the claims' share keeps up.
RESULTS_IN_FLIGHT: Final = 64


class Results:
    """The results of one backend on its stream."""

    def __init__(self, connection: Connection, *, prefix: str) -> None:
        self._connection = connection
        self._prefix = prefix
        self.gate = asyncio.Semaphore(RESULTS_IN_FLIGHT)
        """Results in flight at once, a gate of their own (see RESULTS_IN_FLIGHT); the settling
        of unsure claims goes through it too."""

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, reason: str | None = None
    ) -> Run:
        """Publish the run's result (once, by message id) and return the run.

        A non-duplicate ack of a scheduled run's result (schedule, catch-up, retry) is answered
        from what was published, with no further call (the seed reads back only on a
        duplicate): the run starts at the ticket's start and ends on the local clock, at least
        at its start; history shows the stream's timestamps. A manual run's result (run_now()
        returns it, as on the other backends: the stored run) and a duplicate ack (a retried
        publish, or another run's result for the slot) read the stored result and the claim
        back together: the stored run, or LeaseLost if the result is another run's.
        """
        self._connection.require()
        outcome = RunStatus(status)
        msg_id = subjects.RESULT_ID.format(job=ticket.job, slot_key=ticket.slot_key)
        subject = subjects.RESULTS.format(prefix=self._prefix, job=ticket.job)
        payload = records.encode_result(ticket, outcome, error, reason)
        deadline = self._connection.retry_deadline()
        ack = await self._connection.publish_retrying(
            subject, payload, msg_id, f"recording {msg_id}", deadline
        )
        for held_elsewhere in (False, True):
            if not ack.duplicate and ticket.trigger is not Trigger.MANUAL:
                return records.run_of(
                    ticket,
                    outcome,
                    ticket.started_at_ms,
                    max(CLOCK.now_ms(), ticket.started_at_ms),
                    fence=ticket.fence,
                    error=error,
                    reason=reason,
                )
            stored, claimed = await asyncio.gather(
                self._connection.get_retrying({"seq": ack.seq}, f"reading result {msg_id}"),
                self._claim_time(ticket),
            )
            if held_elsewhere or not ack.duplicate or stored is None or stored.subject == subject:
                break
            # Another prefix's result on a shared stream: recorded under the prefix's own id.
            msg_id = subjects.OWN_RESULT_ID.format(
                prefix=self._prefix, job=ticket.job, slot_key=ticket.slot_key
            )
            ack = await self._connection.publish_retrying(
                subject, payload, msg_id, f"recording {msg_id}", deadline
            )
        result = records.decode_result(stored) if stored is not None else None
        if ack.duplicate and result is not None and result.run.run_id != ticket.run_id:
            raise LeaseLost(
                f"run {ticket.run_id} of job {ticket.job!r}: slot {ticket.slot_key} already has "
                f"a result from run {result.run.run_id}; this one is refused"
            )
        return records.run_of(
            ticket,
            outcome,
            claimed if claimed is not None else ticket.started_at_ms,
            stored.time_ms if stored is not None else CLOCK.now_ms(),
            fence=ticket.fence,
            error=error,
            reason=reason,
        )

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """:meth:`finish` for each item, published concurrently (at most
        :data:`RESULTS_IN_FLIGHT` at once, all calls together): each item's run, or its
        :class:`BackendError` (LeaseLost, a value the stream refuses) in its place;
        :class:`BackendUnavailable` for the whole call."""
        if len(items) == 1:
            try:
                [(ticket, status, error, _)] = items  # a retry is the caller's (_backend.py)
                return [await self.finish(ticket, status, error)]
            except BackendUnavailable:
                raise
            except BackendError as exc:
                return [exc]
        answers = await in_flight(
            self.gate,
            RESULTS_IN_FLIGHT,
            items,
            lambda item: self.finish(item.ticket, item.status, item.error),
        )
        out: list[Run | BackendError] = []
        for answer in answers:
            if isinstance(answer, BackendUnavailable) or not isinstance(answer, Run | BackendError):
                raise answer
            out.append(answer)
        return out

    async def _claim_time(self, ticket: Ticket) -> int | None:
        """The stream timestamp of the ticket's claim (None if it was trimmed)."""
        if ticket.fence is None:
            return None
        stored = await self._connection.get_retrying(
            {"seq": ticket.fence}, f"reading claim {ticket.job}:{ticket.slot_key}"
        )
        claims = subjects.CLAIMS.format(prefix=self._prefix, job=ticket.job)
        if stored is None or stored.subject != claims:
            return None
        return stored.time_ms
