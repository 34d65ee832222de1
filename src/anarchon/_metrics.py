"""The scheduler's counters, each named once; per-job figures and histograms; and the snapshot
:meth:`Scheduler.metrics` returns (which :mod:`anarchon.prometheus` exports).

The core's modules count through :class:`Counters`, on the event loop (the only writer): a flat
counter is a field (``counters.claims_won += 1``); an event with a job calls one method
(:meth:`Counters.count`, :meth:`Counters.claim_answered`, :meth:`Counters.count_run` ...), which
counts both the flat counter and the job's. A scrape reads from another thread: the snapshot
copies each container in one step (a ``list()`` or ``dict()`` of a builtin holds the GIL), so
it never sees a container change size under it.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeAlias, get_args

from ._members import SCHEDULE, WON
from ._models import RunStatus, SkipCause, Trigger
from ._schedule import CronSchedule
from .backend import ClaimStatus

if TYPE_CHECKING:
    from ._job import Job
    from .backend import ClaimOutcome, Ticket

__all__ = [
    "DURATION_BUCKETS",
    "LAG_BUCKETS",
    "SLOT_OUTCOMES",
    "SLOT_TRIGGERS",
    "Counters",
    "Histogram",
    "JobMetrics",
    "Metrics",
]

LAG_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (s) of the claim latency and fire lag histograms: 1 ms to 10 s."""
DURATION_BUCKETS: Final = (
    0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0,
)  # fmt: skip
"""Upper bounds (s) of the handler duration histogram: 10 ms to 4 hours."""

SLOT_OUTCOMES: Final[Mapping[str, tuple[str, str]]] = {
    "ran": ("ran", ""),
    "missed": ("missed", ""),
    "skipped_overlap": ("skipped", "overlap"),
    "skipped_too_late": ("skipped", "too_late"),
    "skipped_behind": ("skipped", "behind"),
    "skipped_paused": ("skipped", "paused"),
    "skipped_other": ("skipped", "other"),
    "unclaimed_error": ("unclaimed", "error"),
    "unclaimed_refused": ("unclaimed", "refused"),
}
"""The keys of :attr:`JobMetrics.slots`, each to its ``(outcome, reason)`` labels."""
# The causes of a LOST answer whose record was not stored because the backend cannot vouch for
# the slot (pruned past it; Redis: a data set that lost it): nobody runs it. A broker's LOST
# answer with no cause (another's claim it could not read) is a real loss.
_NOT_RUN: Final = frozenset({SkipCause.PRUNED, SkipCause.UNKNOWN})
# The cause of a broker's SKIPPED answer that stored nothing (NATS: a claim whose turn to be sent
# came after max_late_ms, a skip too close to the end of the duplicate window): no record.
_NOT_RECORDED: Final = SkipCause.NOT_RECORDED
# The causes of the skip records the backends store, to their class (others: skipped_other).
_SKIP_CLASSES: Final[Mapping[SkipCause | None, str]] = {
    SkipCause.OVERLAP: "skipped_overlap",
    SkipCause.TOO_LATE: "skipped_too_late",
    SkipCause.BEHIND: "skipped_behind",
    SkipCause.PAUSED: "skipped_paused",
}
SLOT_TRIGGERS: Final = frozenset({Trigger.SCHEDULE, Trigger.CATCH_UP})
"""The triggers of a slot's claims (a run request, manual or retry, is no slot)."""
RUN_STATUSES: Final = (RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.SKIPPED.value)
"""The keys of :attr:`JobMetrics.runs`: a run's result, or ``skipped`` (a run request's)."""
JobCounter = Literal["taken_over", "handed_over", "lease_lost", "result_refused"]
"""The flat counters that are also counted per job (:meth:`Counters.count`)."""


