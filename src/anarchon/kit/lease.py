"""The lease rules, written once: fences, pruning, overlap, the answers to every lease call.

Backends that run the rules in Python (memory, SQLite) call these functions inside one atomic
step over a :class:`RowStore`; backends that run them in their own language (Lua, SQL) use
:class:`RunRow` and the helpers that build outcomes and errors.

:class:`~anarchon.backends.memory.MemoryBackend` and
:class:`~anarchon.backends.sqlite.SQLiteBackend` keep their rows differently but decide the same
way: each calls these functions inside one atomic step (the event loop for memory, a
``BEGIN IMMEDIATE`` transaction for SQLite) over a :class:`RowStore`. Redis and PostgreSQL express
the same rules in Lua and SQL; the conformance suite holds all of them to the same answers, and
``tests/conformance/test_differential.py`` drives random sequences of calls against each of them
and this reference side by side.

The rules every lease backend follows (the contract's docstrings in ``anarchon/backend.py`` say
the same):

* **Fences**: a new fence is ``max(the job's last fence + 1, the backend's clock in ms)``, so it
  rises even when the store lost its counter, as long as the backend's clock does not go back.
* **Pruning** happens when a result is accepted, on whole slots (every attempt of a slot key
  together), never on a slot whose latest attempt runs and never on the slot being finished.
  By age: a slot whose latest attempt ended more than ``history_ttl_ms`` ago. By count: while
  the job holds more than ``history_size`` slots, the oldest ended ones (oldest by the start of
  their first attempt). At most :data:`PRUNE_BATCH` slots per result. The newest pruned slot
  raises the job's ``pruned_through``; a claim of a slot at or below it that has no record is
  refused. A slot that has a record is always answered by its record.
* **last_slot** remembers pruned slots: it is the newest of the recorded slots and
  ``pruned_through``.
* **Retry**: a failed result that carries a retry (a :class:`~anarchon.control.RunRequest`)
  stores it in the same atomic step as the result (:meth:`RowStore.add_request`), only when
  the result is accepted, once per request id.
* **Pause**: a claim that would run (no ``skip_reason``) of a paused job, by any trigger but
  ``manual``, is recorded ``skipped`` with :func:`anarchon.control.paused_reason`; the pause is
  read in the same atomic step (:meth:`RowStore.pauses`) on the backend's clock.
* **Skip causes**: each record made instead of a run keeps its :class:`~anarchon.SkipCause`
  (:attr:`RunRow.skip_cause`): the request's ``skip_cause``, ``PAUSED``, ``OVERLAP``; a refused
  pruned slot answers ``PRUNED``. A row read without one (stored by an older anarchon, or by a
  store that keeps none) gets :func:`~anarchon.backend.legacy_skip_cause` of its reason.
* **Overlap**: the holder named in an overlap reason is the first recorded attempt of the job
  that is running under a live lease.
* **Numbers**: every time a backend stores is epoch milliseconds, and the durations a request
  carries must keep them within :data:`MAX_MS`; a request outside that is refused on its own
  (:func:`unstorable`), never failing the other items of its batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from .._frozen import maker
from .._members import CAUSE_OVERLAP as _CAUSE_OVERLAP
from .._members import CAUSE_PAUSED as _CAUSE_PAUSED
from .._members import CLAIM_SKIPPED as _CLAIM_SKIPPED
from .._members import LOST as _LOST
from .._members import OVERLAP_SKIP as _OVERLAP_SKIP
from .._members import RUNNING as _RUNNING
from .._members import SKIPPED as _SKIPPED
from .._members import WON as _WON
from .._models import Run, RunStatus, SkipCause, Trigger, ms_to_datetime
from .._schedule import slot_to_datetime
from ..backend import (
    HANDED_OVER,
    LEASE_LOST,
    OVERLAP,
    PRUNED_REASON,
    TOO_LATE,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    RunIdentity,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
    legacy_skip_cause,
)
from ..control import ControlStore, Pause, RunRequest, active_pause, paused_reason
from ..errors import BackendError, BackendUnavailable, LeaseLost

__all__ = [
    "HANDED_OVER",
    "LEASE_LOST",
    "MAX_ATTEMPTS",
    "MAX_MS",
    "OVERLAP",
    "PRUNED_REASON",
    "PRUNE_BATCH",
    "SKIP_STATUSES",
    "TOO_LATE",
    "RowStore",
    "RunRow",
    "already_recorded",
    "answer_existing",
    "check_ticket",
    "claim",
    "existing_verdict",
    "finish",
    "first_attempt",
    "handed_over",
    "lease_lost",
    "lost_outcome",
    "next_fence",
    "not_run",
    "peek_answer",
    "peek_takeover",
    "prune_ttl",
    "pruned_outcome",
    "refused_outcome",
    "release",
    "renew",
    "retries_first",
    "skip_cause_of",
    "stored_run",
    "take_over",
    "takeover_answer",
    "ticket_of",
    "ttl_cutoff",
    "unstorable",
    "won_outcome",
]

# At most this many slots are pruned per accepted result, so a result stays a short step.
PRUNE_BATCH: Final = 100
# The largest time or duration in ms a backend stores (about 142 000 years): below 2**53, so it
# is exact as a Lua number (Redis) and a sum of two never leaves a 64-bit integer.
MAX_MS: Final = 2**52
# The statuses of a record made instead of a run: the claim's answer to them is SKIPPED.
SKIP_STATUSES: Final = frozenset({RunStatus.SKIPPED, RunStatus.MISSED})
# The largest attempt count a backend stores (a 32-bit integer on PostgreSQL).
MAX_ATTEMPTS: Final = 2**31 - 1
# Stored text to enum member by one dict lookup (a member hashes as its text): the enum's own
# call costs eight times as much, and each claim and finish converts three.
_TRIGGERS: Final = {trigger.value: trigger for trigger in Trigger}
_STATUSES: Final = {status.value: status for status in RunStatus}
_CAUSES: Final = {cause.value: cause for cause in SkipCause}
# Every claim's answer builds these records (a won claim all three): see anarchon._frozen.
_new_run: Final = maker(Run)
_new_ticket: Final = maker(Ticket)
_new_outcome: Final = maker(ClaimOutcome)


@dataclass(slots=True, kw_only=True)
class RunRow:
    """One attempt as a lease backend stores it."""

    job: str
    """The job's name."""
    slot_key: str
    """The slot key: with :attr:`job`, it names the run; every attempt of the run has it."""
    slot: int | None
    """Epoch ms of the slot; None for a manual run."""
    attempt: int
    """The attempt's number: 1 for the claim, one more for each takeover."""
    run_id: str
    """The attempt's run id."""
    token: str
    """The token of the claim or takeover that made the record; only its holder may renew, release
    or finish the attempt."""
    instance: str
    """The id of the instance that made the attempt (or recorded the skip)."""
    trigger: str
    """A :class:`~anarchon.Trigger` or its stored text."""
    status: str
    """A :class:`~anarchon.RunStatus` or its stored text."""
    fence: int
    """The attempt's fence; 0 for a record that holds none (a skip), read as None by
    :meth:`to_run`."""
    started_at: int
    """When the attempt started, or the skip was recorded (backend clock, epoch ms)."""
    finished_at: int | None = None
    """When it ended (backend clock, epoch ms); None while running."""
    lease_expires_at: int | None = None
    """When the lease ends unless renewed (backend clock, epoch ms); None for a record without a
    lease."""
    released: bool = False
    """True once its holder released it (:meth:`~anarchon.backend.LeaseBackend.release`): a backup
    may take it over at once."""
    error: str | None = None
    """Why a ``failed`` attempt failed (:attr:`Run.error <anarchon.Run.error>`); None otherwise."""
    reason: str | None = None
    """Why it was skipped or superseded, in words for people
    (:attr:`Run.reason <anarchon.Run.reason>`); None otherwise."""
    requested_by: str | None = None
    """Who asked for the run (:attr:`Run.requested_by <anarchon.Run.requested_by>`), if recorded."""
    skip_cause: str | None = None
    """A :class:`~anarchon.SkipCause` or its stored text; None: none stored (see
    :func:`skip_cause_of`)."""

    def to_run(self) -> Run:
        """Return the public, immutable record."""
        return _new_run(
            job=self.job,
            slot=ms_to_datetime(self.slot),
            run_id=self.run_id,
            instance=self.instance,
            trigger=_TRIGGERS.get(self.trigger) or Trigger(self.trigger),
            attempt=self.attempt,
            status=_STATUSES.get(self.status) or RunStatus(self.status),
            started_at=slot_to_datetime(self.started_at),
            finished_at=ms_to_datetime(self.finished_at),
            error=self.error,
            fence=self.fence or None,
            reason=self.reason,
            skip_cause=skip_cause_of(self.skip_cause, self.reason),
            requested_by=self.requested_by,
            slot_key=self.slot_key,
        )

    def ticket(self, lease_ms: int, now: int, history_ttl_ms: int | None) -> Ticket:
        """Return the holder's ticket for this attempt."""
        return ticket_of(
            self,
            attempt=self.attempt,
            fence=self.fence,
            started_at_ms=self.started_at,
            lease_ms=lease_ms,
            lease_expires_at_ms=self.lease_expires_at,
            backend_now_ms=now,
            history_ttl_ms=history_ttl_ms,
        )

    def live(self, now: int) -> bool:
        """True while running under a lease that has neither expired nor been released."""
        return (
            self.status == RunStatus.RUNNING
            and not self.released
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )


