"""What the dashboard's pages show, read from any started backend: rows, slot strips, timelines.

Nothing here knows about HTTP or templates: each function takes a backend (and the registry's
view) and returns plain data, so the pages, the JSON endpoints and the bench share one path.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .. import _readable as readable
from .._json import run_json
from .._models import CatchUp, Run, RunStatus, SkipCause
from .._readable import DAY_MS
from .._schedule import CronSchedule
from ..backend import Backend, JobPolicy
from ..control import ALL_JOBS, Pause, active_pause
from ..errors import BackendUnavailable
from ..registry import (
    ClusterView,
    Drift,
    InstanceRecord,
    JobDefinition,
    build_view,
    latest_runs,
    read_instances,
    split_live,
)
from ..steering import backend_now_ms

__all__ = [
    "FATES",
    "LATE_CAUSES",
    "JobRow",
    "Snapshot",
    "Timeline",
    "fate_of",
    "job_rows",
    "read_snapshot",
    "schedule_in_words",
    "skip_fate",
    "timeline",
]

#: The skip causes of the fate ``late``: reached too late, passed over in a backlog (behind),
#: pruned.
LATE_CAUSES: Final = frozenset({SkipCause.TOO_LATE, SkipCause.BEHIND, SkipCause.PRUNED})
#: Each fate a slot can have, with the words the legend shows.
FATES: Final = {
    "succeeded": "succeeded",
    "failed": "failed",
    "running": "running",
    "skipped": "skipped (overlap)",
    "late": "skipped: too late or behind",
    "paused": "skipped: paused",
    "missed": "missed",
    "none": "no record",
    "unread": "older than the history read",
}
#: Slots in a job row's strip.
STRIP_SLOTS: Final = 50
#: Runs read per job for its row (a slot's attempts and manual runs share them).
ROW_RUNS: Final = 120
#: A timeline with at most this many slots shows each slot; more are grouped in buckets.
SLOT_CELLS: Final = 360
#: Buckets of a grouped timeline.
BUCKETS: Final = 240
#: Slots a timeline walks at most through the schedule (beyond: the history alone).
MAX_WALK: Final = 5_000


def fate_of(run: Run) -> str:
    """The fate of one recorded attempt, as a key of :data:`FATES`."""
    status = run.status
    if status is RunStatus.SUCCEEDED:
        return "succeeded"
    if status is RunStatus.FAILED:
        return "failed"
    if status is RunStatus.RUNNING:
        return "running"
    if status is RunStatus.MISSED:
        return "missed"
    return skip_fate(run.skip_cause)


def skip_fate(cause: SkipCause | None) -> str:
    """The fate (a key of :data:`FATES`) of a skip record with the skip cause ``cause``."""
    if cause is SkipCause.PAUSED:
        return "paused"
    return "late" if cause in LATE_CAUSES else "skipped"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The registry and the pauses, read once per request."""

    now_ms: int
    view: ClusterView
    pauses: tuple[Pause, ...]
    has_registry: bool
    has_control: bool

    def pause_of(self, job: str) -> Pause | None:
        """The pause that holds ``job``'s slots now (its own, else a whole-cluster one)."""
        return active_pause(self.pauses, job, "schedule", self.now_ms)

    @property
    def cluster_pause(self) -> Pause | None:
        """The whole-cluster pause, if one holds."""
        return next((p for p in self.pauses if p.job == ALL_JOBS), None)


class ViewCache:
    """The registry's view, kept ``ttl_ms`` so that pages loaded together (tabs, refreshes)
    share one read: instances refresh their records every few seconds anyway. Pauses are not
    cached."""

    def __init__(self, ttl_ms: int) -> None:
        """Keep a view ``ttl_ms`` (0: read the registry at every call)."""
        self.ttl_ms = ttl_ms
        self._kept: tuple[float, ClusterView] | None = None
        self._lock = asyncio.Lock()

    async def view(self, store: Any, now_ms: int) -> ClusterView:
        """The cached view, or a new read of ``store`` (a registry store) when it is older
        than ``ttl_ms``."""
        async with self._lock:
            kept = self._kept
            if kept is not None and time.monotonic() - kept[0] < self.ttl_ms / 1000:
                return kept[1]
            view = fast_view(await read_instances(store, now_ms), now_ms)
            if self.ttl_ms:
                self._kept = (time.monotonic(), view)
            return view


