"""The contract between the scheduler core and a backend.

The core computes slots, keeps one timer, fires, runs handlers and records; every decision about
who runs a slot is the backend's. A backend implements :class:`Backend` (brokers such as NATS stop
there) and, when it can keep a renewable lease, :class:`LeaseBackend` as well. Each abstract
method's docstring is the specification an implementer follows: what must be atomic, what to
return, what to raise. ``tests/conformance`` checks every backend against it.

Vocabulary:

* **slot key**: ``str(slot)`` for a scheduled or catch-up slot (epoch ms), ``manual-<run_id>`` for
  a manual run, ``<slot key>-retry-<n>`` for a retry (:func:`anarchon.control.retry_key`).
  ``(job, slot_key)`` names one run everywhere; its attempts are numbered from 1.
* **token**: a random string an instance generates per claim or takeover. Only the holder of the
  current attempt's token may renew, release or finish it.
* **fence**: an integer that rises with every claim and takeover of a job (per job, never reused),
  handed to the handler as ``ctx.fence`` so it can guard its own writes. Lease backends give
  ``max(the job's last fence + 1, the backend's clock in ms)``, so fences keep rising even when
  the store lost its counter (a recreated file, a failover that lost writes), as long as the
  backend's clock does not go back; docs/guarantees.md says where that stops.
* **backend clock**: lease expiry is measured on the backend's clock, never an instance's.

Rules every lease backend shares (``anarchon.kit.lease`` is the reference; the
differential test holds SQLite, PostgreSQL and Redis to its answers):

* **pruning** runs when a result is accepted, on whole slots (every attempt of a slot key
  together), never on a slot whose latest attempt is ``running`` and never on the slot being
  finished: by age, slots whose latest attempt ended more than the ticket's ``history_ttl_ms``
  ago; by count, while the job holds more than the backend's ``history_size`` slots, the oldest
  ended ones (by the start of their first attempt); at most 100 slots per result. The newest
  pruned slot raises the job's *pruned-through* mark; a claim of a slot at or below it that has
  no record is refused (LOST, skip cause :attr:`~anarchon.SkipCause.PRUNED`, reason
  :data:`PRUNED_REASON`); a slot that has a record is always answered by its record.
* **skip causes**: every record and answer made instead of a run carries its kind in
  :attr:`Run.skip_cause <anarchon.Run.skip_cause>` (a :class:`~anarchon.SkipCause`), and its
  words for people in ``reason``. The core reads only the cause, so a backend words its
  reasons as it likes; a backend stores the cause with the record, and reads a record
  stored without one (by an older anarchon, or a store with no place for it) through
  :func:`legacy_skip_cause`, the one place where a reason's words still count.
* **numbers**: times and durations are epoch milliseconds up to 2**52; a request outside that is
  refused on its own, never failing the other requests of its batch.

Errors: a backend raises :class:`~anarchon.errors.BackendUnavailable` for anything transient
(connection refused or lost, timeouts, failover in progress) after translating its driver's
exceptions in one place, and :class:`~anarchon.errors.LeaseLost` when a token is no longer the
current one. Any other :class:`~anarchon.errors.BackendError` is treated as permanent.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final, NamedTuple, TypeVar

from ._models import CatchUp, Overlap, Run, RunStatus, SkipCause, Trigger
from .control import CANCELLED_BY, PAUSED, ControlStore, RunRequest
from .errors import BackendError, BackendUnavailable
from .registry import RegistryStore

__all__ = [
    "BEHIND",
    "HANDED_OVER",
    "LEASE_LOST",
    "OPEN_RUNS_LOOKBACK",
    "OVERLAP",
    "PRUNED_REASON",
    "TOO_LATE",
    "Backend",
    "Capability",
    "ChangeEvent",
    "ChangeListener",
    "ClaimListener",
    "ClaimNotice",
    "ClaimOutcome",
    "ClaimRequest",
    "ClaimStatus",
    "FinishRequest",
    "JobPolicy",
    "LeaseBackend",
    "RunIdentity",
    "SkipCause",
    "SlotRecords",
    "TakeoverOutcome",
    "TakeoverRequest",
    "TakeoverStatus",
    "Ticket",
    "legacy_skip_cause",
    "slot_key_of",
    "still_open",
]

LEASE_BACKENDS: Final = "Redis, PostgreSQL or SQLite"
Item = TypeVar("Item")
Answer = TypeVar("Answer")

# -- the reasons a record carries, the same on every backend ----------------------------------
# (Lua and SQL backends spell them in their own files; tests/conformance holds them to these.)
# They are words for people: the kind the core reads is the record's SkipCause (legacy_skip_cause
# reads the words of a record stored without one).

LEASE_LOST: Final = "lease lost"
"""Reason of an attempt whose lease expired and that a backup took over (or that ran out of
attempts); the keeper's message to a runner whose renewal failed starts with it too."""
HANDED_OVER: Final = "handed over"
"""Reason of an attempt released on a graceful stop (:meth:`LeaseBackend.release`) and then
taken over; also the ``reason`` the core passes to :meth:`LeaseBackend.release`."""
OVERLAP: Final = "overlap: "
"""Prefix of the reason of a slot skipped because another run of the job holds a live lease:
``overlap: run <run_id> (slot <iso> | manual) still holds its lease``."""
TOO_LATE: Final = "too late: "
"""Prefix of the reason of a slot skipped because the instance reached it after ``max_late_ms``
(the core's ``skip_reason``)."""
BEHIND: Final = "behind: "
"""Prefix of the reason of a slot passed over because the instance fell behind the job (its
process frozen, its clock stepped) and found newer slots due too, decided by the job's
``catch_up`` (the core's ``skip_reason``): ``behind: <instance> reached the slot <ms> ms after
it, with <n> slots of the job due at once (<first> to <newest>); catch_up='latest' runs only
the newest``."""
PRUNED_REASON: Final = "too old: the job's history is pruned past this slot"
"""Reason of the LOST answer to a claim of a slot the job's history was pruned past (cause
:attr:`~anarchon.SkipCause.PRUNED`)."""
# What the words of a record stored without a cause meant (legacy_skip_cause): prefixes, first
# match wins; and the mark of a broker's skip it did not store (NATS), at the end of its reason
# or before the explanation that follows it.
_LEGACY_PREFIXES: Final = (
    ("too old", SkipCause.PRUNED),
    ("unknown", SkipCause.UNKNOWN),
    (OVERLAP, SkipCause.OVERLAP),
    (TOO_LATE, SkipCause.TOO_LATE),
    (BEHIND, SkipCause.BEHIND),
    (PAUSED, SkipCause.PAUSED),
    (CANCELLED_BY, SkipCause.CANCELLED),
)
_LEGACY_NOT_RECORDED: Final = "; not recorded"
OPEN_RUNS_LOOKBACK: Final = 20
"""How many of a job's newest attempts :meth:`LeaseBackend.open_runs`'s default reads: open
attempts are the newest, but for a job with ``overlap="allow"`` and more running at once."""