@dataclass(slots=True)
class Histogram:
    """Observations (seconds) counted in buckets: ``bounds`` are the upper bounds (a value equal
    to a bound falls in its bucket), with one more bucket for what is above the last.

    :ivar bounds: the upper bounds, ascending (+Inf is implied).
    :ivar counts: observations per bucket (not cumulative), ``len(bounds) + 1`` of them.
    :ivar sum: the sum of every observation (s).
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        """How many observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, +Inf last (Prometheus's
        ``le`` buckets)."""
        total, out = 0, []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def copy(self) -> Histogram:
        """A copy that does not follow this histogram (safe from any thread)."""
        return Histogram(self.bounds, list(self.counts), self.sum)


@dataclass(slots=True, kw_only=True)
class JobMetrics:
    """One job's figures on this instance: counters since the scheduler started, gauges as of
    the snapshot. Every key is there from the start, at zero.

    :ivar slots: slots by outcome (:data:`SLOT_OUTCOMES`): ``ran`` (scheduled or caught-up slots
        this instance won and started), ``missed`` (recorded missed when this instance started),
        and skipped slots whose skip record this instance wrote, by reason class:
        ``skipped_overlap``, ``skipped_too_late``, ``skipped_behind`` (passed over in a backlog:
        the instance fell behind, see ``catch_up``), ``skipped_paused``, ``skipped_other``. Added
        over every instance, each equals what history records. And slots this instance could
        not claim, of which history records nothing (nobody runs them, unless another instance
        claimed them): ``unclaimed_error`` (the backend stayed unavailable until they were too
        late), ``unclaimed_refused`` (the backend refused the claim and recorded nothing);
        every instance that met it counts such a slot.
    :ivar runs: attempts whose end this instance's write recorded, by status: ``succeeded``,
        ``failed`` (its own results, and the attempts its takeovers recorded failed: handed
        over, lease lost, out of attempts); ``skipped``: run requests (manual, retry) whose
        skip record its claim wrote. Added over every instance, each equals what history
        records.
    :ivar taken_over: runs of dead instances this instance took over.
    :ivar handed_over: runs this instance released on stop for a backup.
    :ivar lease_lost: runs of this instance whose lease was lost.
    :ivar result_refused: results refused because the lease had moved on.
    :ivar fire_lag: from a scheduled slot's time to its handler's start, first attempts only
        (jitter included), on this host's wall clock.
    :ivar handler_duration: how long handlers ran (every attempt, cancelled ones too).
    :ivar last_success_ms: when this instance last recorded a success of the job (epoch ms),
        None if it has not.
    :ivar running: runs of the job in progress on this instance (snapshot only).
    :ivar next_slot_ms: the job's next slot after now (snapshot only; None if it has none).
    :ivar interval_ms: the gap between the next slot and the one after it (snapshot only;
        None if there is no second slot).
    :ivar since_success_ms: how long ago this instance last recorded a success of the job, or
        started if it has recorded none (snapshot only; None before the scheduler started).
    """

    slots: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SLOT_OUTCOMES, 0))
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RUN_STATUSES, 0))
    taken_over: int = 0
    handed_over: int = 0
    lease_lost: int = 0
    result_refused: int = 0
    fire_lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    handler_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    last_success_ms: int | None = None
    running: int = 0
    next_slot_ms: int | None = None
    interval_ms: int | None = None
    since_success_ms: int | None = None

    def copy(self, **gauges: Any) -> JobMetrics:
        """A copy that does not follow these figures, with the given gauges."""
        return JobMetrics(
            slots=dict(self.slots),
            runs=dict(self.runs),
            taken_over=self.taken_over,
            handed_over=self.handed_over,
            lease_lost=self.lease_lost,
            result_refused=self.result_refused,
            fire_lag=self.fire_lag.copy(),
            handler_duration=self.handler_duration.copy(),
            last_success_ms=self.last_success_ms,
            **gauges,
        )


# The live per-job figures: one array of doubles per job, laid out as below, instead of a
# JobMetrics with two Histograms and their two lists: one object for the garbage collector,
# holding no references, where a burst of 10 000 jobs' first runs made five per job (that every
# later full collection walked) and took 5 us per job to make them. A snapshot turns each array
# into a JobMetrics (:func:`_job_metrics`). Counts in doubles are exact up to 2**53.
_SLOTS_AT: Final = {key: n for n, key in enumerate(SLOT_OUTCOMES)}
_RAN: Final = list(SLOT_OUTCOMES).index("ran")
_RUNS_AT: Final = {status: len(_SLOTS_AT) + n for n, status in enumerate(RUN_STATUSES)}
_COUNTER_AT: Final = {
    name: len(_SLOTS_AT) + len(_RUNS_AT) + n for n, name in enumerate(get_args(JobCounter))
}
_LAST_SUCCESS: Final = len(_SLOTS_AT) + len(_RUNS_AT) + len(_COUNTER_AT)  # NaN: none yet
_LAG: Final = _LAST_SUCCESS + 1  # len(LAG_BUCKETS) + 1 bucket counts, then their sum
_DURATION: Final = _LAG + len(LAG_BUCKETS) + 2  # the same for DURATION_BUCKETS
_WIDTH: Final = _DURATION + len(DURATION_BUCKETS) + 2
_ZERO: Final = array("d", [0.0] * _WIDTH)
_ZERO[_LAST_SUCCESS] = math.nan


def _observe(figures: array[float], at: int, bounds: tuple[float, ...], seconds: float) -> None:
    """Count ``seconds`` in the histogram laid out from ``at`` in ``figures``."""
    figures[at + bisect.bisect_left(bounds, seconds)] += 1
    figures[at + len(bounds) + 1] += seconds


def _histogram(figures: array[float], at: int, bounds: tuple[float, ...]) -> Histogram:
    end = at + len(bounds) + 1
    return Histogram(bounds, [int(n) for n in figures[at:end]], figures[end])


def _job_metrics(live: array[float] | None, **gauges: Any) -> JobMetrics:
    """The :class:`JobMetrics` of a job's live figures (None: nothing counted yet), with the
    given gauges. Reads a copy made in one step: safe from any thread."""
    figures = _ZERO if live is None else live[:]
    last = figures[_LAST_SUCCESS]
    return JobMetrics(
        slots={key: int(figures[n]) for key, n in _SLOTS_AT.items()},
        runs={status: int(figures[n]) for status, n in _RUNS_AT.items()},
        taken_over=int(figures[_COUNTER_AT["taken_over"]]),
        handed_over=int(figures[_COUNTER_AT["handed_over"]]),
        lease_lost=int(figures[_COUNTER_AT["lease_lost"]]),
        result_refused=int(figures[_COUNTER_AT["result_refused"]]),
        fire_lag=_histogram(figures, _LAG, LAG_BUCKETS),
        handler_duration=_histogram(figures, _DURATION, DURATION_BUCKETS),
        last_success_ms=None if math.isnan(last) else int(last),
        **gauges,
    )


class JobRow(NamedTuple):
    """One job's figures as a scrape reads them, before any :class:`JobMetrics` is made: its
    live figures (a copy laid out as ``_ZERO``) and its gauges."""

    name: str
    figures: array[float]
    running: int
    next_slot_ms: int | None
    interval_ms: int | None
    since_success_ms: int | None


NextSlots: TypeAlias = dict[CronSchedule, tuple[int, int | None, int | None]]
"""What :func:`job_rows` remembers of each schedule's walk: ``(from_ms, next_ms, after_ms)``,
the next two slots after ``from_ms``, which hold for any time from ``from_ms`` up to
``next_ms`` (the schedules of 10 000 jobs are walked once a slot, not once a scrape)."""


def _following(
    schedule: CronSchedule, now_ms: int, memo: NextSlots
) -> tuple[int | None, int | None]:
    """The next slot after ``now_ms`` and the one after it (None where there is none)."""
    known = memo.get(schedule)
    if known is not None:
        since, first, second = known
        if since <= now_ms and (first is None or now_ms < first):
            return first, second
    walk = schedule._walk(now_ms)
    following = [s * 1000 for s in itertools.islice(walk, 2)]
    first = following[0] if following else None
    second = following[1] if len(following) == 2 else None
    memo[schedule] = (now_ms, first, second)
    return first, second


def job_rows(
    counters: Counters,
    jobs: Iterable[Job],
    running: Iterable[str],
    now_ms: int,
    started_ms: int | None,
    memo: NextSlots | None = None,
) -> list[JobRow]:
    """One :class:`JobRow` per registered job (at zero if nothing happened to it yet), with
    its runs in progress (``running``: the job name of each), its next slots after ``now_ms``
    (``memo`` keeps them between calls) and the time since its last success (or since
    ``started_ms``). Safe from any thread: reads only copies, and walks schedules on iterators
    of its own."""
    counted = dict(counters.by_job)
    in_progress = collections.Counter(running)
    memo = {} if memo is None else memo
    out: list[JobRow] = []
    for job in jobs:
        live = counted.get(job.name)
        figures = _ZERO if live is None else live[:]
        first, second = _following(job.schedule, now_ms, memo)
        last = figures[_LAST_SUCCESS]
        since = started_ms if math.isnan(last) or not last else int(last)
        out.append(
            JobRow(
                job.name,
                figures,
                in_progress[job.name],
                first,
                None if first is None or second is None else second - first,
                None if since is None else max(0, now_ms - since),
            )
        )
    return out


def refused(outcome: ClaimOutcome) -> bool:
    """The claim was refused and nothing recorded, so nobody runs the slot: refused for good
    (:attr:`ClaimOutcome.error`), or a slot the backend cannot vouch for (skip cause
    ``PRUNED``, ``UNKNOWN``). Such an answer is LOST, but no other instance won."""
    if outcome.status is not ClaimStatus.LOST:
        return False
    if outcome.error is not None:
        return True
    run = outcome.run
    return run.status is RunStatus.SKIPPED and run.skip_cause in _NOT_RUN


def unrecorded(outcome: ClaimOutcome) -> bool:
    """The claim was answered skipped, but the backend stored no record of it (skip cause
    ``NOT_RECORDED``): nobody runs the slot, and history holds nothing of it
    (``unclaimed``)."""
    return outcome.status is ClaimStatus.SKIPPED and outcome.run.skip_cause is _NOT_RECORDED


def jobs_now(rows: Iterable[JobRow]) -> dict[str, JobMetrics]:
    """The per-job figures of a snapshot: one :class:`JobMetrics` per row of
    :func:`job_rows`."""
    return {
        row.name: _job_metrics(
            row.figures,
            running=row.running,
            next_slot_ms=row.next_slot_ms,
            interval_ms=row.interval_ms,
            since_success_ms=row.since_success_ms,
        )
        for row in rows
    }


def skip_class(cause: SkipCause | None) -> str:
    """The :data:`SLOT_OUTCOMES` key of a skip record's :attr:`~anarchon.Run.skip_cause`."""
    return _SKIP_CLASSES.get(cause, "skipped_other")