def stored_run(data: Mapping[str, Any]) -> Run:
    """The public record of an attempt stored as ``data``: :class:`RunRow`'s fields by name
    (numbers as anything ``int()`` takes, JSON's floats included; an optional field absent or
    None), as ``RunRow(...).to_run()`` gives it, without making the row (what a claim that
    lost to ``data`` answers, and each record of a history)."""
    slot = data.get("slot")
    finished = data.get("finished_at")
    trigger = data["trigger"]
    status = data["status"]
    return _new_run(
        job=data["job"],
        slot=None if slot is None else slot_to_datetime(int(slot)),
        run_id=data["run_id"],
        instance=data["instance"],
        trigger=_TRIGGERS.get(trigger) or Trigger(trigger),
        attempt=int(data["attempt"]),
        status=_STATUSES.get(status) or RunStatus(status),
        started_at=slot_to_datetime(int(data["started_at"])),
        finished_at=None if finished is None else slot_to_datetime(int(finished)),
        error=data.get("error"),
        fence=int(data.get("fence") or 0) or None,
        reason=data.get("reason"),
        skip_cause=skip_cause_of(data.get("skip_cause"), data.get("reason")),
        requested_by=data.get("requested_by"),
        slot_key=data.get("slot_key"),
    )


def skip_cause_of(stored: str | None, reason: str | None) -> SkipCause | None:
    """The :class:`~anarchon.SkipCause` of a record stored with ``stored`` (its text, or None)
    and ``reason``: the stored one; for a record stored without one, or with one this version
    does not know (written by a newer one), what its reason's words say
    (:func:`~anarchon.backend.legacy_skip_cause`, the compatibility path)."""
    cause = None if stored is None else _CAUSES.get(stored)
    if cause is None and reason:
        return legacy_skip_cause(reason)
    return cause