class Capability(StrEnum):
    """A lease feature a backend may have (its :attr:`Backend.capabilities`); the value is how
    a refusal names it. Brokers have none of them; :class:`LeaseBackend` has all."""

    BACKUP = "leases and backup runners (lease_ms, max_attempts > 1)"
    """Renewable leases (:meth:`LeaseBackend.renew`) and takeover
    (:meth:`LeaseBackend.take_over`): a backup runs the slot when its runner's lease expires."""
    OVERLAP = "overlap protection (overlap='skip')"
    """:meth:`Backend.claim` records a slot ``skipped`` while another run of the job holds a
    live lease."""
    CATCH_UP = "catch-up (catch_up='latest' or 'all')"
    """:meth:`LeaseBackend.last_slots` tells each job's newest slot, so a starting instance
    claims the slots missed since."""
    HANDOVER = "hand-over on graceful stop (handover=True)"
    """:meth:`LeaseBackend.release` hands a running attempt to a backup at once."""
    HISTORY_TTL = "history trimmed by age (history_ttl_ms)"
    """Pruning by age: a result drops the slots that ended more than the ticket's
    ``history_ttl_ms`` ago."""


def legacy_skip_cause(reason: str | None) -> SkipCause | None:
    """The skip cause of a record stored without one, read from the words of its ``reason``: the
    compatibility path, and the only place where anarchon reads a reason's words.

    Records written before runs carried a :attr:`~anarchon.Run.skip_cause` (SQLite's before its
    schema version 7, PostgreSQL's before version 5, and those an instance of an older version
    writes beside a newer one) said their kind only in words: ``too old: ...`` (pruned),
    ``unknown: ...``, ``overlap: ...``, ``too late: ...``, ``behind: ...``, ``paused by ...``,
    ``cancelled by ...``, and a broker's ``...; not recorded[: ...]``. A backend calls this when
    it reads a record whose stored cause is absent; anything else gives None.
    """
    if not reason:
        return None
    if reason.endswith(_LEGACY_NOT_RECORDED) or f"{_LEGACY_NOT_RECORDED}:" in reason:
        return SkipCause.NOT_RECORDED
    for prefix, cause in _LEGACY_PREFIXES:
        if reason.startswith(prefix):
            return cause
    return None


def still_open(runs: Iterable[Run], since_ms: int) -> list[Run]:
    """The runs of ``runs`` that :meth:`LeaseBackend.open_runs` answers: still ``running``,
    with a :attr:`~anarchon.Run.slot_key`, started at or after ``since_ms``; for a backend that
    finds them among a job's newest attempts (the default, Redis)."""
    return [
        run
        for run in runs
        if run.status is RunStatus.RUNNING
        and run.slot_key is not None
        and run.started_at.timestamp() * 1000 >= since_ms
    ]


