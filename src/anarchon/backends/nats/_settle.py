"""Settling claims nobody will run, so that history never shows them ``running`` with no runner.

A publish that went out unanswered may have been stored; when the scheduler gives up on such a
claim, it is settled in the background (:meth:`Settler.settle`). So is a win kept from a claim
batch that failed (see :meth:`._claims.ClaimPath.claim`) that the scheduler never asks for
again. At stop, all of them are settled at once, due or not (:meth:`Settler.close`), with the
claims of a call the stopping scheduler cancelled while their publish was out. The claim path
remembers them in the maps it shares with the :class:`Settler` it owns; the settler also runs
the backend's periodic upkeep (:meth:`Settler.upkeep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Final

from ...backend import ClaimOutcome, ClaimRequest, Ticket
from ...errors import BackendUnavailable
from ...kit import Action, RunStatus, log_fields
from . import _records as records
from . import _subjects as subjects
from . import _timings as timings
from ._connection import MAX_IN_FLIGHT, in_flight
from ._context import Context
from ._readback import ReadBack
from ._results import CLOCK, RESULTS_IN_FLIGHT, Results

logger = logging.getLogger("anarchon.backends.nats")

# Claims whose publish may have been stored unanswered and that the scheduler gave up on (see
# Settler.settle): at most this many are remembered.
MAX_UNSURE: Final = 100_000


@dataclass(frozen=True, slots=True)
class Unsure:
    """A claim one of whose publishes may have been stored without our hearing of it, or (with
    a ticket) a claim won in a batch that failed, not handed to the scheduler yet."""

    request: ClaimRequest
    since_ms: int
    ticket: Ticket | None = None


@dataclass(frozen=True, slots=True)
class Kept:
    """An answer decided in a batch that failed as a whole, kept for the scheduler's retry of
    the same request (same token): it is handed back without publishing again."""

    outcome: ClaimOutcome
    request: ClaimRequest
    since_ms: int


class Settler:
    """Settles the claims of one backend that nobody will run; see the module's docstring.

    ``unsure`` and ``kept`` are the claim path's maps, by token (see
    :class:`._claims.ClaimPath`): it adds to and takes from them as claims are answered, and
    the settler settles or drops what is left once due."""

    def __init__(
        self,
        context: Context,
        results: Results,
        readback: ReadBack,
        *,
        unsure: dict[str, Unsure],
        kept: dict[str, Kept],
    ) -> None:
        self._connection = context.connection
        self._window = context.window
        self._prefix = context.prefix
        self._results = results
        self._readback = readback
        self._unsure = unsure
        self._kept = kept

    def remember(self, req: ClaimRequest, ticket: Ticket | None = None) -> None:
        """Remember ``req`` to be settled; ``ticket``: it is known won (a kept answer)."""
        known = self._unsure.get(req.token)
        if known is not None and (ticket is None or known.ticket is not None):
            return
        if known is None and len(self._unsure) >= MAX_UNSURE:
            oldest = next(iter(self._unsure))
            dropped = self._unsure.pop(oldest).request
            logger.warning(
                "more than %d unconfirmed claims; %s:%s will not be settled (if stored, history "
                "shows it running)",
                MAX_UNSURE,
                dropped.job,
                dropped.slot_key,
                extra=log_fields(Action.SETTLE_DROPPED, dropped.job, dropped.slot),
            )
        self._unsure[req.token] = Unsure(req, CLOCK.now_ms(), ticket)

    def _settle_due(self, req: ClaimRequest, since_ms: int, now: int) -> bool:
        """True once the scheduler has surely stopped retrying the claim: its slot is later than
        max_late_ms + CLAIM_MARGIN_MS (a manual run: a minute after the first failure)."""
        slot = _own_slot(req)
        if slot is None:
            return now >= since_ms + timings.MANUAL_SETTLE_AFTER_MS
        return now > slot + self._window.max_late_ms(req.job) + timings.CLAIM_MARGIN_MS

    async def upkeep(self) -> None:
        """While started: every WINDOW_CHECK_S read the stream's window and raise it again if it
        fell below what this instance keeps (another instance shrank it with
        ``shrink_window=True``); every SETTLE_EVERY_S settle the claims the scheduler gave up
        on whose publish may have been stored."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + timings.WINDOW_CHECK_S
        while True:
            await asyncio.sleep(max(0.05, min(timings.SETTLE_EVERY_S, next_check - loop.time())))
            try:
                if loop.time() >= next_check:
                    next_check = loop.time() + timings.WINDOW_CHECK_S
                    await self._window.check()
                if self._unsure or self._kept:
                    await self.settle()
                await self._readback.upkeep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                stream = self._connection.stream
                logger.debug(
                    "NATS upkeep of stream %s failed: %s",
                    stream,
                    self._connection.scrub(str(exc) or type(exc).__name__),
                    extra=log_fields(Action.UPKEEP_FAILED, stream=stream),
                )

    async def settle(self) -> None:
        """Settle each claim the scheduler gave up on whose publish may have been stored
        unanswered, or that was won in a batch that failed and never handed to the scheduler,
        so that history never shows it ``running`` with no runner:

        * stored, ours: a result closes it, ``skipped`` with the reason below;
        * not stored: a skip record with that reason is stored under the slot's id (the same
          record a too-late instance leaves), unless the slot is too close to the end of the
          duplicate window for that to be safe;
        * another instance's claim, or a skip record: nothing to do.

        Kept answers the scheduler no longer asks for are dropped. Settled a few at a time
        (:data:`RESULTS_IN_FLIGHT`): a failed burst can leave thousands.
        """
        now = CLOCK.now_ms()
        for token, kept in list(self._kept.items()):
            if self._settle_due(kept.request, kept.since_ms, now):
                del self._kept[token]
        due = [
            (token, entry)
            for token, entry in self._unsure.items()
            if self._settle_due(entry.request, entry.since_ms, now)
        ]
        if not due:
            return
        answers = await in_flight(
            self._results.gate, RESULTS_IN_FLIGHT, due, lambda item: self._settle_one(item[1])
        )
        for (token, entry), answer in zip(due, answers, strict=True):
            if isinstance(answer, BackendUnavailable):
                continue  # next round; _settle_one gives up once the slot leaves the window
            if isinstance(answer, Exception):
                logger.warning(
                    "cannot settle claim %s:%s: %s",
                    entry.request.job,
                    entry.request.slot_key,
                    answer,
                    extra=log_fields(Action.SETTLE_FAILED, entry.request.job),
                )
            self._unsure.pop(token, None)

    async def _settle_one(self, entry: Unsure, until: str = "until the slot was too late") -> None:
        """Settle one claim (see :meth:`settle`); ``until``: when this instance gave up on it,
        as its reason says."""
        req = entry.request
        msg_id = subjects.CLAIM_ID.format(job=req.job, slot_key=req.slot_key)
        if entry.ticket is not None:
            await self._close_won(entry.ticket, until)
            return
        reason = (
            f"not run: {req.instance} could not confirm its claim while NATS was unavailable, "
            f"{until}"
        )
        loop = asyncio.get_running_loop()
        deadline = self._connection.retry_deadline()
        now = CLOCK.now_ms()
        slot = _own_slot(req)
        if slot is not None:
            safe_ms = self._window.safe_until_ms(slot, timings.SKIP_SAFETY_MS)
            if now >= safe_ms:
                logger.info(
                    "claim %s not settled: the slot is too close to the end of the duplicate "
                    "window to look it up by its id; if it was stored, history shows it running",
                    msg_id,
                    extra=log_fields(Action.SETTLE_TOO_LATE, req.job, req.slot),
                )
                return
            deadline = min(deadline, loop.time() + (safe_ms - now) / 1000)
        record = replace(req, token=uuid.uuid4().hex, skip_reason=reason)
        subject = subjects.CLAIMS.format(prefix=self._prefix, job=req.job)
        ack = await self._connection.publish_retrying(
            subject,
            records.encode_claim(record),
            msg_id,
            f"settling {msg_id}",
            deadline,
        )
        if not ack.duplicate:
            logger.info(
                "claim %s settled: it was never stored; the slot is recorded skipped (%s)",
                msg_id,
                reason,
                extra=log_fields(Action.CLAIM_SETTLED, req.job, req.slot),
            )
            return
        stored = await self._connection.get_retrying({"seq": ack.seq}, f"reading claim {msg_id}")
        if stored is not None and stored.subject != subject:
            # Another prefix's claim on a shared stream: this prefix's is under its own id.
            msg_id = subjects.OWN_CLAIM_ID.format(
                prefix=self._prefix, job=req.job, slot_key=req.slot_key
            )
            ack = await self._connection.publish_retrying(
                subject, records.encode_claim(record), msg_id, f"settling {msg_id}", deadline
            )
            if not ack.duplicate:
                return
            stored = await self._connection.get_retrying({"seq": ack.seq}, f"reading {msg_id}")
        claim = records.decode_claim(stored) if stored is not None else None
        if claim is None or claim.skipped or claim.token != req.token:
            return  # another instance's claim or a skip record, or trimmed: nothing to close
        await self._results.finish(claim.ticket(), RunStatus.SKIPPED, None, reason)
        logger.info(
            "claim %s settled: it was stored but never confirmed, so nobody ran it; closed as "
            "skipped (%s)",
            msg_id,
            reason,
            extra=log_fields(Action.CLAIM_SETTLED, req.job, req.slot),
        )

    async def close(self) -> None:
        """Settle at once, within :data:`._timings.CLOSE_SETTLE_S`, every claim nobody runs
        now that this instance stops, due or not: the wins kept from failed batches (see
        :meth:`._claims.ClaimPath.claim`), and the claims whose publish may have been stored
        unanswered, among them those of a claim call the stopping scheduler cancelled while
        its publish was out. Each as :meth:`settle` does, its reason ending ``before it
        stopped``; one not settled in time is logged (WARNING ``settle_failed``)."""
        self._kept.clear()
        entries = list(self._unsure.values())
        self._unsure.clear()
        if not entries or not self._connection.started:
            return
        answers: dict[int, Exception | None] = {}

        async def close_all() -> None:
            await in_flight(
                asyncio.Semaphore(MAX_IN_FLIGHT),
                MAX_IN_FLIGHT,
                entries,
                lambda entry: self._settle_one(entry, "before it stopped"),
                answers,
            )

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(close_all(), timings.CLOSE_SETTLE_S)
        failed = [
            entries[n]
            for n in range(len(entries))
            if n not in answers or isinstance(answers[n], Exception)
        ]
        if failed:
            first = failed[0].request
            logger.warning(
                "%d claims nobody runs (won in a failed batch, or unconfirmed) not settled at "
                "stop within %.0f s (%s:%s among them); if stored, history shows them running",
                len(failed),
                timings.CLOSE_SETTLE_S,
                first.job,
                first.slot_key,
                extra=log_fields(Action.SETTLE_FAILED, first.job),
            )

    async def _close_won(self, ticket: Ticket, until: str) -> None:
        """Close a claim won in a batch that failed, never handed to the scheduler: nobody
        ran it. Recorded ``skipped``, saying why."""
        reason = (
            f"not run: {ticket.instance} won the claim in a batch that failed while NATS was "
            f"unavailable, and could not hand it to its scheduler {until}"
        )
        await self._results.finish(ticket, RunStatus.SKIPPED, None, reason)
        logger.info(
            "claim %s:%s settled: won in a failed batch, never run; closed as skipped",
            ticket.job,
            ticket.slot_key,
            extra=log_fields(Action.CLAIM_SETTLED, ticket.job, ticket.slot),
        )


def _own_slot(req: ClaimRequest) -> int | None:
    """The slot whose time bounds the claim id's life in the duplicate window: the request's
    slot when it is claimed under the slot's own key. A retry (``<slot>-retry-<n>``) or a
    triggered run is first claimed when its request falls due, not at its slot: None."""
    if req.slot is not None and req.slot_key == str(req.slot):
        return req.slot
    return None
