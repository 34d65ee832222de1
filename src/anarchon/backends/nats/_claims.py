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
claim, it is settled in the background (:mod:`._settle`). Results are published by
:mod:`._results`.

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from ...backend import ClaimNotice, ClaimOutcome, ClaimRequest, ClaimStatus, SkipCause
from ...control import PAUSED_TRIGGERS, paused_reason
from ...errors import BackendError, BackendUnavailable
from ...kit import Action, RunStatus, log_fields, maker
from ...kit.feed import won_notices
from ...kit.lease import ticket_of
from . import _errors as errors
from . import _records as records
from . import _subjects as subjects
from . import _timings as timings
from ._connection import MAX_IN_FLIGHT, in_flight
from ._context import Context
from ._readback import ReadBack
from ._records import Claim
from ._results import CLOCK, Results
from ._settle import MAX_UNSURE, Kept, Settler, Unsure
from ._wire import Ack

if TYPE_CHECKING:
    from ._control import NatsControl

logger = logging.getLogger("anarchon.backends.nats")

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
# this many, or what it holds once a win comes NOTICE_HOLD_S (._timings) after the first one held.
NOTICE_CHUNK: Final = 64
# Slots another instance was heard winning (claim notices), remembered by claim id: a claim
# that reaches the gate after such a notice is not published (it could only lose). About 20 s
# of a fleet that wins 5 000 slots a second; the oldest go first.
MAX_HEARD: Final = 100_000

# Every claim's answer: built by a maker (see anarchon._frozen), with the members it reads as
# constants (on Python 3.11 ``ClaimStatus.WON`` goes through EnumType's ``__getattr__``).
_new_outcome: Final = maker(ClaimOutcome)
_WON: Final = ClaimStatus.WON
_LOST: Final = ClaimStatus.LOST
_RUNNING: Final = RunStatus.RUNNING
# What a claim publishes: its subject, payload and message id (a plain tuple: every claim makes
# one, and each publish takes it apart).
Message: TypeAlias = tuple[str, bytes, str]


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
        if len(pending) >= NOTICE_CHUNK or now - self._since >= timings.NOTICE_HOLD_S:
            await self.flush()

    async def flush(self) -> None:
        if self._pending and self._announce is not None:
            pending, self._pending = self._pending, []
            await self._announce(won_notices(pending))


class TooLate:
    """Counts the claims not sent because their turn at the in-flight gate came more than
    ``max_late_ms`` after their slot, and tells them in one WARNING ``claims_too_late`` per
    :data:`._timings.TOO_LATE_WARN_S` at most (the first at once; each later one counts those since
    the one before). Each slot is also logged at INFO, as any skip, by the scheduler."""

    __slots__ = ("_count", "_warned", "_worst_ms")

    def __init__(self) -> None:
        self._count = 0
        self._worst_ms = 0
        self._warned: float | None = None

    def add(self, late_ms: int) -> None:
        """One claim not sent, its turn ``late_ms`` after its slot."""
        self._count += 1
        self._worst_ms = max(self._worst_ms, late_ms)

    def warn(self, now: float) -> None:
        """Log the WARNING if claims were counted and the last one is
        :data:`._timings.TOO_LATE_WARN_S` old or more; ``now``: event-loop time (s)."""
        warned = self._warned
        if not self._count or (warned is not None and now - warned < timings.TOO_LATE_WARN_S):
            return
        count, worst = self._count, self._worst_ms
        self._count = self._worst_ms = 0
        self._warned = now
        since = "" if warned is None else f" in the last {now - warned:.0f} s"
        logger.warning(
            "%d slot(s) not claimed%s: their claim's turn came more than max_late_ms after the "
            "slot (the latest %d ms after), behind earlier claims: this cluster has more "
            "every-second slots due than it can claim; nothing recorded, counted "
            "slots_unclaimed (see docs/backends/nats.md, Limits to know, every-second jobs; "
            "one such WARNING per %.0f s at most)",
            count,
            since,
            worst,
            timings.TOO_LATE_WARN_S,
            extra=log_fields(Action.CLAIMS_TOO_LATE, slots=count, late_ms=worst),
        )