@dataclass(slots=True)
class _Tallies:
    """The flat counters, each named once: what :class:`Counters` counts and :class:`Metrics`
    reports (each field is described there)."""

    claims_won: int = 0
    claims_lost: int = 0
    claims_refused: int = 0
    claim_errors: int = 0
    claims_preferred: int = 0
    claims_backup: int = 0
    claims_unranked: int = 0
    claims_heard: int = 0
    skipped: int = 0
    too_late: int = 0
    behind: int = 0
    no_thread: int = 0
    early_slots_deferred: int = 0
    runs_succeeded: int = 0
    runs_failed: int = 0
    timed_out_threads: int = 0
    lease_lost: int = 0
    result_refused: int = 0
    result_errors: int = 0
    handed_over: int = 0
    cancel_ignored: int = 0
    taken_over: int = 0
    clock_steps: int = 0
    clock_skew_warnings: int = 0
    slots_missed: int = 0
    slots_paused: int = 0
    slots_unclaimed: int = 0
    retries_scheduled: int = 0
    requests_run: int = 0
    failure_hook_errors: int = 0


@dataclass(slots=True)
class Counters(_Tallies):
    """What happened since the scheduler started: each counter named once (:class:`_Tallies`);
    shared by the core's modules, which increment its fields (the event loop is the only
    writer). Every field is described in :class:`Metrics`, the read-only snapshot that adds the
    gauges. ``by_job`` holds each job's live figures as one array (see ``_ZERO``), which
    :meth:`Metrics.of` and :func:`jobs_now` turn into :class:`JobMetrics`; ``fire_lag`` and
    ``handler_duration`` count every job's observations together."""

    by_job: dict[str, array[float]] = field(default_factory=dict)
    claim_latency: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    fire_lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    handler_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    pending_requests: dict[tuple[str, str], int] | None = None
    """The run requests stored and not claimed yet, by (job, kind), as the request poller last
    read them, with 0 for each pair seen pending before (replaced whole at each read; None
    before one, or when it failed)."""

    def job(self, name: str) -> array[float]:
        """The live figures of job ``name``, made at zero on first use (event loop only)."""
        figures = self.by_job.get(name)
        if figures is None:
            figures = self.by_job[name] = _ZERO[:]
        return figures

    def count(self, job: str, name: JobCounter) -> None:
        """Count one event that has a flat counter and a per-job one."""
        setattr(self, name, getattr(self, name) + 1)
        self.job(job)[_COUNTER_AT[name]] += 1

    def count_run(self, status: RunStatus, job: str | None = None, now_ms: int = 0) -> None:
        """Count a run whose result was recorded (``succeeded`` or ``failed``); with ``job``,
        count it for the job too (``now_ms``: when, for a success)."""
        if status is RunStatus.SUCCEEDED:
            self.runs_succeeded += 1
        else:
            self.runs_failed += 1
        if job is not None:
            figures = self.job(job)
            figures[_RUNS_AT[status.value]] += 1
            if status is RunStatus.SUCCEEDED:
                figures[_LAST_SUCCESS] = now_ms

    def claim_answered(self, outcome: ClaimOutcome, instance: str) -> None:
        """Count what a claim's answer recorded: a slot won (``ran``), or a skip record when it
        is this instance's, the one whose claim wrote it (each is then counted once over every
        instance, as history holds it once): a slot's by reason class (with ``skipped`` and,
        paused, ``slots_paused``), a run request's (manual, retry) as a run ``skipped``. A skip
        the backend answered but did not store (:func:`unrecorded`) is no record: not counted."""
        run = outcome.run
        status = outcome.status
        if status is WON:
            if run.trigger in SLOT_TRIGGERS:
                self.job(run.job)[_RAN] += 1
            return
        if status is not ClaimStatus.SKIPPED or run.instance != instance or unrecorded(outcome):
            return
        self.skipped += 1
        if run.trigger in SLOT_TRIGGERS:
            key = skip_class(run.skip_cause)
            if key == "skipped_paused":
                self.slots_paused += 1
            elif key == "skipped_behind":
                self.behind += 1
            self.job(run.job)[_SLOTS_AT[key]] += 1
        else:
            self.job(run.job)[_RUNS_AT[RunStatus.SKIPPED.value]] += 1

    def unclaimed(self, job: str, trigger: Trigger, key: str) -> None:
        """Count a slot of ``job`` this instance could not claim (``key``: ``unclaimed_error``,
        ``unclaimed_refused``); a run request (manual, retry) is no slot and is not counted."""
        if trigger in SLOT_TRIGGERS:
            self.slots_unclaimed += 1
            self.job(job)[_SLOTS_AT[key]] += 1

    def missed(self, job: str, count: int) -> None:
        """Count ``count`` slots of ``job`` this instance recorded missed."""
        self.slots_missed += count
        self.job(job)[_SLOTS_AT["missed"]] += count

    def claimed(self, latency_ms: int) -> None:
        """Observe one answered claim call's latency."""
        self.claim_latency.observe(latency_ms / 1000)

    def handler_started(self, ticket: Ticket, now_ms: int) -> None:
        """A handler starts at ``now_ms`` (wall clock): observe the fire lag of a first attempt
        at a scheduled slot."""
        if ticket.trigger is SCHEDULE and ticket.attempt == 1 and ticket.slot is not None:
            lag = max(0, now_ms - ticket.slot) / 1000
            _observe(self.job(ticket.job), _LAG, LAG_BUCKETS, lag)
            self.fire_lag.observe(lag)

    def handler_ended(self, job: str, took_ms: int) -> None:
        """A handler of ``job`` ran ``took_ms``."""
        took = max(0, took_ms) / 1000
        _observe(self.job(job), _DURATION, DURATION_BUCKETS, took)
        self.handler_duration.observe(took)


