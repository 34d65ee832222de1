"""The claim path: build a slot's request, claim it (retrying while the backend is unavailable,
failing closed), and act on the outcome (run what was won, log the rest, watch runs others hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import otel
from ._active import ActiveRun
from ._batch import MAX_BATCH, isolate
from ._clock import BackendTime, Clock
from ._collector import Pause, pause
from ._frozen import maker
from ._job import Job
from ._members import SCHEDULE, WON
from ._metrics import Counters, refused, unrecorded
from ._models import RunStatus, SkipCause, Trigger
from ._retry import backoff
from ._runner import RunExecutor
from ._threads import HandlerThreads
from ._watcher import BackupWatcher
from .backend import Backend, ClaimOutcome, ClaimRequest, ClaimStatus, slot_key_of
from .errors import BackendUnavailable
from .logs import Action, log_fields

__all__ = ["Claimed", "Claims", "share_first"]

logger = logging.getLogger("anarchon.scheduler")

THREAD_POLL_S: Final = 0.05
# One request per fired slot (see anarchon._frozen).
_new_request: Final = maker(ClaimRequest)
# A due batch reaches the backend in parts of at most this many claims, one part after
# another, each judged too late right before it is sent and retried on its own: a backend that
# bounds how long one call may take to send (NATS publishes a call's claims within
# CLAIM_RETRY_S of it) then still claims 50 000 slots due at once, and a part that fails does
# not cost the runs the parts before it won. One part at a time, not a few at once: two at once
# did not start the last of a 10 000-slot burst measurably sooner on any backend (2026-12-04,
# 3 instances), and a part that waits for the one before it is judged when it really goes out.
CLAIM_PART: Final = MAX_BATCH

Claimed = tuple[ClaimRequest, ClaimOutcome | Exception, int]
"""A request, the backend's answer (or the error for that request alone), and when it was sent
(monotonic ms)."""
Answered = tuple[list[ClaimRequest], list[ClaimOutcome | Exception], int]
"""A part's requests sent, the backend's answers (or errors) in their order, and when they were
sent (monotonic ms): one list each, not a :data:`Claimed` tuple per request."""


def _new_ids() -> tuple[str, str]:
    """Two random 128-bit ids in hex (a run id and a token), from one read of the system's
    random source: a burst builds thousands of requests at once, one system call each."""
    both = os.urandom(32).hex()
    return both[:32], both[32:]


_CLAIM_ACTIONS: Final = {
    ClaimStatus.WON: Action.CLAIM_WON,
    ClaimStatus.LOST: Action.CLAIM_LOST,
    ClaimStatus.SKIPPED: Action.CLAIM_SKIPPED,
}


def _extra(outcome: ClaimOutcome) -> dict[str, Any]:
    """The log fields of a claim's outcome."""
    run = outcome.run
    action = _CLAIM_ACTIONS[outcome.status]
    if outcome.status is ClaimStatus.LOST and refused(outcome):
        action = Action.CLAIM_REFUSED
    return log_fields(action, run.job, run.slot_ms, holder=run.instance)


def _parts(requests: Sequence[ClaimRequest], consume: bool) -> Iterator[list[ClaimRequest]]:
    """``requests`` in parts of at most :data:`CLAIM_PART`; with ``consume`` (and a list), each
    part taken out of the list as it is handed out, so what was sent can be freed."""
    if consume and isinstance(requests, list):
        while requests:
            part = requests[:CLAIM_PART]
            del requests[:CLAIM_PART]
            yield part
        return
    for first in range(0, len(requests), CLAIM_PART):
        yield list(requests[first : first + CLAIM_PART])