def ticket_of(
    claim: ClaimRequest | RunIdentity | RunRow,
    *,
    attempt: int,
    fence: int | None,
    started_at_ms: int,
    lease_ms: int = 0,
    lease_expires_at_ms: int | None = None,
    backend_now_ms: int | None = None,
    history_ttl_ms: int | None = None,
) -> Ticket:
    """The ticket of the run ``claim`` names, for its holder: the claim's identity (its trigger
    a :class:`~anarchon.Trigger` or the text stored for one) with this attempt, fence, start
    and lease. Every backend's tickets are made here."""
    return _new_ticket(
        job=claim.job,
        slot=claim.slot,
        slot_key=claim.slot_key,
        run_id=claim.run_id,
        token=claim.token,
        instance=claim.instance,
        trigger=_TRIGGERS.get(claim.trigger) or Trigger(claim.trigger),
        attempt=attempt,
        fence=fence,
        started_at_ms=started_at_ms,
        lease_ms=lease_ms,
        lease_expires_at_ms=lease_expires_at_ms,
        backend_now_ms=backend_now_ms,
        history_ttl_ms=history_ttl_ms,
    )


class RowStore(Protocol):
    """The storage a backend gives the rules, valid for one atomic step."""

    def current(self, job: str, slot_key: str) -> RunRow | None:
        """The highest attempt of ``(job, slot_key)``."""

    def live_holder(self, job: str, now: int) -> RunRow | None:
        """Any running attempt of ``job`` whose lease is live at ``now`` and not released."""

    def insert(self, row: RunRow) -> None:
        """Store a new attempt."""

    def update(self, row: RunRow) -> None:
        """Store changes to an existing attempt (same job, slot_key, attempt)."""

    def next_fence(self, job: str, now: int) -> int:
        """Store and return the job's next fence, :func:`next_fence` of the stored one."""

    def pruned_through(self, job: str) -> int | None:
        """The newest slot of ``job`` whose record pruning removed, or None."""

    def pauses(self, job: str) -> list[Pause]:
        """The stored pauses of ``job`` and of every job (:data:`anarchon.control.ALL_JOBS`)."""

    def add_request(self, request: RunRequest) -> None:
        """Store ``request`` (a failed run's retry, see :func:`finish`) in the backend's control
        store, in this same atomic step, unless a request with its id is stored. Called only
        with a retry, which the core sends only to a backend whose ``control()`` is not None."""

    def prune(self, job: str, keep_key: str, cutoff: int | None) -> None:
        """Prune ``job``'s history by the module's rules: whole slots, never ``keep_key`` nor a
        slot whose latest attempt runs; those that ended before ``cutoff`` (if given), then the
        oldest while the job holds more slots than the backend's ``history_size``; at most
        :data:`PRUNE_BATCH` slots; raise ``pruned_through`` to the newest pruned slot."""