def slot_key_of(slot: int | None, run_id: str) -> str:
    """Return the slot key: the slot in epoch ms, or ``manual-<run_id>`` for a manual run."""
    return str(slot) if slot is not None else f"manual-{run_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPolicy:
    """What a backend needs to know about a job to validate it and keep its records.

    Options are resolved: a lease backend sees its defaults filled in, a broker sees ``lease_ms``
    0 and no lease features.
    """

    name: str
    """The job's name."""
    jitter_ms: int
    """How long after a slot an instance may wait before claiming it, in ms (the rank delays fall
    within it)."""
    max_late_ms: int
    """An instance that reaches a slot more than this many ms after it does not run it."""
    lease_ms: int
    """Length of a run's lease in ms, renewed every third of it; 0 on a broker."""
    max_attempts: int
    """Attempts per slot, counting takeovers; 1 on a broker."""
    overlap: Overlap
    """What a slot does while the job's previous run still holds its lease."""
    catch_up: CatchUp
    """Which slots missed while no instance ran an instance runs when it starts (and which of a
    backlog)."""
    catch_up_window_ms: int
    """Only slots this recent (in ms) are caught up."""
    handover: bool
    """Whether a graceful stop releases an unfinished run's lease, so a backup runs it again at
    once."""
    history_ttl_ms: int | None
    """Slots whose latest attempt ended more than this many ms ago are pruned; None on a broker."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """An instance's attempt to become the runner of one slot (or of a manual run)."""

    job: str
    """The job's name."""
    slot: int | None
    """Epoch ms of the slot; None for a manual run."""
    run_id: str
    """The run id of the record this claim makes, if it makes one (the attempt it wins, or the skip
    it records)."""
    token: str
    """A random token made for this claim; a won claim's ticket holds it, and the claim sent
    again with it is answered WON again while attempt 1 still runs (claims are idempotent)."""
    instance: str
    """The id of the claiming instance."""
    trigger: Trigger
    """Why the run would start: its slot came, a catch-up, a manual run or a retry."""
    lease_ms: int = 0
    """Length of the lease to take; 0 on a broker."""
    overlap: Overlap = Overlap.ALLOW
    """The job's overlap: with ``skip``, a lease backend records the slot ``skipped`` while another
    run of the job holds a live lease."""
    history_ttl_ms: int | None = None
    """Records of this job older than this may be pruned (lease backends)."""
    skip_reason: str | None = None
    """If set, record the slot with status :attr:`skip_status` and this reason instead of
    running it (a slot that became too late, or one nobody ran), unless it has a record."""
    skip_cause: SkipCause | None = None
    """The cause to record with :attr:`skip_reason` (:attr:`~anarchon.SkipCause.TOO_LATE`,
    :attr:`~anarchon.SkipCause.BEHIND`); None for a slot nobody ran (its status, ``missed``,
    says it)."""
    skip_status: RunStatus = RunStatus.SKIPPED
    """The status a ``skip_reason`` records: ``skipped``, or ``missed`` for a slot nobody ran
    while no instance carried the job."""
    key: str | None = None
    """The slot key, when it is not :func:`slot_key_of` ``(slot, run_id)``: a retry's
    (:func:`anarchon.control.retry_key`), or a triggered run's ``manual-<request id>``."""
    requested_by: str | None = None
    """Who asked for this run (a trigger, a retry); stored and returned in the run's
    ``requested_by``."""

    @property
    def slot_key(self) -> str:
        """:attr:`key` if set, else :func:`slot_key_of` ``(slot, run_id)``."""
        return self.key if self.key is not None else slot_key_of(self.slot, self.run_id)


class ClaimStatus(StrEnum):
    """The answer to a claim."""

    WON = "won"
    """This request created attempt 1: the caller runs the handler."""
    LOST = "lost"
    """Another request got there first, the slot was pruned, attempt 1 of this very token has
    already ended, or (with :attr:`ClaimOutcome.error`) the request could not be decided: the
    caller does not run. The core counts as refused, not lost to another instance, an answer
    with an error, or whose run is a ``skipped`` record not stored with the skip cause
    :attr:`~anarchon.SkipCause.PRUNED` (reason :data:`PRUNED_REASON`) or
    :attr:`~anarchon.SkipCause.UNKNOWN` (a store that cannot vouch for the slot): nobody runs
    those slots (metrics ``unclaimed``, span outcome ``refused``)."""
    SKIPPED = "skipped"
    """The slot is recorded as ``skipped`` (overlap, too late, behind), by this caller or
    another; its run's :attr:`~anarchon.Run.skip_cause` says which. A skip the backend answers
    but does not store (a broker's) has the cause :attr:`~anarchon.SkipCause.NOT_RECORDED`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunIdentity:
    """The fields that name one claim of a run: the slot, the run and who claimed it with which
    token. A :class:`Ticket` starts with them; a backend's own record of a claim may too."""

    job: str
    """The job's name."""
    slot: int | None
    """Epoch ms of the slot; None for a manual run."""
    slot_key: str
    """The slot key: with :attr:`job`, it names the run."""
    run_id: str
    """The run id of the claimed attempt."""
    token: str
    """The claim's token: only its holder may renew, release or finish the attempt."""
    instance: str
    """The id of the instance that claimed."""
    trigger: Trigger
    """Why the run started: its slot came, a catch-up, a manual run or a retry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket(RunIdentity):
    """What the winner of a claim or takeover holds: proof of ownership of one attempt."""

    attempt: int
    """The attempt's number: 1 for the claim, one more for each takeover."""
    fence: int | None
    """The attempt's fence, handed to the handler as ``ctx.fence``; it only rises per job."""
    started_at_ms: int
    """When the attempt started (backend clock, epoch ms)."""
    lease_ms: int = 0
    """Length of the lease in ms, renewed every third of it; 0 on a broker."""
    lease_expires_at_ms: int | None = None
    """Backend clock; None on a broker."""
    backend_now_ms: int | None = None
    """The backend's clock when it answered, to relate its expiry to the local clock."""
    history_ttl_ms: int | None = None
    """The claim's ``history_ttl_ms``: when the result is stored, slots that ended longer ago than
    this are pruned; None: none by age."""

    def renewed(self, expires_at_ms: int, backend_now_ms: int) -> Ticket:
        """Return this ticket with a new lease expiry."""
        return replace(self, lease_expires_at_ms=expires_at_ms, backend_now_ms=backend_now_ms)