def share_first(
    requests: list[ClaimRequest], share_of: Callable[[str], tuple[int, int] | None]
) -> list[ClaimRequest]:
    """``requests`` turned to begin with this instance's share of their parts, when they take
    more than one: ``share_of(job)`` of the first is this instance's position among the
    instances that fire them and how many they are (None: as they are).

    Instances that fire the same slots in the same order would otherwise all claim the first
    part together (one wins it, the others wait for it and lose), then the second, and so on.
    Each beginning with a part of its own, they win their first parts side by side and the
    runs of a burst start sooner. The claims still decide: instances that disagree on their
    shares only lose more claims. Only whole parts move, and a last, shorter part stays last,
    so every instance's parts hold the same slots. Requests naming one job twice (slots caught
    up together) keep their order: a job's earlier slot is claimed before its later one."""
    if len(requests) <= CLAIM_PART or len({r.job for r in requests}) != len(requests):
        return requests
    share = share_of(requests[0].job)
    if share is None:
        return requests
    position, count = share
    whole = len(requests) // CLAIM_PART * CLAIM_PART
    cut = position * (whole // CLAIM_PART) // count * CLAIM_PART
    return requests[cut:whole] + requests[:cut] + requests[whole:]


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _job_of(request: ClaimRequest) -> str:
    return request.job


def _named(requests: Sequence[ClaimRequest]) -> str:
    """The first of ``requests`` and how many more, for a log line."""
    first, more = requests[0], len(requests) - 1
    return f"{first.job} slot {first.slot}" + (f" and {more} more" if more else "")


@dataclass(eq=False)
class Claims:
    """Claims slots for one scheduler and hands the winners to its executor."""

    _backend: Backend
    _clock: Clock
    _backend_time: BackendTime
    _jobs: dict[str, Job]
    _executor: RunExecutor
    _watcher: BackupWatcher | None
    _threads: HandlerThreads
    _counters: Counters
    _running: Callable[[], bool]
    _spawn: Callable[[Coroutine[Any, Any, Any]], None]
    instance: str = ""
    """This instance's id, set by the scheduler when it starts."""
    _in_flight: int = field(default=0, init=False)
    _idle: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self._idle.set()

    # -- requests ---------------------------------------------------------------------------

    def request(
        self, job: Job, slot: int | None, trigger: Trigger, now: int | None = None
    ) -> ClaimRequest:
        """A claim of ``job``'s ``slot`` (None for a manual run). A scheduled slot reached more
        than ``max_late_ms`` after it (``now``, on the backend's clock) is claimed as skipped."""
        policy = job.policy
        skip_reason = skip_cause = None
        if slot is not None and now is not None and trigger is SCHEDULE:
            late = now - slot
            if late > policy.max_late_ms:
                self._counters.too_late += 1
                skip_cause = SkipCause.TOO_LATE
                skip_reason = (
                    f"too late: {self.instance} reached the slot {late} ms after "
                    f"it (max_late_ms={policy.max_late_ms})"
                )
                logger.warning(
                    "job %s slot %s: %s",
                    job.name,
                    slot,
                    skip_reason,
                    extra=log_fields(Action.TOO_LATE, job.name, slot),
                )
        run_id, token = _new_ids()
        return _new_request(
            job=job.name,
            slot=slot,
            run_id=run_id,
            token=token,
            instance=self.instance,
            trigger=trigger,
            lease_ms=policy.lease_ms,
            overlap=policy.overlap,
            history_ttl_ms=policy.history_ttl_ms,
            skip_reason=skip_reason,
            skip_cause=skip_cause,
        )

    def starved(self, requests: list[ClaimRequest]) -> None:
        """Log (and count) slots of plain handlers not claimed: every handler thread is busy."""
        self._counters.no_thread += len(requests)
        first = requests[0]
        logger.warning(
            "not claiming %d slot(s) of plain handlers (%s): all %d handler threads are busy "
            "(max_workers); other instances run them",
            len(requests),
            _named(requests),
            self._threads.max_workers,
            extra=log_fields(Action.NO_THREAD, first.job, first.slot),
        )

    async def reserve_thread(self, wait_s: float) -> bool:
        """Set a handler thread aside, waiting up to ``wait_s`` for one to free up."""
        deadline = self._clock.monotonic_ms() + wait_s * 1000
        while not self._threads.reserve():
            if self._clock.monotonic_ms() >= deadline or not self._running():
                return False
            await self._clock.sleep(THREAD_POLL_S)
        return True

    # -- claiming ---------------------------------------------------------------------------

    async def fire(
        self,
        requests: list[ClaimRequest],
        reserved: set[str],
        deadline_s: float | None = None,
        not_before_ms: int | None = None,
        keep: bool = True,
    ) -> list[Claimed]:
        """Claim fired slots (or run requests) and act on each outcome; ``reserved`` names the
        requests (run ids) holding a thread reservation, given back unless a run started with
        it. Returns the decided claims (see :meth:`claim` for ``deadline_s`` and ``keep``).
        With ``not_before_ms`` (wall clock), the claims are sent at that time precisely, not
        before: slots the timer handed over just before their time."""

        def act(answered: Answered) -> None:
            # A part's outcomes are all handed out before its runs begin: yielding to the loop
            # every few hundred outcomes starts the first handlers sooner but the last ones
            # later (the early runs' results compete with the rest), and "all started" is
            # what counts. Its runs then start while the next part is claimed.
            sent_requests, answers, sent = answered
            for request, outcome in zip(sent_requests, answers, strict=True):
                if not isinstance(outcome, ClaimOutcome):
                    continue  # refused for good; logged with its job
                ours = request.run_id in reserved
                if self.handle(outcome, ours, sent, request) is not None and ours:
                    reserved.discard(request.run_id)

        try:
            if not_before_ms is not None:
                await self._clock.sleep_until(not_before_ms, True)
            return await self.claim(requests, deadline_s, act, keep)
        finally:
            for _ in reserved:
                self._threads.unreserve()

    async def claim(
        self,
        requests: Sequence[ClaimRequest],
        deadline_s: float | None = None,
        answered: Callable[[Answered], None] | None = None,
        keep: bool = True,
    ) -> list[Claimed]:
        """Claim with retries while the backend is unavailable; fail closed.

        The requests go to the backend in parts of at most :data:`CLAIM_PART`, one after
        another; ``answered`` (if given) gets each part's decided claims as soon as they are
        known; the runs a part won start while the next part is claimed (on a backend whose
        claim never lets the event loop run, before the next part's answers are acted on).
        Returns the decided claims; with ``keep=False`` none are kept (an empty list): a
        burst's requests and answers are then freed part by part, as soon as ``answered`` has
        acted on them, and a list of ``requests`` is emptied as its parts are sent (the caller
        hands it over).

        A scheduled request is sent (and retried) only until its slot becomes too late (on the
        backend's clock); a manual or catch-up request until ``deadline_s`` (monotonic, from
        this call, if given): a part is judged right before it is sent, and after each retry
        pause. Dropped requests are logged, not run. A request the backend refuses for
        good (not a transient error) gets its error in its place; the others of its batch are
        unaffected, and a part that fails does not undo the parts before it.
        """
        self._in_flight += 1
        self._idle.clear()
        started = self._clock.monotonic_ms()
        claimed: list[Claimed] = []
        # Results of the first parts' runs wait for the last part (see ResultRecorder.hold).
        held = len(requests) > CLAIM_PART
        collecting: Pause | None = None
        if held:
            self._executor.results.hold()
            # A burst: its runs start with the garbage collector held back (see _collector).
            collecting = pause()
        # Set once the event loop has run since the last part's runs were handed out (they
        # have started then): see below.
        loop_ran: asyncio.Future[None] | None = None
        try:
            for n, part in enumerate(_parts(requests, not keep)):
                if n and not self._running():
                    self._not_sent(part)
                    continue
                sendable = self._sendable(part, started, deadline_s)
                if not sendable:
                    continue
                answers = await self._claim_retrying(sendable, started, deadline_s)
                if answers is None:
                    continue
                if loop_ran is not None and not loop_ran.done():
                    # The backend answered without letting the loop run (memory): the runs of
                    # the part before start now, not after the last part. A backend that waits
                    # for its answer has run them meanwhile, the next part already sent.
                    await asyncio.sleep(0)
                self._answered(answers, answered)
                if keep:
                    sent = answers[2]
                    claimed += [(r, a, sent) for r, a in zip(answers[0], answers[1], strict=True)]
                if answered is not None:
                    loop_ran = asyncio.get_running_loop().create_future()
                    asyncio.get_running_loop().call_soon(_set_done, loop_ran)
            if collecting is not None:
                # After the last part's runs have started: they were handed out just now.
                asyncio.get_running_loop().call_soon(collecting.end)
                collecting = None
            return claimed
        finally:
            if collecting is not None:  # cancelled or failed: at once (the loop may be closing)
                collecting.end()
            if held:
                self._executor.results.release()
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _answered(self, answers: Answered, answered: Callable[[Answered], None] | None) -> None:
        """Give the part's claims their spans and its answers to ``answered``, with the tracer
        looked up once for both (each look-up asks the OpenTelemetry API for its provider)."""
        with otel.pinned():
            otel.claimed(*answers, self._backend.name, self._clock.monotonic_ms())
            if answered is not None:
                answered(answers)

    def _not_sent(self, part: Sequence[ClaimRequest]) -> None:
        """Log a part not sent because the scheduler is stopping."""
        logger.info(
            "stopping: %d slot(s) not claimed (%s); other instances run them",
            len(part),
            _named(part),
            extra=log_fields(Action.CLAIM_FAILED, part[0].job, part[0].slot),
        )

    async def settle(self, limit_s: float) -> None:
        """Let claims already sent come back, for up to ``limit_s``."""
        if self._in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), limit_s)

    def _sendable(
        self, part: Sequence[ClaimRequest], started: int, deadline_s: float | None
    ) -> list[ClaimRequest]:
        """The requests of ``part`` still in time to be sent, judged now: the parts before it
        may have taken long enough to make some too late (a skip record stays: it runs
        nothing, and it tells history why the slot did not run)."""
        now = self._backend_time.now_ms()
        waited_ms = self._clock.monotonic_ms() - started
        keep: list[ClaimRequest] = []
        late: list[ClaimRequest] = []
        for request in part:
            if request.skip_reason is None and self._expired(request, now, waited_ms, deadline_s):
                late.append(request)
            else:
                keep.append(request)
        if late:
            logger.warning(
                "%d slot(s) not claimed (%s): too late by the time their part of the batch "
                "could be sent, %d ms after the first part; nobody runs them on a guess",
                len(late),
                _named(late),
                waited_ms,
                extra=log_fields(Action.CLAIM_FAILED, late[0].job, late[0].slot),
            )
            error = TimeoutError(
                f"not claimed: too late by the time its part of the batch could be sent, "
                f"{waited_ms} ms after the first part"
            )
            self._unclaimed(late, error, started)
        return keep

    async def _claim_retrying(
        self, pending: list[ClaimRequest], started: int, deadline_s: float | None
    ) -> Answered | None:
        error: BackendUnavailable | None = None
        first_sent: int | None = None
        for delay in backoff():
            sent = self._clock.monotonic_ms()
            if first_sent is None:
                first_sent = sent
            try:
                answers = await isolate(self._backend.claim, pending, _job_of, "claiming a slot")
            except BackendUnavailable as exc:
                self._counters.claim_errors += 1
                if error is None:
                    logger.warning(
                        "claiming %d slot(s) failed, retrying until they are too late: %s",
                        len(pending),
                        exc,
                        extra=log_fields(Action.CLAIM_RETRY, pending[0].job),
                    )
                error = exc
            else:
                self._counters.claimed(self._clock.monotonic_ms() - sent)
                return pending, answers, sent
            if not self._running():
                return None
            await self._clock.sleep(delay)
            # Re-check after the pause: a slot that became too late meanwhile is not claimed.
            now = self._backend_time.now_ms()
            waited_ms = self._clock.monotonic_ms() - started
            keep: list[ClaimRequest] = []
            expired: list[ClaimRequest] = []
            for request in pending:
                if self._expired(request, now, waited_ms, deadline_s):
                    logger.warning(
                        "job %s slot %s not claimed: %s unavailable (%s); nobody runs it on "
                        "a guess",
                        request.job,
                        request.slot,
                        self._backend.name,
                        error,
                        extra=log_fields(Action.CLAIM_FAILED, request.job, request.slot),
                    )
                    expired.append(request)
                else:
                    keep.append(request)
            if expired:
                assert error is not None and first_sent is not None
                self._unclaimed(expired, error, first_sent)
            pending = keep
            if not pending:
                return None
        return None  # pragma: no cover

    def _unclaimed(self, requests: list[ClaimRequest], error: Exception, sent: int) -> None:
        """Count the slots of ``requests`` as not claimed (``unclaimed``, reason ``error``) and
        give each its claim span, outcome ``error``: ``error`` is why, ``sent`` (monotonic)
        when their first claim was sent."""
        counters = self._counters
        for request in requests:
            counters.unclaimed(request.job, request.trigger, "unclaimed_error")
        otel.claimed(
            requests,
            [error] * len(requests),
            sent,
            self._backend.name,
            self._clock.monotonic_ms(),
        )

    def _expired(
        self, request: ClaimRequest, now: int, waited_ms: int, deadline_s: float | None
    ) -> bool:
        if deadline_s is not None and waited_ms > deadline_s * 1000:
            return True
        if request.trigger is SCHEDULE and request.slot is not None:
            job = self._jobs.get(request.job)
            limit = job.policy.max_late_ms if job else 0
            return now - request.slot > limit
        return False

    # -- outcomes ---------------------------------------------------------------------------

    def handle(
        self,
        outcome: ClaimOutcome,
        reserved: bool = False,
        sent: int | None = None,
        request: ClaimRequest | None = None,
    ) -> ActiveRun | None:
        """Act on a claim's outcome: run what was won, log the rest, watch runs others hold.
        ``request``: the claim it answers, for its slot key (a retry's differs from its
        slot's), read only for a run another instance holds.

        Returns the run started (which then owns the thread reservation), or None."""
        run = outcome.run
        self._counters.claim_answered(outcome, self.instance)
        job = self._jobs.get(run.job)
        if outcome.status is WON:
            assert outcome.ticket is not None
            self._counters.claims_won += 1
            if logger.isEnabledFor(logging.DEBUG):  # a burst of thousands: no fields unless logged
                logger.debug("won %s slot %s", run.job, run.slot_ms, extra=_extra(outcome))
            if job is not None:
                return self._executor.start(job, outcome.ticket, reserved=reserved, sent_ms=sent)
            error = "the job was removed before its claimed slot could run"
            self._spawn(self._backend.finish(outcome.ticket, RunStatus.FAILED, error))
        elif outcome.status is ClaimStatus.SKIPPED:
            if unrecorded(outcome):  # answered skipped, nothing stored: no record counts it
                self._counters.unclaimed(run.job, run.trigger, "unclaimed_error")
            logger.info(
                "job %s slot %s skipped: %s",
                run.job,
                run.slot_ms,
                run.reason,
                extra={**_extra(outcome), "reason": run.reason},
            )
        elif outcome.error is not None:
            # The backend refused this request alone (a value it cannot store): nobody runs it.
            self._counters.claims_refused += 1
            self._counters.unclaimed(run.job, run.trigger, "unclaimed_refused")
            logger.error(
                "job %s slot %s: the %s backend refused the claim: %s",
                run.job,
                run.slot_ms,
                self._backend.name,
                outcome.error,
                extra=_extra(outcome),
            )
        elif refused(outcome):
            # Nothing recorded: the backend cannot vouch for the slot (pruned past it, or a
            # Redis that lost its data); nobody runs it, and no other instance won it.
            self._counters.unclaimed(run.job, run.trigger, "unclaimed_refused")
            logger.warning(
                "job %s slot %s not run: the %s backend refused the claim: %s",
                run.job,
                run.slot_ms,
                self._backend.name,
                run.reason,
                extra={**_extra(outcome), "reason": run.reason},
            )
        else:
            self._counters.claims_lost += 1
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "lost %s slot %s to %s",
                    run.job,
                    run.slot_ms,
                    run.instance,
                    extra=_extra(outcome),
                )
            if self._watcher is not None and run.status == "running" and job is not None:
                if request is not None:
                    slot_key = request.slot_key
                else:
                    slot_key = slot_key_of(run.slot_ms, run.run_id)
                self._watcher.watch(
                    run.job, slot_key, outcome.lease_expires_at_ms, outcome.backend_now_ms
                )
        return None