def unstorable(req: ClaimRequest | TakeoverRequest) -> BackendError | None:
    """The error for a request whose numbers a backend cannot store, or None if it is fine."""
    # Every claim asks: the usual answer (plain integers in range) first, with no list made.
    lease = req.lease_ms
    if isinstance(req, ClaimRequest) and type(lease) is int and 0 <= lease <= MAX_MS:
        slot = req.slot
        if slot is None or (type(slot) is int and 0 <= slot <= MAX_MS):
            return None
    checks: list[tuple[str, object, int, int]] = [("lease_ms", req.lease_ms, 0, MAX_MS)]
    if isinstance(req, ClaimRequest):
        if req.slot is not None:
            checks.append(("slot", req.slot, 0, MAX_MS))
    else:
        checks.append(("max_attempts", req.max_attempts, 1, MAX_ATTEMPTS))
    for name, value, low, high in checks:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return BackendError(
                f"job {req.job!r}: {name}={value!r} is out of range: a lease backend stores "
                f"{name} as an integer from {low} to {high}; the request was not decided"
            )
    return None


def prune_ttl(history_ttl_ms: int | None) -> int | None:
    """The TTL records are pruned by age with: None for none (unset, 0 or negative); one longer
    than :data:`MAX_MS` is cut to it, which keeps everything, as an infinite one would (and is
    an exact Lua number on Redis)."""
    if not history_ttl_ms or history_ttl_ms <= 0:
        return None
    return min(history_ttl_ms, MAX_MS)


def ttl_cutoff(now: int, history_ttl_ms: int | None) -> int | None:
    """Records that ended before this may be pruned by age (None: no TTL; see :func:`prune_ttl`)."""
    ttl = prune_ttl(history_ttl_ms)
    return None if ttl is None else now - ttl


def next_fence(stored: int | None, now: int) -> int:
    """The fence after ``stored``: above it, and at least the backend's clock ``now`` in ms, so
    fences keep rising across a store that lost its counter (see the module docstring)."""
    return max((stored or 0) + 1, now)


def refused_outcome(req: ClaimRequest, now: int, error: BackendError) -> ClaimOutcome:
    """The answer to a claim this backend could not decide (``error``): nothing is stored, the
    caller does not run."""
    slot = req.slot if isinstance(req.slot, int) and 0 <= req.slot <= MAX_MS else None
    gone = first_attempt(req, now, RunStatus.SKIPPED, f"refused by the backend: {error}", slot=slot)
    return not_run(gone, now, error)