async def read_snapshot(backend: Backend, cache: ViewCache | None = None) -> Snapshot:
    """Read the registry (through ``cache`` if given) and the pauses of a started backend."""
    now = await backend_now_ms(backend)
    store = backend.registry()
    if store is None:
        view = fast_view([], now)
    elif cache is not None:
        view = await cache.view(store, now)
    else:
        view = fast_view(await read_instances(store, now), now)
    control = backend.control()
    pauses: list[Pause] = [] if control is None else await control.pauses()
    return Snapshot(
        now_ms=now,
        view=view,
        pauses=tuple(p for p in pauses if p.active(now)),
        has_registry=store is not None,
        has_control=control is not None,
    )


def _key(job: JobDefinition) -> tuple[str, str, str]:
    """A cheap stand-in for :attr:`JobDefinition.fingerprint`: equal keys mean equal
    fingerprints; unequal keys (options stored in another order) are settled by ``build_view``."""
    return (" ".join(job.expression.split()), job.zone, repr(job.options))


def fast_view(instances: Sequence[InstanceRecord], now_ms: int) -> ClusterView:
    """:func:`anarchon.registry.build_view`, quick with thousands of jobs: definitions are
    compared as tuples, and only the jobs that drift go through ``build_view`` itself. Records
    that are not live (:func:`anarchon.registry.is_live`) go to the view's ``silent``."""
    ordered, silent = split_live(instances, now_ms)
    seen: dict[str, dict[tuple[Any, ...], JobDefinition]] = {}
    for instance in ordered:
        for job in instance.jobs:
            variants = seen.get(job.name)
            if variants is None:
                seen[job.name] = {_key(job): job}
            else:
                variants.setdefault(_key(job), job)
    drifting = {name for name, variants in seen.items() if len(variants) > 1}
    definitions: dict[str, tuple[JobDefinition, ...]] = {
        name: (next(iter(variants.values())),)
        for name, variants in sorted(seen.items())
        if name not in drifting
    }
    drift: tuple[Drift, ...] = ()
    if drifting:
        reduced = [replace(i, jobs=tuple(j for j in i.jobs if j.name in drifting)) for i in ordered]
        exact = build_view(reduced, now_ms)
        definitions.update(exact.definitions)
        definitions = dict(sorted(definitions.items()))
        drift = exact.drift
    return ClusterView(
        now_ms=now_ms, instances=ordered, definitions=definitions, drift=drift, silent=silent
    )


_WEEKDAYS: Final = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_MACROS: Final = {
    "@yearly": "every year on January 1 at 00:00",
    "@annually": "every year on January 1 at 00:00",
    "@monthly": "on day 1 of every month at 00:00",
    "@weekly": "every Sunday at 00:00",
    "@daily": "every day at 00:00",
    "@midnight": "every day at 00:00",
    "@hourly": "every hour at :00",
}
_NUM: Final = re.compile(r"^\d{1,2}$")
_STEP: Final = re.compile(r"^\*/(\d{1,2})$")


def _every(field_: str, unit: str) -> str | None:
    """``every <unit>`` for the cron field ``*``, ``every N <unit>s`` for ``*/N``; None for
    any other field."""
    if field_ == "*":
        return f"every {unit}"
    step = _STEP.match(field_)
    return f"every {step.group(1)} {unit}s" if step else None


def schedule_in_words(expression: str) -> str | None:
    """A few words for the common cron shapes (``every 5 minutes``, ``every day at 03:00``);
    None when the expression says it better itself."""
    text = " ".join(expression.split()).lower()
    if text in _MACROS:
        return _MACROS[text]
    parts = text.split(" ")
    if len(parts) == 6:
        sec, rest = parts[0], parts[1:]
        if rest == ["*"] * 5:
            return _every(sec, "second")
        if _NUM.match(sec) and _words5(rest) is not None:
            inner = _words5(rest)
            if inner == "every minute":
                return f"every minute at :{int(sec):02d}"
        return None
    if len(parts) != 5:
        return None
    return _words5(parts)


