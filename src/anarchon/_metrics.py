"""The scheduler's counters, each named once, and the snapshot :meth:`Scheduler.metrics` returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import FrozenInstanceError, asdict, dataclass, fields

from ._models import RunStatus

__all__ = ["Counters", "Metrics"]


@dataclass(slots=True)
class Counters:
    """What happened since the scheduler started: each counter named once, here; shared by the
    core's modules, which increment its fields (the event loop is the only writer). Every field is
    described in :class:`Metrics`, the read-only snapshot that adds the gauges."""

    claims_won: int = 0
    claims_lost: int = 0
    claims_refused: int = 0
    claim_errors: int = 0
    skipped: int = 0
    too_late: int = 0
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
    retries_scheduled: int = 0
    requests_run: int = 0
    failure_hook_errors: int = 0

    def count_run(self, status: RunStatus) -> None:
        """Count a run whose result was recorded (``succeeded`` or ``failed``)."""
        if status is RunStatus.SUCCEEDED:
            self.runs_succeeded += 1
        else:
            self.runs_failed += 1


@dataclass(slots=True, kw_only=True, init=False)
class Metrics(Counters, Mapping[str, "int | None"]):
    """A snapshot of a scheduler's counters (since it started) and gauges (now).

    Read it as attributes (``m.claims_won``) or by name like a mapping (``m["claims_won"]``,
    ``m.get("claims_won")``); :meth:`as_dict` gives a plain dict (for JSON). Every counter is
    present from the start, at zero.

    Counters (since start):

    :ivar claims_won: slots (and manual runs) this instance won and ran.
    :ivar claims_lost: slots another instance won (or was running).
    :ivar claims_refused: claims the backend refused for good (a value it cannot store); nobody
        runs those slots.
    :ivar claim_errors: claim calls that failed on an unavailable backend (each retried until the
        slot is too late).
    :ivar skipped: slots recorded skipped (``overlap='skip'`` while the previous run held its
        lease, or too late).
    :ivar too_late: slots this instance reached after ``max_late_ms`` (claimed as skipped).
    :ivar no_thread: slots of plain handlers not claimed because every handler thread was busy.
    :ivar early_slots_deferred: slots due by this host's clock but early by the backend's, put
        back to wait for the backend's time (this clock is ahead).
    :ivar runs_succeeded: runs recorded ``succeeded``.
    :ivar runs_failed: runs recorded ``failed`` (an error, a timeout, the lease lost, attempts
        exhausted).
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
    :ivar slots_paused: slots answered ``skipped`` because their job (or the cluster) was
        paused (also counted in ``skipped``).
    :ivar retries_scheduled: retries stored after a handler failed (the job's ``retries``).
    :ivar requests_run: run requests (``anarchon trigger``, ``Scheduler.trigger``, retries)
        this instance won and ran.
    :ivar failure_hook_errors: calls of a job's ``on_failure`` hook that raised (logged).

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
    """

    jobs: int = 0
    running: int = 0
    watched: int = 0
    handler_threads_busy: int = 0
    clock_offset_ms: int | None = None
    loop_lag_ms: int | None = None
    loop_lag_max_ms: int | None = None
    loop_blocked_ms: int | None = None

    @classmethod
    def of(cls, counters: Counters, **gauges: int | None) -> Metrics:
        """The snapshot of ``counters`` with the given gauges (the others at their default)."""
        snapshot = object.__new__(cls)
        values = {**asdict(counters), **gauges}
        for field in fields(cls):
            value = values.get(field.name, field.default)
            object.__setattr__(snapshot, field.name, value)
        return snapshot

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"a Metrics snapshot is read-only: cannot assign {name!r}")

    def count_run(self, status: RunStatus) -> None:
        """Not on a snapshot: it is read-only."""
        raise FrozenInstanceError("a Metrics snapshot is read-only")

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
        """Every counter and gauge by name, as a plain dict."""
        return {name: getattr(self, name) for name in _NAMES}


_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Metrics))