def not_run(row: RunRow, now: int, error: BackendError | None = None) -> ClaimOutcome:
    """The answer to a claim refused without storing anything: ``row``, attempt 1 of the slot
    (not stored), says why in its reason; LOST, so the caller does not run."""
    return _new_outcome(status=ClaimStatus.LOST, run=row.to_run(), backend_now_ms=now, error=error)


def first_attempt(
    req: ClaimRequest,
    now: int,
    status: RunStatus,
    reason: str | None,
    *,
    slot: int | None,
    token: str = "",
    fence: int = 0,
    lease_expires_at: int | None = None,
    slot_key: str | None = None,
    skip_cause: SkipCause | None = None,
) -> RunRow:
    """The record of attempt 1 of ``req``'s slot, started at ``now``; by default it holds no
    token, fence or lease (a refused or pruned claim). ``slot_key``: ``req.slot_key``, when the
    caller has it already; ``skip_cause``: why it is not run, if so."""
    return RunRow(
        job=req.job,
        slot_key=req.slot_key if slot_key is None else slot_key,
        slot=slot,
        attempt=1,
        run_id=req.run_id,
        token=token,
        instance=req.instance,
        trigger=req.trigger,
        status=status,
        fence=fence,
        started_at=now,
        lease_expires_at=lease_expires_at,
        reason=reason,
        requested_by=req.requested_by,
        skip_cause=skip_cause,
    )


def claim(store: RowStore, req: ClaimRequest, now: int) -> ClaimOutcome:
    """Decide one claim (see :meth:`anarchon.backend.Backend.claim`)."""
    error = unstorable(req)
    if error is not None:
        return refused_outcome(req, now, error)
    key = req.slot_key  # made from the slot each time it is read: read once
    existing = store.current(req.job, key)
    if existing is not None:
        return answer_existing(existing, req, now)
    pruned = store.pruned_through(req.job)
    if req.slot is not None and pruned is not None and req.slot <= pruned:
        return pruned_outcome(req, now)
    reason = req.skip_reason
    status = req.skip_status if reason is not None else _SKIPPED
    cause = req.skip_cause
    if reason is None:
        pauses = store.pauses(req.job)  # the usual answer: none
        pause = active_pause(pauses, req.job, req.trigger, now) if pauses else None
        if pause is not None:
            reason, cause = paused_reason(pause), _CAUSE_PAUSED
    if reason is None and req.overlap is _OVERLAP_SKIP:
        holder = store.live_holder(req.job, now)
        if holder is not None:
            reason = f"{OVERLAP}run {holder.run_id} ({_describe(holder)}) still holds its lease"
            cause = _CAUSE_OVERLAP
    if reason is not None:
        row = first_attempt(
            req, now, status, reason, slot=req.slot, token=req.token, slot_key=key, skip_cause=cause
        )
        row.finished_at = now
        store.insert(row)
        return _new_outcome(status=ClaimStatus.SKIPPED, run=row.to_run(), backend_now_ms=now)
    row = first_attempt(
        req,
        now,
        _RUNNING,
        None,
        slot=req.slot,
        token=req.token,
        fence=store.next_fence(req.job, now),
        lease_expires_at=now + req.lease_ms,
        slot_key=key,
    )
    store.insert(row)
    return won_outcome(req, now, row.fence, slot_key=key)