class FinishRequest(NamedTuple):
    """One result for :meth:`Backend.finish_many`: the attempt ``ticket`` holds ended with
    ``status`` (a :class:`~anarchon.RunStatus`: ``succeeded`` or ``failed``) and ``error``,
    and, for a ``failed`` run that has retries left, the ``retry`` to store with it."""

    ticket: Ticket
    """The ticket of the attempt that ended."""
    status: RunStatus
    """``succeeded`` or ``failed``."""
    error: str | None
    """Why a ``failed`` run failed (stored as :attr:`Run.error <anarchon.Run.error>`); None for
    ``succeeded``."""
    retry: RunRequest | None = None
    """The run request of the failed run's retry (:attr:`~anarchon.Trigger.RETRY`), stored in
    the same atomic step as the result (see :meth:`Backend.finish`); None: no retry. Only ever
    set on a backend whose :meth:`Backend.control` is not None."""


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change a lease backend reports to its subscribers: the attempt of
    ``(job, slot_key)`` was released (``released`` True: a backup should take it over now) or
    ended (False: backups stop watching)."""

    job: str
    """The job's name."""
    slot_key: str
    """The slot key of the run whose attempt changed."""
    released: bool
    """True: the attempt was released and a backup should take it over now; False: it ended."""


ChangeListener = Callable[[str, str, bool], None]
"""A subscriber of :meth:`LeaseBackend.subscribe`, called as ``on_change(job, slot_key,
released)`` (the fields of a :class:`ChangeEvent`)."""


@dataclass(frozen=True, slots=True)
class ClaimNotice:
    """A claim an instance won, announced to the others (:meth:`Backend.subscribe_claims`), so
    an instance that was still waiting its rank delay for ``(job, slot_key)`` does not claim it
    (a call that could only lose) and, on a lease backend, watches the run as a backup."""

    job: str
    """The job's name."""
    slot_key: str
    """:attr:`ClaimRequest.key` of the won claim: the slot in epoch ms as text for a scheduled
    slot (``slot_key_of``), ``manual-<id>`` or a retry key for the others."""
    instance: str
    """The winner's instance id."""
    lease_expires_at_ms: int | None
    """When the winner's lease ends unless renewed (backend clock, epoch ms); None on a broker
    backend (no lease, no backups)."""


ClaimListener = Callable[[Sequence[ClaimNotice]], None]
"""A subscriber of :meth:`Backend.subscribe_claims`, called with the notices of one batch of
won claims (one backend message may carry many)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimOutcome:
    """A backend's answer to one :class:`ClaimRequest`."""

    status: ClaimStatus
    """Whether the claim won, lost, or ended with the slot recorded ``skipped``."""
    run: Run
    """The record as stored: ours when won, the holder's when lost, the skip record if skipped."""
    ticket: Ticket | None = None
    """Set when won."""
    lease_expires_at_ms: int | None = None
    """When lost to a running attempt on a lease backend: that attempt's lease expiry."""
    backend_now_ms: int | None = None
    """The backend's clock when it answered (epoch ms), to relate :attr:`lease_expires_at_ms` to the
    local clock."""
    error: BackendError | None = None
    """Set when the backend could not decide this request (a value it cannot store, such as a
    ``lease_ms`` out of range): the status is LOST, nothing was recorded, the caller does not
    run. The other requests of the batch are decided as usual."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeoverRequest:
    """A backup's request to take over ``(job, slot_key)`` if its lease has expired."""

    job: str
    """The job's name."""
    slot_key: str
    """The slot key of the run to take over."""
    run_id: str
    """The new attempt's run id."""
    token: str
    """A random token for the new attempt; the same request sent again after it won is answered
    TAKEN again."""
    instance: str
    """The id of the instance taking over."""
    lease_ms: int
    """Length of the new attempt's lease in ms."""
    max_attempts: int
    """The job's attempts per slot: a lease that expires on the last one ends the run ``failed``
    (EXHAUSTED)."""
    history_ttl_ms: int | None = None
    """The job's ``history_ttl_ms``, carried into the new attempt's ticket."""