def _words5(parts: Sequence[str]) -> str | None:
    """:func:`schedule_in_words` of the five fields ``parts`` (minute, hour, day, month,
    weekday); None when they are not one of the common shapes."""
    minute, hour, day, month, weekday = parts
    if [hour, day, month, weekday] == ["*"] * 4:
        if _NUM.match(minute):
            return f"every hour at :{int(minute):02d}"
        return _every(minute, "minute")
    if not (_NUM.match(minute) and month == "*"):
        return None
    if hour == "*" or _STEP.match(hour):
        if day == "*" and weekday == "*":
            every = _every(hour, "hour")
            return f"{every} at :{int(minute):02d}" if every else None
        return None
    if not _NUM.match(hour):
        return None
    at = f"at {int(hour):02d}:{int(minute):02d}"
    if day == "*" and weekday == "*":
        return f"every day {at}"
    if day == "*" and weekday in ("1-5", "mon-fri"):
        return f"every weekday {at}"
    if day == "*" and _NUM.match(weekday) and int(weekday) <= 7:
        return f"every {_WEEKDAYS[int(weekday) % 7]} {at}"
    if weekday == "*" and _NUM.match(day):
        return f"on day {int(day)} of every month {at}"
    return None


def recent_slots(schedule: CronSchedule, now_ms: int, count: int) -> list[int]:
    """The last ``count`` slots of ``schedule`` at or before ``now_ms``, oldest first (fewer when
    the schedule has fewer within about a year)."""
    first = schedule.next_slot(now_ms)
    period = max(schedule.next_slot(first) - first, 1_000)
    window = period * count + period // 2  # one walk for a regular schedule
    while True:
        found = schedule.slots(now_ms - window, now_ms)
        if len(found) >= count or window >= 400 * DAY_MS:
            return found[-count:]
        window *= 4


@dataclass(frozen=True, slots=True)
class Cell:
    """One slot of a strip or of a fine timeline."""

    slot_ms: int
    fate: str
    run: Run | None = None
    attempts: int = 0


@dataclass(slots=True)
class JobRow:
    """One job as its row on the jobs page shows it."""

    name: str
    definition: JobDefinition
    words: str | None
    instances: tuple[str, ...]
    next_slot_ms: int | None
    last_run: Run | None
    running: tuple[Run, ...]
    pause: Pause | None
    drift: Drift | None
    strip: list[Cell] = field(default_factory=list)
    error: str | None = None


def _schedule(definition: JobDefinition) -> CronSchedule | None:
    """The schedule of ``definition``; None when this version cannot read its expression or
    zone."""
    try:
        return CronSchedule(definition.expression, definition.zone)
    except (ValueError, LookupError):  # a definition this version cannot read
        return None


def _by_slot(runs: Iterable[Run]) -> dict[int, list[Run]]:
    """Runs grouped by slot, each slot's newest attempt first (history order)."""
    out: dict[int, list[Run]] = {}
    for run in runs:
        slot = run.slot_ms
        if slot is not None:
            out.setdefault(slot, []).append(run)
    return out


def strip_of(
    schedule: CronSchedule,
    runs: Sequence[Run],
    now_ms: int,
    walked: dict[tuple[str, str], list[int]] | None = None,
) -> list[Cell]:
    """The last :data:`STRIP_SLOTS` slots of ``schedule``, each with its newest attempt's fate;
    slots older than the oldest run read are ``unread``, others without a record ``none``.
    ``walked`` remembers the slots of schedules already walked (same ``now_ms``)."""
    memo = {} if walked is None else walked
    key = (schedule.expression, schedule.timezone)
    slots = memo.get(key)
    if slots is None:
        slots = memo[key] = recent_slots(schedule, now_ms, STRIP_SLOTS)
    grouped = _by_slot(runs)
    oldest = min(grouped) if grouped and len(runs) >= ROW_RUNS else None
    cells = []
    for slot in slots:
        attempts = grouped.get(slot)
        if attempts:
            cells.append(Cell(slot, fate_of(attempts[0]), attempts[0], len(attempts)))
        else:
            fate = "unread" if oldest is not None and slot < oldest else "none"
            cells.append(Cell(slot, fate))
    return cells


def _matches(name: str, query: str) -> bool:
    """True if ``query`` (lower case) occurs in ``name``, whatever its case."""
    return query in name.lower()


def select_jobs(snapshot: Snapshot, query: str = "") -> list[str]:
    """The names of the jobs the registry knows, sorted, filtered by ``query`` (a substring,
    case-insensitive)."""
    needle = query.strip().lower()
    names = snapshot.view.definitions.keys()
    return sorted(n for n in names if not needle or _matches(n, needle))


