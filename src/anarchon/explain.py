"""Every slot's fate: why a job did or did not run at a given time (``anarchon explain``).

:func:`explain` reads a job's records and definition from the backend and answers, for any
moment, one :class:`Fate` (each member says what it means): ``not-a-slot``, ``future``,
``running``, ``ran``, ``skipped``, ``missed`` or ``no-record``.

It looks the slot's records up by slot (:meth:`~anarchon.backend.Backend.slot_records`: SQLite,
PostgreSQL and memory), so a job with a million records costs no more than one with ten. On a
backend that cannot, it finds them in the job's newest ``limit`` records
(:meth:`~anarchon.backend.Backend.history`, default :data:`HISTORY_LIMIT`): a slot older than
those is reported ``no-record`` and says that it lies beyond what was read.

Example::

    fate = await explain(backend, "sync", datetime(2026, 1, 1, 10, 33, tzinfo=UTC))
    print(fate.describe())        # or fate.to_dict() for JSON
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from ._json import run_json
from ._models import Run, RunStatus, SkipCause, Trigger
from ._readable import iso_exact as _iso
from ._readable import iso_local, ms_of, span
from ._redact import redact_url
from ._schedule import CronSchedule
from ._times import RANGE_RULE, check_time_ms, in_range
from .backend import Backend
from .control import Pause, active_pause, paused_reason
from .errors import InvalidOption, JobNotFound
from .registry import ClusterView, JobDefinition, build_view, read_instances
from .steering import backend_now_ms

__all__ = ["HISTORY_LIMIT", "Attempt", "Fate", "SlotFate", "explain", "nearest_slots"]

HISTORY_LIMIT: Final = 10_000
"""How many of a job's newest records :func:`explain` reads by default to find a slot's."""
WIDTH: Final = 100
"""The widest line :meth:`SlotFate.describe` prints."""
SEARCH_LIMIT_MS: Final = 50 * 366 * 86_400_000
"""How far :func:`nearest_slots` looks for a previous slot (the schedule's own horizon)."""


class Fate(StrEnum):
    """What became of one slot (see the module docstring)."""

    NOT_A_SLOT = "not-a-slot"
    """The job's schedule has no slot then (the answer names the nearest slot before and after)."""
    FUTURE = "future"
    """The slot is to come (when, which live instances carry the job, a pause that holds)."""
    RUNNING = "running"
    """An attempt runs now."""
    RAN = "ran"
    """It ran, ``succeeded`` or ``failed`` in the end; every attempt is listed (backup takeovers,
    hand-overs, retries of the slot with trigger ``retry``) with its instance, fence, duration and
    result or error."""
    SKIPPED = "skipped"
    """Recorded without running (overlap, too late, behind, paused by …)."""
    MISSED = "missed"
    """Recorded after the fact because no instance carried the job then (the gap)."""
    NO_RECORD = "no-record"
    """In the past and nothing recorded: either history was pruned (the slot is older than the
    oldest record) or nobody claimed it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One recorded attempt at the slot: a claim, a backup's takeover, a retry or a skip."""

    run_id: str
    """The attempt's run id."""
    instance: str
    """The id of the instance that made the attempt (or recorded the skip)."""
    trigger: Trigger
    """``schedule``, ``catch-up`` or ``retry`` (a retry of a failed run)."""
    retry: int
    """0 for the slot's own run; n for its n-th retry."""
    attempt: int
    """The attempt number within its run (a backup's takeover is ``attempt + 1``)."""
    fence: int | None
    """The fence it ran under; None for a record that holds none (a skip)."""
    status: RunStatus
    """Where it stands: ``running``, ``succeeded``, ``failed``, or recorded without running
    (``skipped``, ``missed``)."""
    started_ms: int
    """When it started, or was recorded if it did not run (epoch ms)."""
    finished_ms: int | None
    """When it ended (epoch ms); None while running."""
    error: str | None
    """Why a ``failed`` attempt failed (its record's :attr:`~anarchon.Run.error`); None
    otherwise."""
    reason: str | None
    """Why it was skipped or superseded (``lease lost``, ``overlap …``, ``paused by …``)."""
    requested_by: str | None
    """Who asked for the run (a trigger's ``by``; ``retry <n> of <m> after run <id>`` for a retry);
    None if not recorded."""
    record: Run = field(repr=False, compare=False)
    """The record this attempt was read from, as :meth:`~anarchon.backend.Backend.history`
    returned it."""

    @property
    def took_ms(self) -> int | None:
        """Milliseconds from start to finish; None while running."""
        return None if self.finished_ms is None else self.finished_ms - self.started_ms

    @property
    def skip_cause(self) -> SkipCause | None:
        """For a ``skipped`` attempt: the kind of its :attr:`reason` (its record's
        :attr:`~anarchon.Run.skip_cause`); None otherwise."""
        return self.record.skip_cause

    @classmethod
    def of(cls, run: Run, retry: int) -> Attempt:
        """The attempt a recorded :class:`~anarchon.Run` is."""
        finished = run.finished_at
        return cls(
            run_id=run.run_id,
            instance=run.instance,
            trigger=run.trigger,
            retry=retry,
            attempt=run.attempt,
            fence=run.fence,
            status=run.status,
            started_ms=ms_of(run.started_at),
            finished_ms=None if finished is None else ms_of(finished),
            error=run.error,
            reason=run.reason,
            requested_by=run.requested_by,
            record=run,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of one attempt in ``anarchon explain --json``: its :attr:`record` as
        ``anarchon history --json`` shows a run (:func:`anarchon._json.run_json`), and
        :attr:`retry`."""
        return {**run_json(self.record), "retry": self.retry}


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotFate:
    """The fate of one slot of one job, as :func:`explain` found it. Immutable."""

    job: str
    """The job's name."""
    slot_ms: int
    """The moment asked about (epoch ms, UTC)."""
    fate: Fate
    """What became of the slot."""
    definition: JobDefinition
    """The definition the slot was judged by (the one most live instances carry, or the one
    given)."""
    now_ms: int
    """When it was judged (backend clock)."""
    outcome: RunStatus | None = None
    """For ``ran``: ``succeeded`` or ``failed``, the status of the last attempt that ran."""
    reason: str | None = None
    """For ``skipped`` and ``missed``: the recorded reason; for ``no-record``: what anarchon can
    tell about why (pruned, beyond the records read, or nobody claimed it)."""
    skip_cause: SkipCause | None = None
    """For ``skipped``: the recorded :attr:`~anarchon.Run.skip_cause` (the kind of
    :attr:`reason`)."""
    attempts: tuple[Attempt, ...] = ()
    """Every recorded attempt at the slot, retries included, oldest first."""
    previous_slot_ms: int | None = None
    """For ``not-a-slot``: the nearest slot before (None if none in 50 years)."""
    next_slot_ms: int | None = None
    """For ``not-a-slot``: the nearest slot after (None if none before the end of 9998, the
    last year anarchon handles)."""
    instances: tuple[str, ...] = ()
    """For ``future``: the live instances that carry the job."""
    pause: Pause | None = None
    """For ``future``: a pause that holds the job now (the slot is skipped unless resumed)."""
    history_pruned: bool | None = None
    """For ``no-record``: True when the slot is older than the oldest record (history may have
    been pruned or not read that far), False when records older than it exist, None when the
    job has no records."""
    oldest_record_ms: int | None = None
    """The earliest slot or start among the job's records (of those read, on a backend
    without :meth:`~anarchon.backend.Backend.slot_records`); None: no records."""
    records_read: int = 0
    """How many of the job's records were read: the slot's own when the backend looks slots
    up, else the newest ones (at most ``history_limit``)."""
    history_limit: int = HISTORY_LIMIT
    """How many records are read on a backend that cannot look a slot up."""
    is_slot: bool = True
    """False when records exist for a time that is not a slot of :attr:`definition` (the
    schedule changed since)."""
    notes: tuple[str, ...] = field(default=())
    """Further remarks, one sentence each (a drift between instances, a slot due just now)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``anarchon explain --json`` (docs/operations.md); stable:
        fields are only ever added. The reason, as each attempt's error and reason, has every
        secret in a URL masked."""
        return {
            "job": self.job,
            "slot_ms": self.slot_ms,
            "slot": _iso(self.slot_ms),
            "fate": self.fate.value,
            "outcome": None if self.outcome is None else self.outcome.value,
            "reason": None if self.reason is None else redact_url(self.reason),
            "skip_cause": None if self.skip_cause is None else self.skip_cause.value,
            "definition": self.definition.to_dict(),
            "is_slot": self.is_slot,
            "now_ms": self.now_ms,
            "attempts": [a.to_dict() for a in self.attempts],
            "previous_slot_ms": self.previous_slot_ms,
            "next_slot_ms": self.next_slot_ms,
            "instances": list(self.instances),
            "pause": None if self.pause is None else self.pause.to_dict(),
            "history_pruned": self.history_pruned,
            "oldest_record_ms": self.oldest_record_ms,
            "records_read": self.records_read,
            "history_limit": self.history_limit,
            "notes": list(self.notes),
        }

    def headline(self) -> str:
        """One line: the job, the slot and its fate."""
        what = {
            Fate.NOT_A_SLOT: "not a slot of this schedule",
            Fate.FUTURE: f"in the future ({span(self.slot_ms - self.now_ms)} from now)",
            Fate.RUNNING: "running now",
            Fate.RAN: f"ran, {self.outcome.value if self.outcome else 'finished'}",
            Fate.SKIPPED: "skipped",
            Fate.MISSED: "missed",
            Fate.NO_RECORD: "no record",
        }[self.fate]
        return f"{self.job} @ {self._when(self.slot_ms)}: {what}"

    def describe(self) -> str:
        """The text ``anarchon explain`` prints: a headline, the facts, and the attempts, in
        lines of at most 100 characters (a long error or reason is wrapped)."""
        d = self.definition
        lines = [self.headline(), f"  schedule: {d.expression!r} in {d.zone}"]
        if self.attempts and not self.is_slot:
            lines.append("  (not a slot of this schedule: the records are of an earlier one)")
        if self.fate is Fate.NOT_A_SLOT:
            lines.append(f"  previous slot: {self._when(self.previous_slot_ms)}")
            lines.append(f"  next slot:     {self._when(self.next_slot_ms)}")
        if self.fate is Fate.FUTURE:
            carried = ", ".join(self.instances) or "none: it runs only if an instance carries it"
            lines.append(f"  carried by: {carried}")
            if self.pause is not None:
                lines += _wrap(
                    f"the job is {paused_reason(self.pause)}: this slot is skipped unless it is "
                    "resumed first"
                )
        if self.reason:
            label = "why" if self.fate is Fate.NO_RECORD else "reason"
            lines += _wrap(f"{label}: {self.reason}")
        for note in self.notes:
            lines += _wrap(f"note: {note}")
        if self.attempts:
            lines.append("  attempts (oldest first):")
            lines += ["    " + line for line in _attempt_table(self.attempts)]
            for n, a in enumerate(self.attempts, 1):
                detail = a.error or a.reason
                if detail and detail != self.reason:
                    lines += _wrap(f"#{n}: {detail}", indent="    ")
        return "\n".join(lines)

    def _when(self, ms: int | None) -> str:
        if ms is None:
            return "none"
        local = iso_local(ms, self.definition.zone)
        return _iso(ms) if local is None else f"{_iso(ms)} ({local} {self.definition.zone})"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _attempt_table(attempts: Sequence[Attempt]) -> list[str]:
    """One row per attempt; errors and reasons follow the table (numbered as the rows)."""
    rows = [["#", "run", "attempt", "instance", "fence", "trigger", "started (UTC)", "took"]]
    rows[0].append("result")
    for n, a in enumerate(attempts, 1):
        took = a.took_ms if a.status not in (RunStatus.SKIPPED, RunStatus.MISSED) else None
        result = a.status.value + (f" (asked by {a.requested_by})" if a.requested_by else "")
        rows.append(
            [
                str(n),
                "slot" if a.retry == 0 else f"retry {a.retry}",
                str(a.attempt),
                a.instance,
                "-" if a.fence is None else str(a.fence),
                a.trigger.value,
                datetime.fromtimestamp(a.started_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3],
                "-" if took is None else span(took),
                result,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def nearest_slots(schedule: CronSchedule, moment_ms: int) -> tuple[int | None, int | None]:
    """The slots of ``schedule`` nearest to ``moment_ms``: the last one strictly before (None
    if none in 50 years) and the first one strictly after (None if none before the end of the
    times anarchon handles, 9998)."""
    after = _next_slot(schedule, moment_ms)
    window = 2_000
    while window <= SEARCH_LIMIT_MS:
        found = schedule.slots(moment_ms - window - 1, moment_ms - 1)
        if found:
            return found[-1], after
        window *= 2
    return None, after


def _next_slot(schedule: CronSchedule, after_ms: int) -> int | None:
    """The schedule's first slot after ``after_ms``; None when the walk runs past the end of
    the calendar first (a sparse schedule asked about a time near 9998)."""
    try:
        found = schedule.next_slot(after_ms)
    except (OverflowError, StopIteration):
        return None
    return found if in_range(found) else None


def _is_slot(schedule: CronSchedule, moment_ms: int) -> bool:
    return _next_slot(schedule, moment_ms - 1) == moment_ms


def slot_ms_of(slot: datetime | int) -> int:
    """Epoch ms of ``slot``: an aware datetime or epoch ms (InvalidOption for a naive
    datetime, whose zone is ambiguous here, and for a time out of range:
    :data:`~anarchon._times.RANGE_RULE`)."""
    if isinstance(slot, bool) or not isinstance(slot, datetime | int):
        raise InvalidOption(
            f"slot={slot!r} must be an aware datetime or epoch milliseconds (an int)"
        )
    if isinstance(slot, int):
        return check_time_ms(slot, "slot")
    if slot.tzinfo is None or slot.utcoffset() is None:
        raise InvalidOption(
            f"slot={slot.isoformat()!r} has no time zone: pass an aware datetime "
            "(e.g. with tzinfo=ZoneInfo(the job's zone))"
        )
    ms = ms_of(slot)
    if not in_range(ms):
        raise InvalidOption(f"slot={slot.isoformat()!r} is out of range: {RANGE_RULE}")
    return ms


async def _definitions(
    backend: Backend,
    job: str,
    definition: JobDefinition | None,
    view: ClusterView | None,
    now_ms: int,
) -> tuple[tuple[JobDefinition, ...], ClusterView | None]:
    """The definitions to judge by: ``definition`` if given (the registry is then read only
    later, for a future slot's carriers), else those of the live instances in ``view`` (read
    now if None)."""
    if definition is not None:
        return (definition,), view
    if view is None:
        store = backend.registry()
        if store is not None:
            view = build_view(await read_instances(store, now_ms), now_ms)
    found = () if view is None else tuple(view.definitions.get(job, ()))
    return found, view


async def _pause_of(backend: Backend, job: str, now_ms: int) -> Pause | None:
    store = backend.control()
    if store is None:
        return None
    return active_pause(await store.pauses(), job, Trigger.SCHEDULE, now_ms)


def _retry_numbers(runs: Sequence[Run]) -> list[int]:
    """Number each record (oldest first): 0 for the slot's own attempts, n for the attempts of
    its n-th retry (a retry starts at attempt 1; a backup's takeover of it follows it)."""
    count = 0
    out = []
    for run in runs:
        if run.trigger is Trigger.RETRY and run.attempt == 1:
            count += 1
        out.append(count if run.trigger is Trigger.RETRY else 0)
    return out


def _from_records(runs: Sequence[Run]) -> tuple[Fate, RunStatus | None, Run | None]:
    """The fate the records of a slot give, the outcome of one that ran, and the record that
    says why one did not run."""
    if any(not r.status.finished for r in runs):
        return Fate.RUNNING, None, None
    ran = [r for r in runs if r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED)]
    if ran:
        return Fate.RAN, ran[-1].status, None
    first = runs[0]
    fate = Fate.MISSED if first.status is RunStatus.MISSED else Fate.SKIPPED
    return fate, None, first


async def explain(
    backend: Backend,
    job: str,
    slot: datetime | int,
    *,
    definition: JobDefinition | None = None,
    view: ClusterView | None = None,
    now_ms: int | None = None,
    limit: int = HISTORY_LIMIT,
) -> SlotFate:
    """Say what became of ``job``'s slot at ``slot`` (an aware datetime or epoch ms).

    ``backend`` must be started (``start`` or ``start_reader``). The job's expression and zone
    come from ``definition``, else from the registry (``view``, else read now): the definition
    most live instances carry. ``now_ms`` defaults to the backend's clock. The slot's records
    are looked up by slot (:meth:`~anarchon.backend.Backend.slot_records`), or on a backend
    that cannot, among the job's newest ``limit`` records.

    Raises :class:`~anarchon.errors.JobNotFound` when no definition is given and no live
    instance carries the job, :class:`~anarchon.errors.InvalidOption` for a bad ``slot`` or
    ``limit``.
    """
    slot_ms = slot_ms_of(slot)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidOption(f"limit={limit!r} must be a whole number of records, at least 1")
    if now_ms is None:
        now_ms = await backend_now_ms(backend)
    variants, view = await _definitions(backend, job, definition, view, now_ms)
    if not variants:
        raise JobNotFound(
            f"job {job!r} has no definition: no live instance carries it in "
            f"{backend!r}; pass definition=JobDefinition(...) to explain it anyway"
        )
    schedules = [CronSchedule(d.expression, d.zone) for d in variants]
    matching = next((n for n, s in enumerate(schedules) if _is_slot(s, slot_ms)), None)
    used = variants[0 if matching is None else matching]
    notes = []
    if len(variants) > 1:
        notes.append(
            f"instances define {job!r} differently ({len(variants)} definitions); judged by "
            f"{used.expression!r} in {used.zone}"
        )
    runs, oldest, read, limited = await _records(backend, job, slot_ms, limit)
    base = SlotFate(
        job=job,
        slot_ms=slot_ms,
        fate=Fate.NO_RECORD,
        definition=used,
        now_ms=now_ms,
        records_read=read,
        history_limit=limit,
        oldest_record_ms=oldest,
        is_slot=matching is not None,
        notes=tuple(notes),
    )
    if runs:
        fate, outcome, why = _from_records(runs)
        attempts = tuple(Attempt.of(r, n) for r, n in zip(runs, _retry_numbers(runs), strict=True))
        return replace(
            base,
            fate=fate,
            outcome=outcome,
            reason=None if why is None else why.reason,
            skip_cause=None if why is None else why.skip_cause,
            attempts=attempts,
        )
    if matching is None:
        before, after = nearest_slots(schedules[0], slot_ms)
        return replace(base, fate=Fate.NOT_A_SLOT, previous_slot_ms=before, next_slot_ms=after)
    if slot_ms > now_ms:
        if view is None:
            _, view = await _definitions(backend, job, None, None, now_ms)
        return replace(
            base,
            fate=Fate.FUTURE,
            instances=() if view is None else view.carriers(job),
            pause=await _pause_of(backend, job, now_ms),
        )
    window = _claim_window(used)
    if window is not None and now_ms - slot_ms <= window:
        notes.append(
            f"the slot was due {span(now_ms - slot_ms)} ago, within its claim window "
            f"(jitter_ms + max_late_ms = {window} ms): an instance may still claim it"
        )
    pruned = None if oldest is None else oldest > slot_ms
    if oldest is None:
        reason = "the job has no records at all: no instance ever claimed a slot of it here"
    elif oldest > slot_ms and limited:
        reason = (
            f"the slot is older than the {limit} newest records read (the oldest from "
            f"{_iso(oldest)}); explain with a larger limit to look further"
        )
    elif oldest > slot_ms:
        reason = (
            f"the slot is older than the oldest record ({_iso(oldest)}): its record may have "
            "been pruned (history_size, history_ttl_ms)"
        )
    else:
        reason = (
            "nobody claimed it: no instance carried the job then (all were down or not yet "
            "deployed) and none recorded it missed since (an instance that starts records the "
            "newest 20 slots of the gap, those of the last max_late_ms + jitter_ms + 5 s that "
            "much later; not if it stops first)"
        )
    return replace(base, reason=reason, history_pruned=pruned, notes=tuple(notes))


async def _records(
    backend: Backend, job: str, slot_ms: int, limit: int
) -> tuple[list[Run], int | None, int, bool]:
    """The slot's records (oldest first), the earliest slot or start of the job's records, how
    many records were read, and whether the read stopped at ``limit`` (older records may
    exist): by :meth:`~anarchon.backend.Backend.slot_records`, else from the newest ``limit``
    records."""
    found = await backend.slot_records(job, slot_ms)
    if found is not None:
        return list(found.runs), found.oldest_ms, len(found.runs), False
    history = await backend.history(job, limit=limit)
    runs = [r for r in reversed(history) if r.slot_ms == slot_ms]
    oldest = min((_record_ms(r) for r in history), default=None)
    return runs, oldest, len(history), len(history) >= limit


def _record_ms(run: Run) -> int:
    """Where a record stands in time: the earlier of its slot and its start (its start for a
    manual run)."""
    started = ms_of(run.started_at)
    return started if run.slot_ms is None else min(run.slot_ms, started)


def _claim_window(definition: JobDefinition) -> int | None:
    jitter, late = definition.options.get("jitter_ms"), definition.options.get("max_late_ms")
    if isinstance(jitter, int) and isinstance(late, int):
        return jitter + late
    return None
