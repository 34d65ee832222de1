"""The lease state machine, written once for backends that run it in Python.

:class:`~anarchon.backends.memory.MemoryBackend` and
:class:`~anarchon.backends.sqlite.SQLiteBackend` keep their rows differently but decide the same
way: each calls these functions inside one atomic step (the event loop for memory, a
``BEGIN IMMEDIATE`` transaction for SQLite) over a :class:`RowStore`. Redis and PostgreSQL express
the same rules in Lua and SQL; the conformance suite holds all of them to the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._models import Overlap, Run, RunStatus, Trigger, ms_to_datetime
from ..backend import (
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from ..errors import LeaseLost

LEASE_LOST = "lease lost"
HANDED_OVER = "handed over"
PRUNED_REASON = "too old: the job's history is pruned past this slot"


@dataclass(slots=True, kw_only=True)
class RunRow:
    """One attempt as a lease backend stores it."""

    job: str
    slot_key: str
    slot: int | None
    attempt: int
    run_id: str
    token: str
    instance: str
    trigger: str
    status: str
    fence: int
    started_at: int
    finished_at: int | None = None
    lease_expires_at: int | None = None
    released: bool = False
    error: str | None = None
    reason: str | None = None

    def to_run(self) -> Run:
        """Return the public, immutable record."""
        started = ms_to_datetime(self.started_at)
        assert started is not None
        return Run(
            job=self.job,
            slot=ms_to_datetime(self.slot),
            run_id=self.run_id,
            instance=self.instance,
            trigger=Trigger(self.trigger),
            attempt=self.attempt,
            status=RunStatus(self.status),
            started_at=started,
            finished_at=ms_to_datetime(self.finished_at),
            error=self.error,
            fence=self.fence or None,
            reason=self.reason,
        )

    def ticket(self, lease_ms: int, now: int, history_ttl_ms: int | None) -> Ticket:
        """Return the holder's ticket for this attempt."""
        return Ticket(
            job=self.job,
            slot=self.slot,
            slot_key=self.slot_key,
            run_id=self.run_id,
            token=self.token,
            instance=self.instance,
            trigger=Trigger(self.trigger),
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

    def next_fence(self, job: str) -> int:
        """Increment the job's fence counter and return the new value."""

    def pruned_through(self, job: str) -> int | None:
        """The newest slot of ``job`` whose record pruning removed, or None."""


def claim(store: RowStore, req: ClaimRequest, now: int) -> ClaimOutcome:
    """Decide one claim (see :meth:`anarchon.backend.Backend.claim`)."""
    existing = store.current(req.job, req.slot_key)
    if existing is not None:
        return answer_existing(existing, req, now)
    pruned = store.pruned_through(req.job)
    if req.slot is not None and pruned is not None and req.slot <= pruned:
        return pruned_outcome(req, now)
    reason = req.skip_reason
    if reason is None and req.overlap is Overlap.SKIP:
        holder = store.live_holder(req.job, now)
        if holder is not None:
            reason = f"overlap: run {holder.run_id} ({_describe(holder)}) still holds its lease"
    row = RunRow(
        job=req.job,
        slot_key=req.slot_key,
        slot=req.slot,
        attempt=1,
        run_id=req.run_id,
        token=req.token,
        instance=req.instance,
        trigger=req.trigger,
        status=RunStatus.RUNNING if reason is None else RunStatus.SKIPPED,
        fence=store.next_fence(req.job) if reason is None else 0,
        started_at=now,
        lease_expires_at=now + req.lease_ms if reason is None else None,
        reason=reason,
    )
    if reason is not None:
        row.finished_at = now
        store.insert(row)
        return ClaimOutcome(status=ClaimStatus.SKIPPED, run=row.to_run(), backend_now_ms=now)
    store.insert(row)
    ticket = row.ticket(req.lease_ms, now, req.history_ttl_ms)
    return ClaimOutcome(status=ClaimStatus.WON, run=row.to_run(), ticket=ticket, backend_now_ms=now)


def pruned_outcome(req: ClaimRequest, now: int) -> ClaimOutcome:
    """The answer to a claim of a slot older than what the job's history was pruned to."""
    gone = RunRow(
        job=req.job,
        slot_key=req.slot_key,
        slot=req.slot,
        attempt=1,
        run_id=req.run_id,
        token="",
        instance=req.instance,
        trigger=req.trigger,
        status=RunStatus.SKIPPED,
        fence=0,
        started_at=now,
        reason=PRUNED_REASON,
    )
    return ClaimOutcome(status=ClaimStatus.LOST, run=gone.to_run(), backend_now_ms=now)


def answer_existing(row: RunRow, req: ClaimRequest, now: int) -> ClaimOutcome:
    """The answer to a claim of a slot that already has a record ``row``."""
    if row.status == RunStatus.SKIPPED and row.attempt == 1:
        return ClaimOutcome(status=ClaimStatus.SKIPPED, run=row.to_run(), backend_now_ms=now)
    if row.token == req.token and row.attempt == 1:
        ticket = row.ticket(req.lease_ms, now, req.history_ttl_ms)
        return ClaimOutcome(
            status=ClaimStatus.WON, run=row.to_run(), ticket=ticket, backend_now_ms=now
        )
    return ClaimOutcome(
        status=ClaimStatus.LOST,
        run=row.to_run(),
        lease_expires_at_ms=row.lease_expires_at if row.status == RunStatus.RUNNING else None,
        backend_now_ms=now,
    )


def peek_takeover(store: RowStore, req: TakeoverRequest, now: int) -> TakeoverOutcome | None:
    """Answer a takeover that needs no write (ENDED, HELD), or None when it does.

    Lets a backend answer the common case, a backup checking a live lease, without a write lock.
    """
    row = store.current(req.job, req.slot_key)
    if row is None or row.status != RunStatus.RUNNING:
        return TakeoverOutcome(
            status=TakeoverStatus.ENDED, run=row.to_run() if row else None, backend_now_ms=now
        )
    if row.live(now):
        return TakeoverOutcome(
            status=TakeoverStatus.HELD,
            run=row.to_run(),
            lease_expires_at_ms=row.lease_expires_at,
            backend_now_ms=now,
        )
    return None


def take_over(store: RowStore, req: TakeoverRequest, now: int) -> TakeoverOutcome:
    """Decide one takeover (see :meth:`anarchon.backend.LeaseBackend.take_over`)."""
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
        return TakeoverOutcome(
            status=TakeoverStatus.EXHAUSTED, run=row.to_run(), backend_now_ms=now
        )
    row.error = f"{why}: attempt {row.attempt + 1} taken over by {req.instance}"
    store.update(row)
    new = RunRow(
        job=row.job,
        slot_key=row.slot_key,
        slot=row.slot,
        attempt=row.attempt + 1,
        run_id=req.run_id,
        token=req.token,
        instance=req.instance,
        trigger=row.trigger,
        status=RunStatus.RUNNING,
        fence=store.next_fence(row.job),
        started_at=now,
        lease_expires_at=now + req.lease_ms,
    )
    store.insert(new)
    return TakeoverOutcome(
        status=TakeoverStatus.TAKEN,
        run=new.to_run(),
        ticket=new.ticket(req.lease_ms, now, req.history_ttl_ms),
        lease_expires_at_ms=new.lease_expires_at,
        backend_now_ms=now,
    )


def lease_lost(ticket: Ticket, attempt: int | None, status: str | None) -> LeaseLost:
    """The error for a ``ticket`` whose slot is now at ``attempt`` (None: no record)."""
    holder = "nobody" if attempt is None else f"attempt {attempt} ({status})"
    return LeaseLost(
        f"run {ticket.run_id} of job {ticket.job!r} (attempt {ticket.attempt}) no longer "
        f"holds its lease: the slot is now at {holder}"
    )


def _held_by(store: RowStore, ticket: Ticket) -> RunRow:
    row = store.current(ticket.job, ticket.slot_key)
    if row is None or row.token != ticket.token or row.status != RunStatus.RUNNING:
        raise lease_lost(ticket, row.attempt if row else None, row.status if row else None)
    return row


def renew(store: RowStore, ticket: Ticket, now: int) -> Ticket:
    """Extend a lease (see :meth:`anarchon.backend.LeaseBackend.renew`)."""
    row = _held_by(store, ticket)
    if row.released:
        raise LeaseLost(f"run {ticket.run_id} of job {ticket.job!r} was handed over")
    row.lease_expires_at = now + ticket.lease_ms
    store.update(row)
    return ticket.renewed(row.lease_expires_at, now)


def release(store: RowStore, ticket: Ticket, now: int) -> None:
    """Hand a run over (see :meth:`anarchon.backend.LeaseBackend.release`)."""
    row = _held_by(store, ticket)
    row.released = True
    row.lease_expires_at = now
    store.update(row)


def finish(store: RowStore, ticket: Ticket, status: str, error: str | None, now: int) -> Run:
    """Record a result (see :meth:`anarchon.backend.Backend.finish`)."""
    done = store.current(ticket.job, ticket.slot_key)
    if done is not None and done.token == ticket.token and done.status == status:
        return done.to_run()  # a retry whose first answer was lost: already recorded
    row = _held_by(store, ticket)
    row.status = RunStatus(status)
    row.error = error
    row.finished_at = now
    row.lease_expires_at = None
    store.update(row)
    return row.to_run()


def _describe(row: RunRow) -> str:
    if row.slot is None:
        return "manual"
    moment = ms_to_datetime(row.slot)
    assert moment is not None
    return f"slot {moment.isoformat()}"