async def _row_histories(backend: Backend, names: Sequence[str]) -> list[list[Run] | BaseException]:
    """The recent history of each of ``names``, in one
    :meth:`~anarchon.backend.Backend.histories` call; each row's own error instead of its runs
    when the call fails (an outage: every row shows it; any other error: each job's history is
    read on its own, so one job the backend refuses does not blank the others)."""
    try:
        found = await backend.histories(names, ROW_RUNS)
    except BackendUnavailable as exc:
        return [exc for _ in names]
    except Exception:  # shown per row below, as each read on its own raises it
        return await asyncio.gather(
            *(backend.history(name, ROW_RUNS) for name in names), return_exceptions=True
        )
    return [found.get(name, []) for name in names]


async def job_rows(backend: Backend, snapshot: Snapshot, names: Sequence[str]) -> list[JobRow]:
    """The rows of ``names`` (jobs of ``snapshot``): their recent history read in one call."""
    view = snapshot.view
    drifts = {d.job: d for d in view.drift}
    carriers: dict[str, list[str]] = {}
    for instance in view.instances:
        for job in instance.jobs:
            carriers.setdefault(job.name, []).append(instance.id)
    histories = await _row_histories(backend, names)
    rows = []
    walked: dict[tuple[str, str], list[int]] = {}  # jobs that share a schedule walk it once
    for name, history in zip(names, histories, strict=True):
        definition = view.definitions[name][0]
        schedule = _schedule(definition)
        runs: list[Run] = [] if isinstance(history, BaseException) else history
        now = snapshot.now_ms
        last, running = latest_runs(runs)
        row = JobRow(
            name=name,
            definition=definition,
            words=schedule_in_words(definition.expression),
            instances=tuple(carriers.get(name, ())),
            next_slot_ms=None if schedule is None else schedule.next_slot(now),
            last_run=last,
            running=running,
            pause=snapshot.pause_of(name),
            drift=drifts.get(name),
            strip=[] if schedule is None else strip_of(schedule, runs, now, walked),
        )
        if isinstance(history, BaseException):
            row.error = f"{type(history).__name__}: {history}"
        rows.append(row)
    return rows


@dataclass(frozen=True, slots=True)
class Bucket:
    """A stretch of a grouped timeline: how many of its slots had each fate."""

    start_ms: int
    end_ms: int
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """Slots in the bucket (known to the schedule or recorded)."""
        return sum(self.counts.values())

    @property
    def fate(self) -> str:
        """The worst fate in the bucket (what its colour shows)."""
        for fate in ("failed", "missed", "running", "late", "paused", "skipped", "none"):
            if self.counts.get(fate):
                return fate
        if self.counts.get("succeeded"):
            return "succeeded"
        return "unread" if self.counts.get("unread") else "empty"


@dataclass(frozen=True, slots=True)
class Timeline:
    """A job's slots between ``start_ms`` and ``end_ms``: each slot (``cells``) when few, else
    ``buckets``; ``read_from_ms`` is where the history read ends (older slots: ``unread``)."""

    start_ms: int
    end_ms: int
    cells: list[Cell]
    buckets: list[Bucket]
    slots: int
    """Slots in the range, as far as the schedule was walked (``capped`` when it stopped)."""
    capped: bool
    walked_from_ms: int
    """Slots before this were not walked: only their records are placed (gaps not found)."""
    runs_read: int
    read_from_ms: int | None
    counts: dict[str, int]


def timeline(
    definition: JobDefinition,
    runs: Sequence[Run],
    start_ms: int,
    end_ms: int,
    now_ms: int,
    *,
    complete: bool,
) -> Timeline:
    """Place ``runs`` (history, newest first) on the slots of ``definition`` in
    ``[start_ms, end_ms)``. ``complete``: the runs are the whole history (else slots older than
    the oldest run read are ``unread``). The schedule is walked back from the newer end for at
    most :data:`MAX_WALK` slots to find the slots with no record; before that, only the records
    are placed, so a year of a per-minute job costs what a few days do."""
    schedule = _schedule(definition)
    grouped = _by_slot(runs)
    read_from = None if complete or not grouped else min(grouped)
    known_from = start_ms if read_from is None else max(start_ms, read_from)
    end = min(end_ms, now_ms + 1)
    expected: list[int] = []
    walked_from = known_from
    if schedule is not None and known_from < end:
        expected = _walk_back(schedule, known_from, end)
        if len(expected) >= MAX_WALK:
            walked_from = expected[0]
    recorded = {s: a for s, a in grouped.items() if known_from <= s < end_ms}
    slots = sorted(set(expected) | set(recorded))
    counts: dict[str, int] = {}
    cells = []
    for slot in slots:
        attempts = recorded.get(slot)
        cell = Cell(slot, "none")
        if attempts:
            cell = Cell(slot, fate_of(attempts[0]), attempts[0], len(attempts))
        counts[cell.fate] = counts.get(cell.fate, 0) + 1
        cells.append(cell)
    fine = len(cells) <= SLOT_CELLS and walked_from <= start_ms
    return Timeline(
        start_ms=start_ms,
        end_ms=end_ms,
        cells=cells if fine else [],
        buckets=[] if fine else _buckets(cells, start_ms, end_ms, known_from),
        slots=len(slots),
        capped=walked_from > known_from,
        walked_from_ms=walked_from,
        runs_read=len(runs),
        read_from_ms=known_from if known_from > start_ms else None,
        counts=counts,
    )


