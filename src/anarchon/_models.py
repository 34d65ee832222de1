"""The records anarchon keeps and passes around: runs, triggers, statuses and policies."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from ._schedule import slot_to_datetime

__all__ = [
    "CatchUp",
    "Kind",
    "Overlap",
    "Run",
    "RunStatus",
    "SkipCause",
    "Trigger",
    "ms_to_datetime",
]


class Trigger(StrEnum):
    """Why a run started."""

    SCHEDULE = "schedule"
    """A scheduled slot, claimed at its time."""
    MANUAL = "manual"
    """``Scheduler.run_now()``."""
    CATCH_UP = "catch-up"
    """A slot missed while no instance ran, claimed when an instance started; or, with
    ``catch_up="all"``, a slot of a backlog an instance fell behind on (a frozen process, a
    clock step), claimed when it came back."""
    RETRY = "retry"
    """A slot run again after its handler raised (the job's ``retries``)."""


class RunStatus(StrEnum):
    """Where a run stands."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Recorded without running: overlap, too late, behind or paused (see the run's
    ``reason``)."""
    MISSED = "missed"
    """Recorded after the fact: no instance carried the job at its time and catch-up did not
    run it (see the run's ``reason`` for the gap)."""

    @property
    def finished(self) -> bool:
        """True for every status but ``running``."""
        return self is not RunStatus.RUNNING


class SkipCause(StrEnum):
    """Why a run is ``skipped``: a slot recorded, or only answered, without running. The kind
    of the run's :attr:`~Run.reason` that the core, the metrics and the dashboard read instead
    of its words (those are for people and may change). The backend sets it
    (:attr:`Run.skip_cause`) on every record and claim answer that has one."""

    OVERLAP = "overlap"
    """Skipped: another run of the job still held a live lease (``overlap="skip"``)."""
    TOO_LATE = "too_late"
    """Skipped: the instance reached the slot more than ``max_late_ms`` after it."""
    BEHIND = "behind"
    """Skipped: the instance fell behind the job (a frozen process, a stepped clock) and passed
    the slot over for newer ones, as the job's ``catch_up`` says."""
    PAUSED = "paused"
    """Skipped: the job or the whole cluster was paused."""
    PRUNED = "pruned"
    """Refused, nothing stored (a LOST answer): the job's history is pruned past the slot, so
    the backend cannot tell whether it ran. Nobody runs it."""
    UNKNOWN = "unknown"
    """Refused, nothing stored (a LOST answer): the store cannot vouch for the slot (Redis that
    restarted without its data); it may have run already. Nobody runs it."""
    NOT_RECORDED = "not_recorded"
    """Answered skipped, but nothing stored (NATS: a claim whose turn to be sent came after
    ``max_late_ms``, a skip too close to the end of the duplicate window). Nobody runs it and
    history holds nothing of it; the reason says what the skip would have been."""
    CANCELLED = "cancelled"
    """Skipped: an operator cancelled the run request (a trigger or a retry) before any
    instance claimed it (``anarchon cancel``, :func:`anarchon.steering.cancel_requests`); the
    record takes the request's key, so no claim of it runs."""


class Overlap(StrEnum):
    """What a slot does while the job's previous run still holds its lease."""

    SKIP = "skip"
    """Record the slot once as ``skipped`` (lease backends only; their default)."""
    ALLOW = "allow"
    """Run it concurrently."""


class CatchUp(StrEnum):
    """Which slots, missed while no instance ran, an instance runs when it starts; and which
    slots of a backlog it runs when it fell behind while running (its process frozen, its clock
    stepped forward: several slots of the job due at once).

    Missed means after the job's last recorded slot and not after the instance's start on the
    backend's clock (the timer fires the later ones). Catch-up runs count for ``overlap="skip"``:
    a live slot that comes while one still holds its lease is recorded skipped (overlap), so
    ``ALL`` with a long backlog pushes out the live slots meanwhile; ``LATEST`` runs one. And
    the other way round: a catch-up slot claimed while a live run holds its lease is recorded
    skipped (overlap) too.

    A backlog: ``NONE`` and ``LATEST`` claim only the newest due slot (as any slot: it runs
    within ``max_late_ms``) and record the older ones skipped, ``behind: ...``; ``ALL`` runs
    those inside ``catch_up_window_ms`` one at a time, oldest first (trigger ``catch-up``).
    """

    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class Kind(StrEnum):
    """Why an instance claims a slot when it does (see :mod:`anarchon._rendezvous`)."""

    PREFERRED = "preferred"
    """Ranked first: claims at the slot."""
    BACKUP = "backup"
    """Ranked after the first: claims after its rank delay unless it hears of a winner."""
    UNRANKED = "unranked"
    """No ranking (alone, no view, no jitter, no notices): the random jitter."""


def ms_to_datetime(value: int | None) -> datetime | None:
    """Return the aware UTC datetime of epoch milliseconds, or None."""
    return None if value is None else slot_to_datetime(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One attempt at running a job, as the backend records it. Immutable.

    A slot taken over by a backup has one ``Run`` per attempt: the superseded attempt ends
    ``failed`` with its ``reason`` (for example ``lease lost``), the new one has ``attempt + 1``
    and a higher ``fence``.
    """

    job: str
    """The job's name."""
    slot: datetime | None
    """The scheduled time (aware, UTC); None for a manual run."""
    run_id: str
    """This attempt's run id, made by whoever claimed it (a backup's takeover makes its own);
    a manual run's or a retry's is its run request's id."""
    instance: str
    """The id of the instance that made this attempt (or recorded the skip)."""
    trigger: Trigger
    """Why the run started: its slot came (``schedule``), a catch-up, a manual run or a
    retry."""
    attempt: int
    """1 for the first attempt; each takeover by a backup adds one."""
    status: RunStatus
    """Where the attempt stands: running, ended (``succeeded``, ``failed``), or recorded
    without running (``skipped``, ``missed``)."""
    started_at: datetime
    """When the attempt started (aware, UTC)."""
    finished_at: datetime | None = None
    """When it ended (aware, UTC); None while running."""
    error: str | None = None
    """Why a ``failed`` attempt failed: its exception's type and message
    (``ValueError: ...``) or what ended it (``timed out after timeout_ms=...``), secrets
    masked; None otherwise."""
    fence: int | None = None
    """The fencing token this attempt ran under; it only rises per job."""
    reason: str | None = None
    """Why a run was skipped or superseded (``overlap``, ``too late``, ``lease lost`` ...), in
    words for people; code reads :attr:`skip_cause`."""
    skip_cause: SkipCause | None = None
    """Why a ``skipped`` run was not run, as the core reads it (overlap, too late, refused as
    pruned ...); None for any other run, and for a skip whose cause none of these is. Backends
    set it; a record stored without one is read through
    :func:`anarchon.backend.legacy_skip_cause`."""
    requested_by: str | None = None
    """Who asked for a manual run (``anarchon trigger``, ``Scheduler.trigger``), if recorded."""
    slot_key: str | None = field(default=None, compare=False)
    """The key the backend keeps the run's attempts under, when it says (lease backends built
    on :mod:`anarchon.kit` do): the slot in epoch ms as text, ``manual-<id>`` for a manual run,
    ``<key>-retry-<n>`` for a retry. What a backup names to take the run over. Not compared."""

    @property
    def slot_ms(self) -> int | None:
        """The slot as epoch milliseconds, or None for a manual run."""
        return None if self.slot is None else round(self.slot.timestamp() * 1000)

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish, or None while running."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()