class ClaimPath:
    """Claims of one backend on its stream; owns its :class:`~._results.Results` and the
    :class:`~._settle.Settler` of claims nobody will run."""

    def __init__(
        self, context: Context, *, history_size: int, control: NatsControl | None = None
    ) -> None:
        connection, prefix = context.connection, context.prefix
        self._connection = connection
        self._window = context.window
        self._prefix = prefix
        self._control = control
        self._history_size = history_size
        # Claims (by token) whose publish may have been stored without our hearing of it: a
        # duplicate ack for one of them may be our own claim, and one the scheduler gives up on
        # is settled in the background (see :mod:`._settle`).
        self._unsure: dict[str, Unsure] = {}
        self._readback = ReadBack(connection, prefix)
        # Answers of batches that failed as a whole, by token (see claim).
        self._kept: dict[str, Kept] = {}
        self.results = Results(connection, prefix=prefix)
        """Publishes the results of runs (see :mod:`._results`)."""
        self.settler = Settler(
            context, self.results, self._readback, unsure=self._unsure, kept=self._kept
        )
        """Settles the claims nobody will run, and runs the upkeep (see :mod:`._settle`)."""
        # Claim id -> the instance heard winning it (see hear).
        self._heard: dict[str, str] = {}
        self._turns = asyncio.Semaphore(BATCHES_AT_ONCE)
        self._closing = False
        self.too_late = TooLate()
        """The claims not sent because their turn came too late, told in a WARNING."""
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
        try:
            return await self._claim(requests)
        finally:
            self.too_late.warn(asyncio.get_running_loop().time())

    async def _claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """:meth:`claim`, but for the WARNING of the claims sent too late."""
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
                    in_flight(gate, MAX_IN_FLIGHT, todo, one, decided, failed)
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
            kept[req.token] = Kept(answer, req, now)
            if answer.status is _WON:
                self.settler.remember(req, answer.ticket)

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
            replace(
                r,
                skip_reason=paused_reason(held[r.job]),
                skip_status=RunStatus.SKIPPED,
                skip_cause=SkipCause.PAUSED,
            )
            if r.job in held and r.skip_reason is None and r.trigger in PAUSED_TRIGGERS
            else r
            for r in requests
        ]

    def _safe_until_ms(self, slot: int, margin_ms: int) -> int:
        """Until when a message under the slot's claim id is surely still de-duplicated."""
        return self._window.safe_until_ms(slot, margin_ms)

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
            margin = timings.SKIP_SAFETY_MS if req.skip_reason is not None else 0
            safe_ms = self._safe_until_ms(slot, margin)
            if req.skip_reason is not None and now >= safe_ms:
                return self._unrecorded_skip(req, now)
            max_late = self._window.max_late_ms(req.job)
            if req.skip_reason is None and now - slot > max_late:
                # Its turn at the gate came too late (a backlog on a slow server): not sent,
                # and nothing recorded (under such a load a skip record would only add to it).
                # CLAIM_MARGIN_MS counts from here. Answered, not raised: the others of the
                # batch, wins among them, go to the scheduler now.
                self.too_late.add(now - slot)
                reason = (
                    f"too late: {req.instance} could send its claim only {now - slot} ms after "
                    f"the slot (max_late_ms={max_late}), behind earlier claims on a slow server; "
                    "not recorded"
                )
                return _not_recorded(req, now, reason)
            # Every publish of the claim starts within CLAIM_RETRY_S of its turn at the gate,
            # which came while the slot was at most max_late_ms old (CLAIM_MARGIN_MS).
            deadline = min(at + timings.CLAIM_RETRY_S, at + (safe_ms - now) / 1000)
        else:
            # A manual run or a retry: within CLAIM_RETRY_S of the call (MANUAL_SETTLE_AFTER_MS).
            deadline = called + timings.CLAIM_RETRY_S
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
        try:
            outcome = await self._publish_claim(req, (subject, payload, msg_id), deadline, at, now)
            if outcome is not None:
                return outcome
            # The id is another prefix's claim (a stream shared by two prefixes): every instance
            # of this prefix that reads it so races again under the prefix's own id (see
            # _subjects).
            own_id = subjects.OWN_CLAIM_ID.format(
                prefix=self._prefix, job=req.job, slot_key=slot_key
            )
            outcome = await self._publish_claim(
                req, (subject, payload, own_id), deadline, loop.time(), now
            )
        except asyncio.CancelledError:
            # The call was cancelled (the scheduler stopping gave up on it) with a publish out
            # and unanswered: it may be stored, and nobody runs it. Settled at stop (see
            # :meth:`close`), rather than left ``running`` in history for good.
            self.settler.remember(req)
            raise
        if outcome is None:
            return _lost(req, f"lost: the claim id {own_id} is held by another subject's message")
        return outcome

    async def _publish_claim(
        self, req: ClaimRequest, message: Message, deadline: float, at: float, now: int
    ) -> ClaimOutcome | None:
        """Publish the claim's ``message`` and tell who won; None if its id is held by a
        message on another subject (another prefix's claim on a shared stream)."""
        subject, payload, msg_id = message
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
            ack = await self._publish_retrying(req, message, deadline, exc, unsure)
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
        message: Message,
        deadline: float,
        failed: Exception,
        unsure: list[BaseException],
    ) -> Ack:
        """The claim's publish after its first attempt failed with ``failed``: ``message``
        retried while transient, until ``deadline``. Each attempt that may have been stored
        unanswered is added to ``unsure``; if none succeeds and any may have been stored, the
        claim is remembered to be settled (:meth:`settle`)."""
        subject, payload, msg_id = message

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
                self.settler.remember(req)
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
                self.settler.remember(req)
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
        return _not_recorded(req, now, reason)

    async def close(self) -> None:
        """Refuse claims from now on, settle the claims nobody runs now (the wins kept from
        failed batches, see :meth:`claim`, and the claims whose publish may have been stored
        unanswered, a cancelled call's among them; :meth:`._settle.Settler.close`), and stop
        the claims feed (see :mod:`._readback`)."""
        self._closing = True
        await self.settler.close()
        await self._readback.close()


async def _answered(batch: asyncio.Future[Any], failed: list[BackendUnavailable]) -> None:
    """The batch's call was cancelled: start no more of its claims, and wait (cancelled again
    or not) up to a request's timeout for those in flight to be answered; then cancel it."""
    failed.append(BackendUnavailable("NATS: claim not sent: its scheduler is stopping"))
    loop = asyncio.get_running_loop()
    until = loop.time() + timings.REQUEST_TIMEOUT_S + 0.5
    while not batch.done() and loop.time() < until:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({batch}, timeout=until - loop.time())
    if not batch.done():
        batch.cancel()
        with contextlib.suppress(BaseException):
            await batch


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
    run = records.unrecorded(req, CLOCK.now_ms(), reason, None)
    return _new_outcome(status=_LOST, run=run)


def _not_recorded(req: ClaimRequest, now: int, reason: str) -> ClaimOutcome:
    """Skipped, and nothing stored: the claim was not sent (its turn came too late, or its
    skip record could no longer be told apart from the slot's claim)."""
    run = records.unrecorded(req, now, reason, SkipCause.NOT_RECORDED)
    return _new_outcome(status=ClaimStatus.SKIPPED, run=run)