def won_outcome(
    req: ClaimRequest, now: int, fence: int, *, slot_key: str | None = None
) -> ClaimOutcome:
    """The answer to a claim that recorded attempt 1 of ``req``'s slot, running from ``now``
    (the backend's clock) under a lease of ``req.lease_ms`` with ``fence``: the run and the
    ticket made from the request itself, equal to what the record stored gives
    (:meth:`RunRow.to_run`, :meth:`RunRow.ticket`). So a backend that decides in its own
    language (Lua) needs to answer a won claim with ``now`` and ``fence`` alone.
    ``slot_key``: ``req.slot_key``, when the caller has it already."""
    slot = req.slot
    key = req.slot_key if slot_key is None else slot_key  # made from the slot: made once
    trigger = _TRIGGERS.get(req.trigger) or Trigger(req.trigger)
    run = _new_run(
        job=req.job,
        slot=None if slot is None else slot_to_datetime(slot),
        run_id=req.run_id,
        instance=req.instance,
        trigger=trigger,
        attempt=1,
        status=_RUNNING,
        started_at=slot_to_datetime(now),
        finished_at=None,
        error=None,
        fence=fence or None,
        reason=None,
        requested_by=req.requested_by,
        slot_key=key,
    )
    ticket = _new_ticket(
        job=req.job,
        slot=slot,
        slot_key=key,
        run_id=req.run_id,
        token=req.token,
        instance=req.instance,
        trigger=trigger,
        attempt=1,
        fence=fence,
        started_at_ms=now,
        lease_ms=req.lease_ms,
        lease_expires_at_ms=now + req.lease_ms,
        backend_now_ms=now,
        history_ttl_ms=req.history_ttl_ms,
    )
    return _new_outcome(status=_WON, run=run, ticket=ticket, backend_now_ms=now)


def pruned_outcome(req: ClaimRequest, now: int) -> ClaimOutcome:
    """The answer to a claim of a slot older than what the job's history was pruned to."""
    row = first_attempt(
        req, now, RunStatus.SKIPPED, PRUNED_REASON, slot=req.slot, skip_cause=SkipCause.PRUNED
    )
    return not_run(row, now)


def answer_existing(row: RunRow, req: ClaimRequest, now: int) -> ClaimOutcome:
    """The answer to a claim of a slot that already has a record ``row``; also the answer of
    a backend that decides in its own language (Lua, SQL) from the attempt it found or just
    recorded."""
    verdict = existing_verdict(req, row.status, row.attempt, row.token, row.released)
    if verdict is _LOST:
        return lost_outcome(row.to_run(), row.status, row.lease_expires_at, now)
    if verdict is _CLAIM_SKIPPED:
        return _new_outcome(status=_CLAIM_SKIPPED, run=row.to_run(), backend_now_ms=now)
    # A retried claim: the caller is still the runner.
    ticket = row.ticket(req.lease_ms, now, req.history_ttl_ms)
    return _new_outcome(status=_WON, run=row.to_run(), ticket=ticket, backend_now_ms=now)


def existing_verdict(
    req: ClaimRequest, status: str, attempt: int, token: str, released: bool
) -> ClaimStatus:
    """How a claim of a slot that already has a record is answered, from that record's
    ``status``, ``attempt``, ``token`` and ``released`` (:func:`answer_existing` makes the
    whole answer): SKIPPED if attempt 1 was recorded instead of a run, WON if attempt 1 is
    ``req``'s own, still running and not handed over (a retried claim), else LOST."""
    if status in SKIP_STATUSES and attempt == 1:
        return _CLAIM_SKIPPED
    if token == req.token and attempt == 1 and status == _RUNNING and not released:
        return _WON
    # Once attempt 1 has ended (recorded failed when its lease ran out on the last attempt),
    # a retry of its claim is told LOST, so no handler starts on a run that history already
    # shows as over.
    return _LOST


def lost_outcome(run: Run, status: str, lease_expires_at: int | None, now: int) -> ClaimOutcome:
    """The answer LOST (:func:`existing_verdict`) to a claim that met the record ``run``,
    stored with ``status`` and ``lease_expires_at``: the caller does not run, and watches the
    run's lease while it runs."""
    return _new_outcome(
        status=_LOST,
        run=run,
        lease_expires_at_ms=lease_expires_at if status == _RUNNING else None,
        backend_now_ms=now,
    )


def peek_takeover(store: RowStore, req: TakeoverRequest, now: int) -> TakeoverOutcome | None:
    """Answer a takeover that needs no write (ENDED, HELD), or None when it does.

    Lets a backend answer the common case, a backup checking a live lease, without a write lock.
    """
    return peek_answer(store.current(req.job, req.slot_key), req, now)