@dataclass(slots=True, kw_only=True, init=False)
class Metrics(_Tallies, Mapping[str, "int | None"]):
    """A snapshot of a scheduler's counters (since it started) and gauges (now).

    Read it as attributes (``m.claims_won``) or by name like a mapping (``m["claims_won"]``,
    ``m.get("claims_won")``); :meth:`as_dict` gives a plain dict (for JSON). Every counter is
    present from the start, at zero. The mapping holds the numbers; the per-job figures
    (:attr:`by_job`) and the claim latency histogram are attributes only.

    Counters (since start):

    :ivar claims_won: slots (and manual runs) this instance won and ran.
    :ivar claims_lost: slots another instance won (or was running); a claim refused with
        nothing recorded is no loss (``slots_unclaimed``).
    :ivar claims_refused: claims the backend refused for good (a value it cannot store); nobody
        runs those slots (also in ``slots_unclaimed``).
    :ivar claim_errors: claim calls that failed on an unavailable backend (each retried until the
        slot is too late).
    :ivar claims_preferred: slots this instance claimed at once, ranked first for them
        (rendezvous hashing over the registry; see ``docs/guarantees.md``, "Rank delays").
    :ivar claims_backup: slots this instance claimed after its rank delay, no winner heard.
    :ivar claims_unranked: slots claimed after a random jitter, without ranking (alone, no
        registry view yet, ``jitter_ms=0``, or a backend that announces no claims).
    :ivar claims_heard: slots not claimed: another instance's win was heard during the rank
        delay (the run is watched as a backup would).
    :ivar skipped: skip records this instance's claims wrote (``overlap='skip'`` while the
        previous run held its lease, too late, paused): slots and run requests, each counted
        once over every instance.
    :ivar too_late: slots this instance reached after ``max_late_ms`` (claimed as skipped).
    :ivar behind: slots whose ``behind`` skip record this instance's claim wrote: slots it
        passed over because it fell behind the job (its process frozen, its event loop blocked,
        its clock stepped: newer slots due too), by the job's ``catch_up`` (at most 100 per
        backlog, the newest). A slot another instance had run (or recorded) meanwhile keeps
        that record and is not counted; so, as ``skipped_behind`` in :attr:`by_job`, each is
        counted once over every instance, as history holds it.
    :ivar no_thread: slots of plain handlers not claimed because every handler thread was busy.
    :ivar early_slots_deferred: slots due by this host's clock but early by the backend's, put
        back to wait for the backend's time (this clock is ahead).
    :ivar runs_succeeded: runs this instance recorded ``succeeded``.
    :ivar runs_failed: attempts this instance recorded ``failed``: a handler's error or
        timeout, a stop without hand-over, and the attempts its takeovers ended (handed over,
        lease lost, attempts exhausted).
    :ivar timed_out_threads: plain handlers whose thread was still running at their timeout.
    :ivar lease_lost: runs whose lease was lost (not renewed in time, or taken over).
    :ivar result_refused: results the backend refused because the lease had moved on.
    :ivar result_errors: results that could not be recorded (refused for good).
    :ivar handed_over: runs released on stop so that a backup takes them over at once.
    :ivar cancel_ignored: async handlers that ignored their cancellation on stop.
    :ivar taken_over: runs of dead instances this instance took over as a backup.
    :ivar clock_steps: wall-clock steps the timer saw.
    :ivar clock_skew_warnings: warnings that this clock is off the backend's.
    :ivar slots_missed: slots this instance recorded ``missed`` when it started (nobody carried
        the job at their time and catch-up does not run them).
    :ivar slots_paused: slots whose ``paused`` skip record this instance's claim wrote (also
        counted in ``skipped``), each counted once over every instance.
    :ivar slots_unclaimed: slots this instance could not claim, nothing recorded: the backend
        stayed unavailable (or, on NATS, too slow: ``...; not recorded``) until they were too
        late, or refused the claim (see
        :attr:`JobMetrics.slots`, ``unclaimed_*``).
    :ivar retries_scheduled: retries stored after a handler failed (the job's ``retries``).
    :ivar requests_run: run requests (``anarchon trigger``, ``Scheduler.trigger``, retries)
        this instance won and ran.
    :ivar failure_hook_errors: calls of a job's ``on_failure`` hook that raised (logged).
    :ivar by_job: each registered job's :class:`JobMetrics` (slots by outcome, runs by status,
        fire lag and handler duration, takeovers, hand-overs, leases lost, results refused, last
        success, runs in progress, next slot), every job present from the start.
    :ivar claim_latency: the latency of claim calls the backend answered (a :class:`Histogram`
        in seconds; one observation per call, which may carry many slots).
    :ivar fire_lag: the fire lag of every job together (the sum of the jobs' ``fire_lag``,
        removed jobs' too).
    :ivar handler_duration: how long handlers of every job ran (the sum of the jobs'
        ``handler_duration``, removed jobs' too).

    Gauges (now):

    :ivar jobs: registered jobs.
    :ivar running: runs in progress on this instance.
    :ivar watched: runs of other instances watched, to take over if their lease expires.
    :ivar handler_threads_busy: handler threads running a plain handler.
    :ivar clock_offset_ms: the backend's clock minus this host's at the last measurement (None
        before one, or when the backend has no clock).
    :ivar loop_lag_ms: the event loop's lag as the scheduler's thread last measured it (None
        without that thread, e.g. with a fake clock).
    :ivar loop_lag_max_ms: the largest lag seen since start (None without that thread).
    :ivar loop_blocked_ms: how long the loop has been blocked now (None without that thread).
    :ivar instances_seen: live instances in the backend's registry at this instance's last
        heartbeat (None before one, or without a registry).
    :ivar clock_skew_budget_ms: how far this clock may drift from the backend's before a slot
        could run twice: the tightest budget of the registered jobs (None: unbounded).
    :ivar started_ms: when the scheduler started (epoch ms; None before).
    :ivar requests_pending: run requests (triggers, retries) stored and not claimed yet, of
        every job in the backend (not only those carried here), as this instance last read them
        (about every ``control_poll_ms``); None before a read, after a failed one, or without a
        control store. Every instance reports the same figure.
    :ivar pending_requests: the same, by ``(job, kind)`` (kind ``trigger`` or ``retry``):
        every pair this instance has seen pending, at 0 once none is (a Prometheus series
        drops to 0 rather than vanish); empty before a read and after a failed one.
    """

    by_job: dict[str, JobMetrics] = field(default_factory=dict)
    claim_latency: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    fire_lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    handler_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    pending_requests: dict[tuple[str, str], int] = field(default_factory=dict)
    jobs: int = 0
    running: int = 0
    watched: int = 0
    handler_threads_busy: int = 0
    clock_offset_ms: int | None = None
    loop_lag_ms: int | None = None
    loop_lag_max_ms: int | None = None
    loop_blocked_ms: int | None = None
    instances_seen: int | None = None
    clock_skew_budget_ms: int | None = None
    started_ms: int | None = None
    requests_pending: int | None = None

    @classmethod
    def of(cls, counters: Counters, **gauges: Any) -> Metrics:
        """The snapshot of ``counters`` with the given gauges (the others at their default);
        ``by_job`` may be given whole, else the counters' per-job figures are copied."""
        snapshot = object.__new__(cls)
        values: dict[str, Any] = {name: getattr(counters, name) for name in _COUNTED}
        if "by_job" not in gauges:
            values["by_job"] = {name: _job_metrics(f) for name, f in list(counters.by_job.items())}
        for name in _HISTOGRAMS:
            values[name] = getattr(counters, name).copy()
        values.update(gauges)
        for f in fields(cls):
            if f.name in values:
                value = values[f.name]
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(snapshot, f.name, value)
        return snapshot

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"a Metrics snapshot is read-only: cannot assign {name!r}")

    def __getitem__(self, name: str) -> int | None:
        if name not in _NAMES:
            raise KeyError(name)
        value: int | None = getattr(self, name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def as_dict(self) -> dict[str, int | None]:
        """Every counter and gauge by name, as a plain dict (the per-job figures aside)."""
        return {name: getattr(self, name) for name in _NAMES}


_HISTOGRAMS: Final = ("claim_latency", "fire_lag", "handler_duration")
_STRUCTURED: Final = frozenset({"by_job", "pending_requests", *_HISTOGRAMS})
_COUNTED: tuple[str, ...] = tuple(f.name for f in fields(Counters) if f.name not in _STRUCTURED)
_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Metrics) if f.name not in _STRUCTURED)