class TakeoverStatus(StrEnum):
    """The answer to a takeover."""

    TAKEN = "taken"
    """The caller now holds attempt ``n + 1``: it runs the handler."""
    HELD = "held"
    """The current attempt's lease is still live: check again at its expiry."""
    ENDED = "ended"
    """The run finished (or was taken by someone else who finished): stop watching."""
    EXHAUSTED = "exhausted"
    """The lease expired on the last allowed attempt: the backend recorded it ``failed``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeoverOutcome:
    """A backend's answer to a :class:`TakeoverRequest`."""

    status: TakeoverStatus
    """Whether the caller took the run over, its lease is still held, the run ended, or its attempts
    ran out."""
    run: Run | None = None
    """The current attempt after the call (the new one when taken)."""
    ticket: Ticket | None = None
    """The caller's ticket for the new attempt when TAKEN; None otherwise."""
    lease_expires_at_ms: int | None = None
    """When TAKEN or HELD: when the current attempt's lease ends unless renewed (backend clock,
    epoch ms)."""
    backend_now_ms: int | None = None
    """The backend's clock when it answered (epoch ms), to relate :attr:`lease_expires_at_ms` to the
    local clock."""


class SlotRecords(NamedTuple):
    """What :meth:`Backend.slot_records` answers: the records of one slot and where the job's
    records begin."""

    runs: list[Run]
    """Every record of the slot (its attempts, its retries' attempts and a skip or missed
    record), oldest first: by start, then in the order they were recorded."""
    oldest_ms: int | None
    """The earliest of the job's recorded slots and start times (epoch ms), whatever the slot
    asked about; None when the job has no records."""


def _implements(cls: type, name: str, base: type) -> bool:
    """True if ``cls`` defines ``name`` itself or through a class other than ``base``."""
    return getattr(cls, name) is not getattr(base, name)


async def _one_by_one(
    items: Sequence[Item], call: Callable[[Item], Awaitable[Answer]]
) -> list[Answer | BackendError]:
    """The default batch form: ``call`` per item, its error returned for that item alone; an
    unavailable backend fails the whole call."""
    out: list[Answer | BackendError] = []
    for item in items:
        try:
            out.append(await call(item))
        except BackendUnavailable:
            raise
        except BackendError as exc:
            out.append(exc)
    return out


# Calls a backend may implement in either form: (single, batch, the class defining both).
_PAIRS: Final = (("finish", "finish_many"), ("renew", "renew_many"), ("last_slot", "last_slots"))