def _walk_back(schedule: CronSchedule, start_ms: int, end_ms: int) -> list[int]:
    """Slots in ``[start_ms, end_ms)``, the newest :data:`MAX_WALK` of them at most."""
    window = 60_000 if schedule.seconds_field else 3_600_000
    found: list[int] = []
    hi = end_ms
    while hi > start_ms and len(found) < MAX_WALK:
        lo = max(start_ms, hi - window)
        part = [s for s in schedule.slots(lo - 1, hi - 1) if lo <= s < hi]
        found = part + found
        hi = lo
        window *= 2
    return found[-MAX_WALK:]


def _buckets(cells: Sequence[Cell], start_ms: int, end_ms: int, known_from: int) -> list[Bucket]:
    """``[start_ms, end_ms)`` cut into at most :data:`BUCKETS` stretches of one width (the last
    may be shorter), each counting its ``cells`` by fate, and one ``unread`` more when it starts
    before ``known_from`` (where the history read begins)."""
    width = max(1, -(-(end_ms - start_ms) // BUCKETS))
    buckets = [
        Bucket(start_ms + i * width, min(end_ms, start_ms + (i + 1) * width), {})
        for i in range(BUCKETS)
        if start_ms + i * width < end_ms
    ]
    for cell in cells:
        index = (cell.slot_ms - start_ms) // width
        if 0 <= index < len(buckets):
            counts = buckets[index].counts
            counts[cell.fate] = counts.get(cell.fate, 0) + 1
    for bucket in buckets:
        if bucket.start_ms < known_from:
            bucket.counts["unread"] = bucket.counts.get("unread", 0) + 1
    return buckets


def clock_threshold_ms(backend: Backend, jobs: Iterable[JobDefinition]) -> int:
    """The clock offset above which the core warns for an instance carrying ``jobs``: a tenth
    of the tightest skew budget, 5 s at most (docs/clocks.md)."""
    budgets = []
    for job in jobs:
        policy = _policy(job)
        if policy is not None and (budget := backend.skew_budget_ms(policy)):
            budgets.append(budget)
    return max(min([5_000, *(b // 10 for b in budgets)]), 250)


def _policy(job: JobDefinition) -> JobPolicy | None:
    """The :class:`~anarchon.backend.JobPolicy` of ``job``'s recorded options; None when they
    do not make one (an option this version cannot read)."""
    from .._models import Overlap

    o = job.options
    ttl = o.get("history_ttl_ms")
    try:
        return JobPolicy(
            name=job.name,
            jitter_ms=int(o.get("jitter_ms") or 0),
            max_late_ms=int(o.get("max_late_ms") or 0),
            lease_ms=int(o.get("lease_ms") or 0),
            max_attempts=int(o.get("max_attempts") or 1),
            overlap=Overlap(str(o.get("overlap") or "skip")),
            catch_up=CatchUp(str(o.get("catch_up") or "none")),
            catch_up_window_ms=int(o.get("catch_up_window_ms") or 0),
            handover=bool(o.get("handover")),
            history_ttl_ms=None if ttl is None else int(ttl),
        )
    except (ValueError, TypeError):
        return None


def span(ms: float | None) -> str:
    """A duration as a person reads it at a glance: ``850 ms``, ``4.2 s``, ``3 min``, ``5.0 h``,
    ``2 d``; ``-`` for None."""
    return "-" if ms is None else readable.span(ms, readable.SPACED)


def run_dict(run: Run) -> dict[str, Any]:
    """A run as the JSON endpoints give it: :func:`anarchon._json.run_json` (as ``anarchon
    history --json``) and its ``fate`` (a key of :data:`FATES`)."""
    return {**run_json(run), "fate": fate_of(run)}