def peek_answer(row: RunRow | None, req: TakeoverRequest, now: int) -> TakeoverOutcome | None:
    """:func:`peek_takeover` from the slot's current attempt ``row`` (None: no record)."""
    if row is None or row.status != RunStatus.RUNNING:
        return TakeoverOutcome(
            status=TakeoverStatus.ENDED, run=row.to_run() if row else None, backend_now_ms=now
        )
    if row.token == req.token and not row.released:
        # A retried takeover whose first answer was lost: the caller already holds the run.
        return _taken(row, req, now)
    if row.live(now):
        return TakeoverOutcome(
            status=TakeoverStatus.HELD,
            run=row.to_run(),
            lease_expires_at_ms=row.lease_expires_at,
            backend_now_ms=now,
        )
    return None


def take_over(store: RowStore, req: TakeoverRequest, now: int) -> TakeoverOutcome:
    """Decide one takeover (see :meth:`anarchon.backend.LeaseBackend.take_over`).

    Raises :class:`~anarchon.errors.BackendError` for numbers out of range (:func:`unstorable`).
    """
    error = unstorable(req)
    if error is not None:
        raise error
    answer = peek_takeover(store, req, now)
    if answer is not None:
        return answer
    row = store.current(req.job, req.slot_key)
    assert row is not None
    why = HANDED_OVER if row.released else LEASE_LOST
    row.status = RunStatus.FAILED
    row.finished_at = now
    row.reason = why
    if row.attempt >= req.max_attempts:
        row.error = (
            f"{why} on attempt {row.attempt} of max_attempts={req.max_attempts}; not retried"
        )
        store.update(row)
        return takeover_answer(req, row, now, exhausted=True)
    row.error = f"{why}: attempt {row.attempt + 1} taken over by {req.instance}"
    store.update(row)
    new = replace(  # the same slot, trigger and requester; a new attempt, holder and lease
        row,
        attempt=row.attempt + 1,
        run_id=req.run_id,
        token=req.token,
        instance=req.instance,
        status=RunStatus.RUNNING,
        fence=store.next_fence(row.job, now),
        started_at=now,
        finished_at=None,
        lease_expires_at=now + req.lease_ms,
        released=False,
        error=None,
        reason=None,
        skip_cause=None,
    )
    store.insert(new)
    return _taken(new, req, now)


def takeover_answer(
    req: TakeoverRequest, row: RunRow | None, now: int, *, exhausted: bool = False
) -> TakeoverOutcome:
    """The answer to ``req`` from the attempt a takeover left current: with ``exhausted``,
    ``row`` recorded failed on its last attempt (EXHAUSTED); else what :func:`peek_answer`
    says of it (the new attempt when taken, the winner's when another backup was first). For
    backends that decide in their own language (Lua, SQL)."""
    if exhausted:
        assert row is not None
        return TakeoverOutcome(
            status=TakeoverStatus.EXHAUSTED, run=row.to_run(), backend_now_ms=now
        )
    answer = peek_answer(row, req, now)
    assert answer is not None, "a takeover left an expired lease current"
    return answer


def _taken(row: RunRow, req: TakeoverRequest, now: int) -> TakeoverOutcome:
    """The answer to a takeover whose caller now holds attempt ``row``."""
    return TakeoverOutcome(
        status=TakeoverStatus.TAKEN,
        run=row.to_run(),
        ticket=row.ticket(req.lease_ms, now, req.history_ttl_ms),
        lease_expires_at_ms=row.lease_expires_at,
        backend_now_ms=now,
    )


def lease_lost(ticket: Ticket, attempt: int | None, status: str | None) -> LeaseLost:
    """The error for a ``ticket`` whose slot is now at ``attempt`` (None: no record)."""
    holder = "nobody" if attempt is None else f"attempt {attempt} ({status})"
    return LeaseLost(
        f"run {ticket.run_id} of job {ticket.job!r} (attempt {ticket.attempt}) no longer "
        f"holds its lease: the slot is now at {holder}"
    )


def handed_over(ticket: Ticket) -> LeaseLost:
    """The error for a ``ticket`` whose attempt was released (:data:`HANDED_OVER`): it renews
    no more, and a backup may take the slot over."""
    return LeaseLost(f"run {ticket.run_id} of job {ticket.job!r} was {HANDED_OVER}")


def _held_by(store: RowStore, ticket: Ticket) -> RunRow:
    return _holding(store.current(ticket.job, ticket.slot_key), ticket)