class Backend(abc.ABC):
    """Decides, slot by slot, which instance runs, and keeps the history of runs.

    Implementations must be safe for many instances (processes, hosts) sharing one store and for
    many concurrent calls from one event loop.

    ``finish`` and ``finish_many`` (and for leases ``renew``/``renew_many``,
    ``last_slot``/``last_slots``) come in pairs: implement either form, the default of the
    other calls it. A class that implements neither cannot be made (TypeError naming both).
    """

    def __new__(cls, *args: object, **kwargs: object) -> Backend:
        """Refuse a backend that implements neither form of a paired call."""
        for single, batch in _PAIRS:
            base = LeaseBackend if single != "finish" else Backend
            if not issubclass(cls, base):
                continue
            if not _implements(cls, single, base) and not _implements(cls, batch, base):
                raise TypeError(
                    f"{cls.__name__} implements neither {single}() nor {batch}(): a backend "
                    f"implements one of them (see anarchon.backend.{base.__name__})"
                )
        return super().__new__(cls)

    #: Short name used in messages and logs ("sqlite", "nats" ...).
    name: str = "backend"
    #: The lease features this backend has; brokers have none.
    capabilities: frozenset[Capability] = frozenset()
    #: True when every instance necessarily runs on this host and reads its wall clock, and the
    #: backend's clock (:meth:`server_time_ms`) is that wall clock (SQLite, memory): a step of
    #: it moves every instance and the backend at once, so the core fires slots by it and moves
    #: its estimate of the backend's clock by the step before measuring again.
    one_host: bool = False

    @property
    def is_lease_backend(self) -> bool:
        """True if this backend keeps renewable leases (implements :class:`LeaseBackend`)."""
        return isinstance(self, LeaseBackend)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect and prepare storage (create tables, streams, scripts). Idempotent.

        Raise a :class:`~anarchon.errors.BackendError` whose message says what is wrong and how to
        fix it; never hang for minutes.
        """

    async def start_reader(self) -> None:
        """Connect only to read history (the ``anarchon history`` command): change nothing
        about the store, such as a stream's limits. Default: :meth:`start`."""
        await self.start()

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`start` opened. Never close a client the caller passed in."""

    def check_job(self, policy: JobPolicy) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~anarchon.errors.ConfigurationError` if this backend cannot serve the job.

        Called when a job is added, after the core's own checks (a broker checks its duplicate
        window here). Capability checks are done by the core from :attr:`capabilities`.
        """

    def skew_budget_ms(self, policy: JobPolicy) -> int | None:
        """How far an instance's clock may drift from the backend's before a slot could run twice.

        For a lease backend that is the history TTL (records outlive any late claim); a broker
        answers with its de-duplication window less ``jitter_ms + max_late_ms``. None: unbounded.
        """
        return policy.history_ttl_ms

    @abc.abstractmethod
    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """Try to become the runner of each request's slot; one outcome per request, in order.

        For each request, atomically (one winner among every instance, however they interleave):

        * if ``(job, slot_key)`` has no record and the slot has not been pruned: when
          ``skip_reason`` is set, record a run with status ``skip_status`` (``skipped`` or
          ``missed``), that reason and the cause ``skip_cause`` and answer SKIPPED; when
          the job (or the whole cluster) is paused and the trigger is not ``manual``
          (:func:`anarchon.control.active_pause`, on the backend's clock), record it
          ``skipped`` with :func:`anarchon.control.paused_reason` (cause ``PAUSED``) and
          answer SKIPPED; when ``overlap`` is SKIP and another run of the job is ``running``
          with a live lease, record this slot ``skipped`` with a reason naming that run
          (cause ``OVERLAP``) and answer SKIPPED;
          otherwise record attempt 1 ``running`` (lease ``lease_ms`` from the backend's now, a
          new fence above every earlier fence of the job) and answer WON with a :class:`Ticket`.
          Every record keeps the request's ``requested_by``.
        * if the slot was pruned (module docstring), answer LOST with an unstored ``skipped``
          run of cause ``PRUNED``; a store that cannot vouch for a slot it has no record of
          answers the same with cause ``UNKNOWN``.
        * if a record exists and its token is this request's token (a retried claim), answer WON
          with the stored ticket again while attempt 1 is still ``running`` and not released:
          claims must be idempotent per token. Once that attempt has ended, answer LOST.
        * if a record exists otherwise: answer SKIPPED when it is a skip record (``skipped`` or
          ``missed``, attempt 1), else LOST with the current attempt and, if running on a
          lease, its expiry.

        The overlap reason names the first recorded attempt of the job that is running under a
        live lease. A new fence is ``max(last fence + 1, backend clock in ms)``.

        A batch need not be atomic as a whole, and each request is decided on its own: a request
        the backend cannot store (a number out of range, a string the store refuses) is answered
        LOST with :attr:`ClaimOutcome.error` set, and the others go on. Raise
        :class:`~anarchon.errors.BackendUnavailable` if the backend cannot be reached; the caller
        then fails closed and retries with the same tokens.
        """

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        """Record the end of the attempt ``ticket`` holds (``succeeded``, ``failed``), return it.

        Atomically accept only if the attempt is still the current one for ``(job, slot_key)``,
        is ``running`` and its token is ``ticket.token``; otherwise raise
        :class:`~anarchon.errors.LeaseLost` (a backup took over: the late result is refused).
        The same result (same status and error) sent again with the same token (a retry whose
        answer was lost) returns the stored run instead; a failure a backup recorded (after
        ``exhausted``) is not that, and a late result of either status is refused alike.
        Lease backends prune the job's history when they accept a result, by the shared rules
        (module docstring): never the slot being finished, never a running slot, never a
        record another instance may still need to refuse a claim. A refused result prunes
        nothing.

        ``retry`` (a ``failed`` result with retries left; only on a backend whose
        :meth:`control` is not None): store this run request in the control store, unless one
        with its id is stored, in the same atomic step (transaction, script) that accepts the
        result, so that a process that dies right after the result was accepted cannot lose its
        retry, and a refused result stores none. A result accepted again (the same result sent
        again) stores nothing more: its first acceptance stored the retry. A store that cannot
        do both in one step (NATS: a stream and a bucket) stores the retry first, idempotently,
        and then the result, and says so in its documentation: a retry is never lost, but a
        result refused after its retry was stored leaves that retry.

        Default: one :meth:`finish_many` call (implement either of the two).
        """
        [answer] = await self.finish_many([FinishRequest(ticket, RunStatus(status), error, retry)])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """Record several results: for each ``(ticket, status, error, retry)``, what
        :meth:`finish` returns, or the error it would raise for that item (returned, not raised):
        :class:`~anarchon.errors.LeaseLost`, a :class:`~anarchon.errors.BackendUnavailable` for
        an item that may be retried, or a permanent :class:`~anarchon.errors.BackendError` for an
        item the store cannot hold.

        Each item is decided on its own (one failing item never fails the others); raise
        :class:`~anarchon.errors.BackendUnavailable` only if the call as a whole failed. The core
        gathers results that arrive together (10 000 jobs finishing in one second) into one
        call; override to answer them in one round trip. Default: :meth:`finish` per item
        (without a ``retry`` argument when the item has none, so a backend without a control
        store may keep the three-argument :meth:`finish`).
        """
        return await _one_by_one(items, self._finish_one)

    async def _finish_one(self, item: FinishRequest) -> Run:
        """:meth:`finish` of one item, passing ``retry`` only when there is one."""
        ticket, status, error, retry = item
        if retry is None:
            return await self.finish(ticket, status, error)
        return await self.finish(ticket, status, error, retry)

    @abc.abstractmethod
    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """Return up to ``limit`` runs of ``job``, newest first.

        Newest is by start on the backend's clock and, among runs that started in the same
        millisecond (a batch of claims, a quick claim after a result), by the order they were
        recorded in: the later record comes first. Every attempt is its own run.

        Works for any job the backend has records of, registered or not; unknown jobs give ``[]``.
        A lease backend sets each run's :attr:`~anarchon.Run.slot_key` (``kit.lease``'s
        ``RunRow.to_run`` does): an instance that starts carrying a job reads it to watch the
        runs still open, and a run without it is not taken over by such an instance.
        """

    async def last_run(self, job: str) -> Run | None:
        """Return the newest run of ``job`` (running or finished), or None."""
        runs = await self.history(job, limit=1)
        return runs[0] if runs else None

    async def slot_records(self, job: str, slot: int) -> SlotRecords | None:
        """Return the records of ``job`` whose slot is ``slot`` (epoch ms) and the earliest
        recorded time of the job (:class:`SlotRecords`), or None if this backend cannot look a
        slot up (the default).

        :func:`anarchon.explain.explain` asks it first, so explaining a slot costs a lookup
        instead of a read of the job's history; on None it reads the newest records instead.
        Implement it only if it costs about what :meth:`history` with a small limit does,
        however many records the job has (index lookups, not a scan): every attempt whose
        slot is ``slot`` (retries, keyed ``<slot>-retry-<n>``, carry the slot too; manual runs
        never match), oldest first as :meth:`history` orders them, newest last. Unknown jobs
        and slots give ``SlotRecords([], ...)``.
        """
        return None

    # -- many jobs' history in one call: the views of many jobs ------------------------------

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """Return :meth:`history` ``(job, limit)`` of each of ``jobs``, keyed by job: the same
        runs in the same order (newest first), one key per distinct name, ``[]`` for a job that
        has no records (and for every job when ``limit`` is 0 or less).

        For the views of many jobs at once (``anarchon jobs`` through
        :func:`~anarchon.registry.describe_jobs`, the dashboard's jobs page), which ask for at
        most :data:`~anarchon.registry.DESCRIBE_BATCH` jobs a call. Override to answer in one
        round trip (one statement, one pipeline or script) the runs the per-job reads would
        answer: each job's list as one :meth:`history` would read it, with no atomicity across
        jobs. The answer is whole or an error: raise what :meth:`history` would raise
        (:class:`~anarchon.errors.BackendUnavailable` if the backend cannot be reached).

        Optional. Default: :meth:`history` per job, :data:`~anarchon.registry.DESCRIBE_READS`
        at a time, the first error ending the other reads and raised; so a backend written
        before this method existed keeps working, at one call per job.
        """
        from .registry import DESCRIBE_READS

        names = list(dict.fromkeys(jobs))
        if limit <= 0:
            return {job: [] for job in names}
        gate = asyncio.Semaphore(DESCRIBE_READS)

        async def read(job: str) -> list[Run]:
            async with gate:
                return await self.history(job, limit)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(read(job)) for job in names]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None  # the backend's error, as one read raised it
        return {job: task.result() for job, task in zip(names, tasks, strict=True)}

    async def server_time_ms(self) -> int | None:
        """Return the backend's clock (epoch ms) now, or None if it cannot tell at the moment.

        The core compares it with the local clock to warn about skew.
        """
        return None

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """Return the newest recorded slot of each job, or None where unknown. Lease backends
        answer it exactly (:meth:`LeaseBackend.last_slot`); a broker may answer from what it
        keeps. The core uses it for catch-up and to record the slots nobody ran. Default:
        unknown for every job."""
        return dict.fromkeys(jobs)

    async def subscribe_claims(self, on_claims: ClaimListener) -> bool:
        """Call ``on_claims`` with a :class:`ClaimNotice` for every claim any instance wins from
        now on (its own included); return True if this backend announces claims, False (the
        default) if it does not.

        Optional, and only ever an optimisation: with it, the instances that rank below a
        slot's preferred instance (rendezvous hashing over the registry) skip a claim that could
        only lose, so a healthy fleet makes about one claim per slot. A notice is sent only
        after the claim was decided won (in the same transaction or script, or after the ack),
        never for a claim that may still fail. A lost or late notice costs one losing claim,
        never a run. :class:`anarchon.kit.feed.ChangeFeed` can keep the listeners."""
        return False

    def expect_claims(self, start_ms: int, end_ms: int) -> None:  # noqa: B027 - optional hook
        """A hint, called on the scheduler's event loop: from ``start_ms`` to ``end_ms`` (wall
        clock, epoch ms) this instance waits to claim a slot that another instance may win
        first (a backup's rank delay), so claim notices are wanted quickly then. A backend
        that polls for notices can poll fast only inside such windows; the default ignores
        the hint."""

    def registry(self) -> RegistryStore | None:
        """Return where this backend keeps the registry of instances and job definitions
        (:mod:`anarchon.registry`), on its own connection; None (the default) if it has none."""
        return None

    def control(self) -> ControlStore | None:
        """Return where this backend keeps pauses and run requests (:mod:`anarchon.control`),
        on its own connection; None (the default) if it has none."""
        return None


