"""The claim path: JetStream's message de-duplication decides who runs each slot.

Every instance publishes its claim for a slot to ``<prefix><job>.claims`` with the header
``Nats-Msg-Id: <job>:<slot>``. Within the stream's duplicate window JetStream stores only the
first message with an id and answers every later one ``duplicate: true`` with the first one's
sequence; the stream leader orders publishes, so exactly one is first. A non-duplicate ack
wins, with no further call: the ack is the proof. A duplicate ack is resolved by reading the
stored message by sequence and comparing tokens, so a publish the client retried (lost ack,
timeout, reconnect) still counts as its own.

Before publishing, a claim reads the job's pauses (:mod:`._control`, cached for a second); a
paused slot is published as a skip record with the pause's reason instead, which JetStream
de-duplicates like any claim. That check is not atomic with the claim (see :mod:`._control`).

A publish that went out unanswered may have been stored; when the scheduler gives up on such a
claim, it is settled in the background (:meth:`ClaimPath.settle`) so that history never shows it
``running`` with no runner. Results go to ``<prefix><job>.results`` once, by message id.

A batch (the claims of one moment, up to 2 000) sends when its turn comes, one batch at a time;
each claim's retries count from its own turn at the in-flight gate. The wins of a batch are
announced as they are decided, and a claim of a slot another instance was heard winning is
answered lost, unpublished. A batch that fails keeps the answers it decided for the
scheduler's retry; a kept win never taken is settled like an unanswered publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ...backend import (
    ClaimNotice,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    Ticket,
)
from ...control import PAUSED_TRIGGERS, paused_reason
from ...errors import BackendError, BackendUnavailable, LeaseLost
from ...kit import Action, Run, RunStatus, SystemClock, Trigger, log_fields, maker
from ...kit.feed import won_notices
from ...kit.lease import ticket_of
from . import _connection
from . import _errors as errors
from . import _records as records
from . import _subjects as subjects
from ._connection import MAX_IN_FLIGHT, Connection
from ._readback import ReadBack
from ._records import Claim
from ._window import CLAIM_MARGIN_MS, Window
from ._wire import Ack

if TYPE_CHECKING:
    from ._control import NatsControl

logger = logging.getLogger("anarchon.backends.nats")

# A skip record is published only while its slot's claim id is surely still remembered.
SKIP_SAFETY_MS: Final = 30_000
# How often a running backend reads the stream's duplicate window (another instance may have
# grown it, or shrunk it with shrink_window=True).
WINDOW_CHECK_S: Final = 60.0
# Claims whose publish may have been stored unanswered and that the scheduler gave up on are
# settled this often (see ClaimPath.settle); a manual run's claim once the core's 10 s
# deadline for it is surely over; at most MAX_UNSURE are remembered.
SETTLE_EVERY_S: Final = 5.0
MANUAL_SETTLE_AFTER_MS: Final = 60_000
MAX_UNSURE: Final = 100_000
#: The local clock: the start of a claim won on its ack, and the end finish() answers with.
CLOCK: Final = SystemClock()

# Batches (claim() calls of more than one request) that send their claims at once; the others
# wait for their turn, in order, one waiter each, instead of 256 workers each at the in-flight
# gate. At 3 x 5 000 every-second jobs, overlapping bursts and their retries once queued
# 17 000 to 25 000 workers there, and a claim waited so long behind them that it was refused
# unsent. One: a backup's batch (a rank delay after the slot) then goes out after this
# instance's preferred batch of the same moment, by when the other instances' preferred
# batches, as long, have announced most of their wins, so its claims of those slots are not
# published (see hear). The pipe idles for one round trip between two batches.
BATCHES_AT_ONCE: Final = 1
# A batch announces its wins as they are decided (so that the other instances' backup claims
# of the same slots, a rank delay later, hear of them before they publish), a chunk at a time:
# this many, or what it holds once a win comes NOTICE_HOLD_S after the first one held.
NOTICE_CHUNK: Final = 64
NOTICE_HOLD_S: Final = 0.02
# Slots another instance was heard winning (claim notices), remembered by claim id: a claim
# that reaches the gate after such a notice is not published (it could only lose). About 20 s
# of a fleet that wins 5 000 slots a second; the oldest go first.
MAX_HEARD: Final = 100_000
# At stop(), wins kept from a failed batch (never handed to the scheduler) are closed as
# skipped within this long, MAX_IN_FLIGHT at once (not behind the results still queued).
CLOSE_SETTLE_S: Final = 5.0

# Results published at once by finish_many. Far fewer than a batch's claims: a result is not
# due at an instant, and the stream stores one publish at a time, so results in flight (one
# instance's burst, recorded) queue ahead of the other instances' claims of the same burst
# (256 of them made their last claims later). One after another, 2 000 results took 0.4 s of
# round trips and 130 us of client CPU each; 8 at once, 0.16 s and 50 us. But under a load that
# goes on (3 x 5 000 every-second jobs) a batch's 256 claims are always in flight ahead of
# them: 8 at once recorded one result of twenty runs, and the rest were still unrecorded
# (``running``) when the instances stopped. A quarter of the claims' share keeps up.
RESULTS_IN_FLIGHT: Final = 64

# Every claim's answer: built by a maker (see anarchon._frozen), with the members it reads as
# constants (on Python 3.11 ``ClaimStatus.WON`` goes through EnumType's ``__getattr__``).
_new_outcome: Final = maker(ClaimOutcome)
_WON: Final = ClaimStatus.WON
_LOST: Final = ClaimStatus.LOST
_RUNNING: Final = RunStatus.RUNNING

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass(frozen=True, slots=True)
class _Unsure:
    """A claim one of whose publishes may have been stored without our hearing of it, or (with
    a ticket) a claim won in a batch that failed, not handed to the scheduler yet."""

    request: ClaimRequest
    since_ms: int
    ticket: Ticket | None = None


@dataclass(frozen=True, slots=True)
class _Kept:
    """An answer decided in a batch that failed as a whole, kept for the scheduler's retry of
    the same request (same token): it is handed back without publishing again."""

    outcome: ClaimOutcome
    request: ClaimRequest
    since_ms: int


class _Notices:
    """The wins of one batch, announced while the batch goes on, a chunk at a time (see
    NOTICE_CHUNK)."""

    __slots__ = ("_announce", "_pending", "_since")

    def __init__(self, announce: Callable[[Sequence[ClaimNotice]], Awaitable[None]] | None):
        self._announce = announce
        self._pending: list[ClaimOutcome] = []
        self._since = 0.0

    async def won(self, outcome: ClaimOutcome) -> None:
        if self._announce is None:
            return
        pending = self._pending
        pending.append(outcome)
        now = asyncio.get_running_loop().time()
        if len(pending) == 1:
            self._since = now
        if len(pending) >= NOTICE_CHUNK or now - self._since >= NOTICE_HOLD_S:
            await self.flush()

    async def flush(self) -> None:
        if self._pending and self._announce is not None:
            pending, self._pending = self._pending, []
            await self._announce(won_notices(pending))


class ClaimPath:
    """Claims and results of one backend on its stream."""

    def __init__(
        self,
        connection: Connection,
        window: Window,
        *,
        prefix: str,
        history_size: int,
        control: NatsControl | None = None,
    ) -> None:
        self._connection = connection
        self._control = control
        self._window = window
        self._prefix = prefix
        self._history_size = history_size
        # Claims (by token) whose publish may have been stored without our hearing of it: a
        # duplicate ack for one of them may be our own claim, and one the scheduler gives up on
        # is settled in the background (settle).
        self._unsure: dict[str, _Unsure] = {}
        self._readback = ReadBack(connection, prefix)
        # Results in flight at once, a gate of their own: see RESULTS_IN_FLIGHT.
        self._results_gate = asyncio.Semaphore(RESULTS_IN_FLIGHT)
        # Answers of batches that failed as a whole, by token (see claim).
        self._kept: dict[str, _Kept] = {}
        # Claim id -> the instance heard winning it (see hear).
        self._heard: dict[str, str] = {}
        self._turns = asyncio.Semaphore(BATCHES_AT_ONCE)
        self._closing = False
        self.announce: Callable[[Sequence[ClaimNotice]], Awaitable[None]] | None = None
        """Sends claim notices of won claims (the backend's); None: none are sent."""

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """Publish each request's claim (concurrently) and tell who won; announce the wins.

        A batch that fails (BackendUnavailable for some of its requests, or a permanent error)
        raises, but the answers it decided are kept by token: the scheduler retries the
        request with the same token and gets the kept answer, with no publish. A kept win is
        also remembered to be settled (see :meth:`settle`): if the scheduler never asks again
        (the slot became too late, or it stopped), nobody runs it, and it is closed as skipped
        instead of staying ``running``.
        """
        self._connection.require()
        gate = self._connection.in_flight
        assert gate is not None
        called = asyncio.get_running_loop().time()
        requests = await self._paused(requests)
        answers: dict[int, ClaimOutcome | Exception] = {}
        if self._kept:
            self._take_kept(requests, answers)
        if len(requests) == 1 and not answers:
            # The usual firing of one slot: its outcome or its error, with nothing to gather.
            async with gate:
                outcome = await self._claim_one(requests[0], called)
            if outcome.status is _WON and self.announce is not None:
                try:
                    await self.announce(won_notices([outcome]))
                except BaseException:  # cancelled: the win is kept, as a batch's (_keep)
                    answers[0] = outcome
                    self._keep(requests, answers)
                    raise
            return [outcome]
        todo = [n for n in range(len(requests)) if n not in answers]
        if todo:
            await self._claim_batch(requests, todo, called, answers)
        problems = [a for a in answers.values() if isinstance(a, Exception)]
        if problems:
            self._keep(requests, answers)
            permanent = [p for p in problems if not isinstance(p, BackendUnavailable)]
            raise (permanent or problems)[0]
        return [a for n in range(len(requests)) if isinstance(a := answers[n], ClaimOutcome)]

    async def _claim_batch(
        self,
        requests: Sequence[ClaimRequest],
        todo: list[int],
        called: float,
        answers: dict[int, ClaimOutcome | Exception],
    ) -> None:
        """Claim ``requests[n]`` for each n of ``todo``, answers into ``answers``, when the
        batch's turn comes (BATCHES_AT_ONCE); wins are announced as they are decided. If
        cancelled, the answers decided so far are kept (see :meth:`claim`)."""
        gate = self._connection.in_flight
        assert gate is not None
        notices = _Notices(self.announce)

        async def one(n: int) -> ClaimOutcome:
            outcome = await self._claim_one(requests[n], called)
            if outcome.status is _WON:
                await notices.won(outcome)
            return outcome

        decided: dict[int, ClaimOutcome | Exception] = {}
        failed: list[BackendUnavailable] = []
        try:
            async with self._turns:
                # A task of its own, so that a cancelled call (the scheduler stopping) lets the
                # publishes in flight be answered, rather than forget claims perhaps stored.
                batch = asyncio.ensure_future(
                    _in_flight(gate, MAX_IN_FLIGHT, todo, one, decided, failed)
                )
                try:
                    await asyncio.shield(batch)
                except asyncio.CancelledError:
                    await _answered(batch, failed)
                    raise
        except BaseException:
            answers.update({todo[i]: a for i, a in decided.items()})
            self._keep(requests, answers)
            raise
        answers.update({todo[i]: a for i, a in decided.items()})
        await notices.flush()

    def _take_kept(
        self, requests: Sequence[ClaimRequest], answers: dict[int, ClaimOutcome | Exception]
    ) -> None:
        """Into ``answers``, the kept answer of each request that has one (taken out)."""
        kept, unsure = self._kept, self._unsure
        for n, req in enumerate(requests):
            entry = kept.pop(req.token, None)
            if entry is not None:
                answers[n] = entry.outcome
                if entry.outcome.status is _WON:
                    unsure.pop(req.token, None)  # handed to the scheduler: it runs it

    def _keep(
        self, requests: Sequence[ClaimRequest], answers: dict[int, ClaimOutcome | Exception]
    ) -> None:
        """Keep the decided answers of a batch that raises (see :meth:`claim`)."""
        now = CLOCK.now_ms()
        kept = self._kept
        for n, answer in answers.items():
            if not isinstance(answer, ClaimOutcome):
                continue
            req = requests[n]
            if len(kept) >= MAX_UNSURE:
                # The oldest goes; a win among them stays remembered to be settled.
                del kept[next(iter(kept))]
            kept[req.token] = _Kept(answer, req, now)
            if answer.status is _WON:
                self._remember_unsure(req, answer.ticket)

    def hear(self, notices: Sequence[ClaimNotice]) -> None:
        """Remember which instance won each slot in ``notices`` (claim notices, every
        instance's): a claim of that slot by another instance that has not been published yet
        is then answered lost without publishing (see :meth:`_claim_one`). Called in the
        client's read loop; the oldest :data:`MAX_HEARD` go first."""
        heard = self._heard
        for notice in notices:
            heard[f"{notice.job}:{notice.slot_key}"] = notice.instance  # subjects.CLAIM_ID
        excess = len(heard) - MAX_HEARD
        if excess > 0:
            for key in [k for _, k in zip(range(excess), heard, strict=False)]:
                del heard[key]

    def open(self) -> None:
        """The backend started (again), on the running event loop: claims are sent."""
        self._closing = False
        self._turns = asyncio.Semaphore(BATCHES_AT_ONCE)

    async def _paused(self, requests: Sequence[ClaimRequest]) -> Sequence[ClaimRequest]:
        """The requests, each one a pause holds turned into a skip record with the pause's
        reason. The pauses of the batch's jobs are read once (see :mod:`._control`)."""
        if self._control is None or self._control.nothing_paused():
            return requests
        jobs = {r.job for r in requests if r.skip_reason is None and r.trigger in PAUSED_TRIGGERS}
        if not jobs:
            return requests
        held = await self._control.holding(jobs, CLOCK.now_ms())
        if not held:
            return requests
        return [
            replace(r, skip_reason=paused_reason(held[r.job]), skip_status=RunStatus.SKIPPED)
            if r.job in held and r.skip_reason is None and r.trigger in PAUSED_TRIGGERS
            else r
            for r in requests
        ]

    def _safe_until_ms(self, slot: int, margin_ms: int) -> int:
        """Until when a message under the slot's claim id is surely still de-duplicated."""
        window = self._window.ms
        return slot + window - min(margin_ms, window // 4)

    def _at_gate(
        self, req: ClaimRequest, msg_id: str, slot: int | None, now: int, at: float, called: float
    ) -> ClaimOutcome | float:
        """A claim that has passed the in-flight gate: its answer without a publish, or the
        deadline (event-loop time) of its publishes; BackendUnavailable if it is not sent."""
        if self._closing:
            raise BackendUnavailable(f"NATS: claim {msg_id} not sent: the backend is stopping")
        if self._heard:
            holder = self._heard.get(msg_id)
            if holder is not None and holder != req.instance:
                # Another instance announced its win (a notice follows a decided win only):
                # this claim could only be a duplicate, so it is not published.
                if self._unsure:
                    self._unsure.pop(req.token, None)
                return _new_outcome(status=_LOST, run=records.heard_run(req, holder, now))
        if slot is not None:  # _own_slot(req)
            # Never publish a claim whose id JetStream may have forgotten: it would be stored.
            margin = SKIP_SAFETY_MS if req.skip_reason is not None else 0
            safe_ms = self._safe_until_ms(slot, margin)
            if req.skip_reason is not None and now >= safe_ms:
                return self._unrecorded_skip(req, now)
            max_late = self._window.max_late_ms(req.job)
            if req.skip_reason is None and now - slot > max_late:
                # Its turn at the gate came too late (a backlog on a slow server): not sent,
                # and nothing recorded (under such a load a skip record would only add to it).
                # CLAIM_MARGIN_MS counts from here. Answered, not raised: the others of the
                # batch, wins among them, go to the scheduler now.
                reason = (
                    f"too late: {req.instance} could send its claim only {now - slot} ms after "
                    f"the slot (max_late_ms={max_late}), behind earlier claims on a slow server; "
                    "not recorded"
                )
                return _new_outcome(
                    status=ClaimStatus.SKIPPED, run=records.unrecorded(req, now, reason)
                )
            # Every publish of the claim starts within CLAIM_RETRY_S of its turn at the gate,
            # which came while the slot was at most max_late_ms old (CLAIM_MARGIN_MS).
            deadline = min(at + _connection.CLAIM_RETRY_S, at + (safe_ms - now) / 1000)
        else:
            # A manual run or a retry: within CLAIM_RETRY_S of the call (MANUAL_SETTLE_AFTER_MS).
            deadline = called + _connection.CLAIM_RETRY_S
        if at >= deadline:
            # Waited behind earlier claims on a slow server: the core retries, if in time.
            raise BackendUnavailable(
                f"NATS: claim {msg_id} not sent: {at - called:.1f} s passed while it waited for "
                "earlier claims (the server answers slowly)"
            )
        return deadline

    async def _claim_one(self, req: ClaimRequest, called: float) -> ClaimOutcome:
        """One request's claim, once it has passed the in-flight gate; ``called``: when its
        claim() call began (event-loop time)."""
        now = CLOCK.now_ms()
        loop = asyncio.get_running_loop()
        at = loop.time()
        slot_key = req.slot_key
        slot = req.slot if req.slot is not None and slot_key == str(req.slot) else None
        msg_id = f"{req.job}:{slot_key}"  # subjects.CLAIM_ID
        passed = self._at_gate(req, msg_id, slot, now, at, called)
        if not isinstance(passed, float):
            return passed
        deadline = passed
        subject = f"{self._prefix}{req.job}.claims"  # subjects.CLAIMS
        payload = records.encode_claim(req, slot_key)
        outcome = await self._publish_claim(req, subject, payload, msg_id, deadline, at, now)
        if outcome is not None:
            return outcome
        # The id is another prefix's claim (a stream shared by two prefixes): every instance of
        # this prefix that reads it so races again under the prefix's own id (see _subjects).
        own_id = subjects.OWN_CLAIM_ID.format(prefix=self._prefix, job=req.job, slot_key=slot_key)
        outcome = await self._publish_claim(
            req, subject, payload, own_id, deadline, loop.time(), now
        )
        if outcome is None:
            return _lost(req, f"lost: the claim id {own_id} is held by another subject's message")
        return outcome

    async def _publish_claim(
        self,
        req: ClaimRequest,
        subject: str,
        payload: bytes,
        msg_id: str,
        deadline: float,
        at: float,
        now: int,
    ) -> ClaimOutcome | None:
        """Publish the claim under ``msg_id`` and tell who won; None if the id is held by a
        message on another subject (another prefix's claim on a shared stream)."""
        unsure: list[BaseException] = []  # attempts that may have been stored unanswered
        connection = self._connection
        try:
            # The first attempt by itself: most claims need no other.
            ack = await connection.publish(
                subject, payload, msg_id, connection.first_wait(deadline, at)
            )
        except Exception as exc:
            if errors.maybe_sent(exc):
                unsure.append(exc)
            ack = await self._publish_retrying(req, subject, payload, msg_id, deadline, exc, unsure)
        if not ack.duplicate:
            # The first message with this id: ours, decided by the ack alone (the seed reads
            # back only on a duplicate). Start time is the local clock's until finish() reads
            # the stored claim's timestamp.
            if self._unsure:
                self._unsure.pop(req.token, None)
            self._readback.mine(ack.seq)
            if req.skip_reason is None:
                return _won(req, ack.seq, now)
            return _answer(req, records.claim_of_request(req, ack.seq, now), exact=False)
        stored_claim = await self._read_duplicate(req, msg_id, ack.seq, bool(unsure))
        if stored_claim is None or isinstance(stored_claim, ClaimOutcome):
            return stored_claim
        if logger.isEnabledFor(logging.DEBUG):  # two of three claims of a race: no arguments
            logger.debug(
                "claim %s is a duplicate of seq %d (%s)",
                msg_id,
                ack.seq,
                "ours: a retried publish" if stored_claim.token == req.token else "another's",
                extra=log_fields(Action.CLAIM_DUPLICATE, req.job, req.slot),
            )
        return _answer(req, stored_claim, exact=True)

    async def _publish_retrying(
        self,
        req: ClaimRequest,
        subject: str,
        payload: bytes,
        msg_id: str,
        deadline: float,
        failed: Exception,
        unsure: list[BaseException],
    ) -> Ack:
        """The claim's publish after its first attempt failed with ``failed``: retried (the
        same id and payload) while transient, until ``deadline``. Each attempt that may have
        been stored unanswered is added to ``unsure``; if none succeeds and any may have been
        stored, the claim is remembered to be settled (:meth:`settle`)."""

        async def publish(wait_s: float) -> Ack:
            try:
                return await self._connection.publish(subject, payload, msg_id, wait_s)
            except Exception as exc:
                if errors.maybe_sent(exc):
                    unsure.append(exc)
                raise

        try:
            return await self._connection.retry(
                publish,
                f"claiming {msg_id}",
                deadline,
                log_fields(Action.NATS_RETRY, req.job, req.slot),
                failed=failed,
            )
        except BackendUnavailable:
            if unsure:
                self._remember_unsure(req)
            raise

    async def _read_duplicate(
        self, req: ClaimRequest, msg_id: str, seq: int, unsure: bool
    ) -> Claim | ClaimOutcome | None:
        """The stored claim a duplicate ack points at, or the outcome when it cannot be read;
        None when it is a message on another subject (another prefix's, on a shared stream).

        * gone (trimmed by the per-subject limit): lost, nobody to ask;
        * unreadable, and none of our publishes with this token can have been stored (this is
          the first answer we got): lost to another instance, logged;
        * unreadable, and it may be ours (an earlier publish of this token went unanswered):
          BackendUnavailable, so the core retries the claim with the same token and a later
          read settles it.
        """
        readback = self._readback
        delivered = readback.take(seq)
        if delivered is None:
            delivered = await readback.wait(seq)
        if delivered is not None:
            fed = records.decode_claim(delivered)
            # The same claim id, or it is read by sequence below (a stream deleted and created
            # again under the same name numbers its messages anew).
            if fed is not None and fed.job == req.job and fed.slot_key == req.slot_key:
                self._unsure.pop(req.token, None)
                return fed
        maybe_ours = unsure or req.token in self._unsure
        try:
            stored = await self._connection.get_retrying({"seq": seq}, f"reading claim {msg_id}")
        except BackendUnavailable as exc:
            if maybe_ours:
                self._remember_unsure(req)
                raise
            logger.warning(
                "claim %s lost: the slot's claim (seq %d) is another instance's, and reading it "
                "failed (%s)",
                msg_id,
                seq,
                exc,
                extra=log_fields(Action.CLAIM_UNREAD, req.job, req.slot),
            )
            return _lost(
                req,
                f"lost: the slot's claim (seq {seq}) is another instance's; reading it failed: "
                f"{exc}",
            )
        self._unsure.pop(req.token, None)
        if stored is None:
            return _lost(
                req,
                f"lost: the winning claim (seq {seq}) was already trimmed from stream "
                f"{self._connection.stream!r} (history_size={self._history_size})",
            )
        if stored.subject != subjects.CLAIMS.format(prefix=self._prefix, job=req.job):
            return None
        decoded = records.decode_claim(stored)
        if decoded is None:
            raise BackendError(
                f"NATS: message {stored.seq} on {stored.subject} has the claim id {msg_id} "
                "but is not an anarchon claim; is something else publishing under prefix "
                f"{self._prefix!r}?"
            )
        return decoded

    def _unrecorded_skip(self, req: ClaimRequest, now: int) -> ClaimOutcome:
        reason = (
            f"{req.skip_reason}; not recorded: the slot is too close to the end of the "
            f"duplicate window ({self._window.ms} ms), where a "
            "record could no longer be told apart from the slot's claim"
        )
        return _new_outcome(status=ClaimStatus.SKIPPED, run=records.unrecorded(req, now, reason))

    # -- results ----------------------------------------------------------------------------

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
        answers = await _in_flight(
            self._results_gate,
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

    async def close(self) -> None:
        """Refuse claims from now on, close the wins kept from failed batches (nobody runs
        them now, see :meth:`claim`) within :data:`CLOSE_SETTLE_S`, and stop the claims feed
        (see :mod:`._readback`)."""
        self._closing = True
        self._kept.clear()
        won = [(t, e.ticket) for t, e in self._unsure.items() if e.ticket is not None]
        if won and self._connection.started:
            for token, _ in won:
                del self._unsure[token]

            async def close_all() -> None:
                await _in_flight(
                    asyncio.Semaphore(MAX_IN_FLIGHT),
                    MAX_IN_FLIGHT,
                    [ticket for _, ticket in won],
                    lambda ticket: self._close_won(ticket, "before it stopped"),
                )

            try:
                await asyncio.wait_for(close_all(), CLOSE_SETTLE_S)
            except TimeoutError:
                logger.warning(
                    "%d won claims of failed batches not closed at stop within %.0f s; if not, "
                    "history shows them running",
                    len(won),
                    CLOSE_SETTLE_S,
                    extra={"action": "settle_failed"},
                )
        await self._readback.close()

    async def _close_won(self, ticket: Ticket, until: str) -> None:
        """Close a claim won in a batch that failed, never handed to the scheduler: nobody
        ran it. Recorded ``skipped``, saying why."""
        reason = (
            f"not run: {ticket.instance} won the claim in a batch that failed while NATS was "
            f"unavailable, and could not hand it to its scheduler {until}"
        )
        await self.finish(ticket, RunStatus.SKIPPED, None, reason)
        logger.info(
            "claim %s:%s settled: won in a failed batch, never run; closed as skipped",
            ticket.job,
            ticket.slot_key,
            extra=log_fields(Action.CLAIM_SETTLED, ticket.job, ticket.slot),
        )

    # -- settling claims the scheduler gave up on --------------------------------------------

    def _remember_unsure(self, req: ClaimRequest, ticket: Ticket | None = None) -> None:
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
        self._unsure[req.token] = _Unsure(req, CLOCK.now_ms(), ticket)

    def _settle_due(self, req: ClaimRequest, since_ms: int, now: int) -> bool:
        """True once the scheduler has surely stopped retrying the claim: its slot is later than
        max_late_ms + CLAIM_MARGIN_MS (a manual run: a minute after the first failure)."""
        slot = _own_slot(req)
        if slot is None:
            return now >= since_ms + MANUAL_SETTLE_AFTER_MS
        return now > slot + self._window.max_late_ms(req.job) + CLAIM_MARGIN_MS

    async def upkeep(self) -> None:
        """While started: every WINDOW_CHECK_S read the stream's window and raise it again if it
        fell below what this instance keeps (another instance shrank it with
        ``shrink_window=True``); every SETTLE_EVERY_S settle the claims the scheduler gave up
        on whose publish may have been stored."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + WINDOW_CHECK_S
        while True:
            await asyncio.sleep(max(0.05, min(SETTLE_EVERY_S, next_check - loop.time())))
            try:
                if loop.time() >= next_check:
                    next_check = loop.time() + WINDOW_CHECK_S
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
                    extra={"action": "upkeep_failed", "stream": stream},
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
        answers = await _in_flight(
            self._results_gate, RESULTS_IN_FLIGHT, due, lambda item: self._settle_one(item[1])
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
                    extra={"job": entry.request.job, "action": "settle_failed"},
                )
            self._unsure.pop(token, None)

    async def _settle_one(self, entry: _Unsure) -> None:
        req = entry.request
        msg_id = subjects.CLAIM_ID.format(job=req.job, slot_key=req.slot_key)
        if entry.ticket is not None:
            await self._close_won(entry.ticket, "until the slot was too late")
            return
        reason = (
            f"not run: {req.instance} could not confirm its claim while NATS was unavailable, "
            "until the slot was too late"
        )
        loop = asyncio.get_running_loop()
        deadline = self._connection.retry_deadline()
        now = CLOCK.now_ms()
        slot = _own_slot(req)
        if slot is not None:
            safe_ms = self._safe_until_ms(slot, SKIP_SAFETY_MS)
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
        await self.finish(claim.ticket(), RunStatus.SKIPPED, None, reason)
        logger.info(
            "claim %s settled: it was stored but never confirmed, so nobody ran it; closed as "
            "skipped (%s)",
            msg_id,
            reason,
            extra=log_fields(Action.CLAIM_SETTLED, req.job, req.slot),
        )


async def _answered(batch: asyncio.Future[Any], failed: list[BackendUnavailable]) -> None:
    """The batch's call was cancelled: start no more of its claims, and wait (cancelled again
    or not) up to a request's timeout for those in flight to be answered; then cancel it."""
    failed.append(BackendUnavailable("NATS: claim not sent: its scheduler is stopping"))
    loop = asyncio.get_running_loop()
    until = loop.time() + _connection.REQUEST_TIMEOUT_S + 0.5
    while not batch.done() and loop.time() < until:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({batch}, timeout=until - loop.time())
    if not batch.done():
        batch.cancel()
        with contextlib.suppress(BaseException):
            await batch


async def _in_flight(
    gate: asyncio.Semaphore,
    limit: int,
    items: Sequence[Item],
    call: Callable[[Item], Awaitable[Answer]],
    answers: dict[int, Answer | Exception] | None = None,
    failed: list[BackendUnavailable] | None = None,
) -> list[Answer | Exception]:
    """``call(item)`` for each item, by at most ``limit`` workers, as many at once as ``gate``
    (shared with other calls, at most ``limit`` wide) lets through, in order: each
    answer, or the exception it raised, in its item's place. Once one raised
    :class:`BackendUnavailable` (the backend is down), the items not started yet get that
    error at once. ``answers``: filled (by item index) as answers come, so that a caller
    cancelled meanwhile still has those decided; ``failed``: the caller's, to stop the items
    not started yet (see :func:`_answered`).

    A few workers take the items in order, rather than a task per item: a burst of 10 000
    claims is then 256 tasks, not 10 000 tasks and their waits at the gate (fewer objects for
    the garbage collector to walk, too)."""
    if answers is None:
        answers = {}
    if failed is None:
        failed = []
    order = iter(range(len(items)))

    async def work() -> None:
        for n in order:
            async with gate:
                if failed:
                    answers[n] = failed[0]
                    continue
                try:
                    answers[n] = await call(items[n])
                except BackendUnavailable as exc:
                    failed.append(exc)
                    answers[n] = exc
                except Exception as exc:
                    answers[n] = exc

    await asyncio.gather(*(work() for _ in range(min(len(items), limit))))
    return [answers[n] for n in range(len(items))]


def _own_slot(req: ClaimRequest) -> int | None:
    """The slot whose time bounds the claim id's life in the duplicate window: the request's
    slot when it is claimed under the slot's own key. A retry (``<slot>-retry-<n>``) or a
    triggered run is first claimed when its request falls due, not at its slot: None."""
    if req.slot is not None and req.slot_key == str(req.slot):
        return req.slot
    return None


def _won(req: ClaimRequest, seq: int, now_ms: int) -> ClaimOutcome:
    """WON, on a non-duplicate ack of the claim ``req`` (not a skip record) stored at ``seq``:
    what :func:`_answer` makes of :func:`._records.claim_of_request`, built straight from the
    request."""
    run = records.run_of(req, _RUNNING, now_ms, fence=seq, requested_by=req.requested_by)
    ticket = ticket_of(req, attempt=1, fence=seq, started_at_ms=now_ms, backend_now_ms=now_ms)
    return _new_outcome(status=_WON, run=run, ticket=ticket)


def _answer(req: ClaimRequest, claim: Claim, *, exact: bool) -> ClaimOutcome:
    run = claim.run()
    if claim.skipped:
        return _new_outcome(status=ClaimStatus.SKIPPED, run=run)
    if claim.token == req.token:
        now = claim.time_ms if exact else None
        return _new_outcome(status=_WON, run=run, ticket=claim.ticket(), backend_now_ms=now)
    return _new_outcome(status=_LOST, run=run)


def _lost(req: ClaimRequest, reason: str) -> ClaimOutcome:
    """Lost, with no stored claim to show (trimmed, or unreadable)."""
    run = records.unrecorded(req, CLOCK.now_ms(), reason)
    return _new_outcome(status=_LOST, run=run)