def _holding(row: RunRow | None, ticket: Ticket) -> RunRow:
    """``row``, the slot's current attempt, if ``ticket`` still holds it; else raise LeaseLost."""
    # Token and fence: a record made again with the same token (a manual run claimed again
    # after its record was pruned) is not the attempt an old ticket holds.
    if (
        row is None
        or row.token != ticket.token
        or row.fence != ticket.fence
        or row.status != RunStatus.RUNNING
    ):
        raise lease_lost(ticket, row.attempt if row else None, row.status if row else None)
    return row


def check_ticket(ticket: Ticket) -> BackendError | None:
    """The error for a ticket whose lease length a backend cannot store, or None."""
    value = ticket.lease_ms
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MS:
        return BackendError(
            f"job {ticket.job!r}: lease_ms={value!r} is out of range: a lease backend stores "
            f"lease_ms as an integer from 0 to {MAX_MS}"
        )
    return None


def renew(store: RowStore, ticket: Ticket, now: int) -> Ticket:
    """Extend a lease (see :meth:`anarchon.backend.LeaseBackend.renew`)."""
    error = check_ticket(ticket)
    if error is not None:
        raise error
    row = _held_by(store, ticket)
    if row.released:
        raise handed_over(ticket)
    row.lease_expires_at = now + ticket.lease_ms
    store.update(row)
    return ticket.renewed(row.lease_expires_at, now)


def release(store: RowStore, ticket: Ticket, now: int) -> None:
    """Hand a run over (see :meth:`anarchon.backend.LeaseBackend.release`)."""
    row = _held_by(store, ticket)
    row.released = True
    row.lease_expires_at = now
    store.update(row)


def already_recorded(row: RunRow | None, ticket: Ticket, status: str, error: str | None) -> bool:
    """True if ``row`` is this very result, recorded by an earlier :func:`finish` (a retry whose
    answer was lost): same attempt and token, same status and error, and not a failure a backup
    recorded (those carry a reason, such as ``lease lost`` after ``exhausted``)."""
    return (
        row is not None
        and row.attempt == ticket.attempt
        and row.token == ticket.token
        and row.fence == ticket.fence
        and row.status == status
        and row.error == error
        and row.reason is None
    )


def finish(
    store: RowStore,
    ticket: Ticket,
    status: str,
    error: str | None,
    now: int,
    retry: RunRequest | None = None,
) -> Run:
    """Record a result (see :meth:`anarchon.backend.Backend.finish`) and its ``retry``
    (:meth:`RowStore.add_request`, in the same step), then prune the job's history
    (:meth:`RowStore.prune`). A refused result raises :class:`~anarchon.errors.LeaseLost`,
    stores no retry and prunes nothing; the same result again stores nothing more."""
    done = store.current(ticket.job, ticket.slot_key)
    if already_recorded(done, ticket, status, error):
        assert done is not None
        run = done.to_run()
    else:
        row = _holding(done, ticket)  # the attempt just read: one lookup, not two
        row.status = _STATUSES.get(status) or RunStatus(status)
        row.error = error
        row.finished_at = now
        row.lease_expires_at = None
        store.update(row)
        if retry is not None:
            store.add_request(retry)
        run = row.to_run()
    store.prune(ticket.job, ticket.slot_key, ttl_cutoff(now, ticket.history_ttl_ms))
    return run


async def retries_first(
    control: ControlStore, items: Sequence[FinishRequest]
) -> dict[int, BackendError]:
    """Store the retries of ``items`` before their results, for a backend that cannot store a
    result and its retry in one step (a broker; Redis on a cluster): each retry by
    :meth:`~anarchon.control.ControlStore.request` (once per id), in order. Return the error of
    each item whose retry the store refused, by index: its result is then not sent. An
    unavailable store raises, failing the whole call (the core sends it all again)."""
    refused: dict[int, BackendError] = {}
    for n, item in enumerate(items):
        if item.retry is None:
            continue
        try:
            await control.request(item.retry)
        except BackendUnavailable:
            raise
        except BackendError as exc:
            refused[n] = exc
    return refused


def _describe(row: RunRow) -> str:
    if row.slot is None:
        return "manual"
    moment = ms_to_datetime(row.slot)
    assert moment is not None
    return f"slot {moment.isoformat()}"