class LeaseBackend(Backend):
    """A backend that keeps a renewable lease per running attempt, on its own clock.

    Adds backup runners (takeover), overlap protection, catch-up and hand-over.
    """

    capabilities = frozenset(Capability)

    #: When the backend cannot push release notifications, backups re-check a watched run at
    #: least this often (ms), so a hand-over is noticed without waiting for lease expiry.
    release_poll_ms: int | None = None

    async def renew(self, ticket: Ticket) -> Ticket:
        """Extend the lease of ``ticket`` to ``ticket.lease_ms`` from the backend's now.

        Atomically accept only if the attempt is current, ``running``, not released and holds
        ``ticket.token`` (an expired lease nobody took over may still be renewed); return the
        ticket with the new expiry. Otherwise raise :class:`~anarchon.errors.LeaseLost`.

        Default: one :meth:`renew_many` call (implement either of the two).
        """
        [answer] = await self.renew_many([ticket])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        """Renew several leases: for each ticket what :meth:`renew` returns, or the error it
        would raise for that item (returned, not raised): :class:`~anarchon.errors.LeaseLost`,
        or another :class:`~anarchon.errors.BackendError` for that item alone. Each item is
        decided on its own. Override to answer in one round trip; the core gathers renewals
        that fall due together. Default: :meth:`renew` per ticket."""
        return await _one_by_one(tickets, self.renew)

    @abc.abstractmethod
    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """Take over ``(job, slot_key)`` if its current attempt's lease has expired or was released.

        Atomically (compare-and-set, one winner among all backups):

        * current attempt not ``running``: ENDED with it.
        * current attempt holds ``request.token`` (a retried takeover whose answer was lost):
          TAKEN with it again; takeovers are idempotent per token, like claims.
        * lease live and not released: HELD with its expiry and the backend's now. A backup
          that loses the race to another backup is told HELD (the winner's new lease), never
          ENDED: it keeps watching, so a second crash is taken over too.
        * expired or released, ``attempt < max_attempts``: mark the current attempt ``failed``
          with reason ``lease lost`` (or ``handed over`` if released), record attempt + 1
          ``running`` for the caller with a new token, a new lease and a fence above every
          earlier fence of the job; answer TAKEN with the new ticket.
        * expired or released on the last attempt: mark it ``failed`` with an error saying the
          lease expired on attempt n of ``max_attempts``; answer EXHAUSTED, and notify
          subscribers that the run ended (as a finish does).
        """

    @abc.abstractmethod
    async def release(self, ticket: Ticket, reason: str) -> None:
        """Hand the attempt over: end its lease now and mark it released, status still ``running``.

        A backup's next :meth:`take_over` succeeds at once. Raise
        :class:`~anarchon.errors.LeaseLost` if ``ticket`` is no longer the current holder.
        """

    async def last_slot(self, job: str) -> int | None:
        """Return the newest scheduled or catch-up slot of ``job`` (any status), or None.

        Pruned slots count: the answer is the newest of the recorded slots and the job's
        pruned-through mark, so catch-up behaves the same after history was trimmed.

        Default: one :meth:`last_slots` call (implement either of the two)."""
        return (await self.last_slots([job])).get(job)

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """Return :meth:`last_slot` for each job. Override to answer in one round trip: a
        scheduler with thousands of jobs asks for them when it starts, at most 2 000 a call.
        Default: :meth:`last_slot` per job."""
        return {job: await self.last_slot(job) for job in jobs}

    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        """Return the attempts of ``jobs`` still recorded ``running`` (their lease live, expired
        or released) that started at or after ``since_ms`` (the backend's clock), each with its
        :attr:`~anarchon.Run.slot_key`, in any order.

        The scheduler asks when it starts carrying jobs (at most 2 000 a call), to watch the
        runs that no claim of its own lost to: a run whose runner dies is then taken over even
        when every instance that lost its claim is gone too. Override to answer from an index of
        running attempts in one round trip. Default: each job's :data:`OPEN_RUNS_LOOKBACK`
        newest attempts (:meth:`history`), four jobs at a time."""
        gate = asyncio.Semaphore(4)

        async def newest(job: str) -> list[Run]:
            async with gate:
                return await self.history(job, OPEN_RUNS_LOOKBACK)

        found = await asyncio.gather(*(newest(job) for job in dict.fromkeys(jobs)))
        return [run for runs in found for run in still_open(runs, since_ms)]

    async def subscribe(self, on_change: ChangeListener) -> None:
        """Call ``on_change(job, slot_key, released)`` (a :class:`ChangeEvent`'s fields) when an
        attempt is released (``released`` True: a backup should take it over now) or finishes
        (False: backups stop watching).

        Optional: a backend that can push notifications (pub/sub, LISTEN/NOTIFY, a polled
        events table) wakes backups with it; others leave it and set :attr:`release_poll_ms`.
        Losing a notification must be harmless: backups still check at lease expiry.
        :class:`anarchon.kit.feed.ChangeFeed` keeps the listeners and isolates a failing one.
        """

    def clone(self) -> LeaseBackend | None:
        """Return a new, unstarted backend on the same store with its own connections, for
        another thread's event loop; None if impossible (e.g. a client the caller passed in
        that cannot be copied).

        The scheduler renews leases from a thread of its own with such a clone, so a handler
        that blocks the event loop cannot stop renewals. The clone only renews: it is started,
        used for :meth:`renew_many` and stopped on that thread, and must close what it opens.
        Without one (the default), leases are kept on the event loop.
        """
        return None
