"""Backlogs: the slots of one job that an instance finds due at once because it fell behind (its
process frozen: SIGSTOP, an event loop blocked, a laptop asleep; or its wall clock stepped
forward), decided at once by the job's ``catch_up``, as the slots missed while no instance ran
are decided on start (:mod:`._catchup`).

The timer holds one slot per job, the next; a process that did not run for a while is handed it
late. That slot is *behind* (:func:`is_behind`) when the instance reaches it more than
``jitter_ms`` + :data:`BEHIND_MS` after it and the job's next slot is due too, by this host's
clock and by the backend's as the instance measured it (by one alone, a clock is off: ahead, its
slots wait for the backend's time; behind, each is claimed late, as any late slot). The due
slots, from it to the newest, are the job's backlog:

- ``catch_up="latest"`` (the lease backends' default) and ``"none"`` (NATS's): the newest due
  slot is claimed as the live slot (it runs if it is within ``max_late_ms``, else it is skipped
  ``too late``, as any slot); the older ones do not run and are recorded ``skipped`` with the
  reason ``behind: <instance> reached the slot <ms> ms after it, with <n> slots of the job due
  at once (<first> to <newest>); catch_up='latest' runs only the newest``.
- ``catch_up="all"`` (lease backends): the due slots inside ``catch_up_window_ms`` run one at a
  time, oldest first, trigger ``catch-up``, as missed slots are caught up on start (the newest
  last); older ones are recorded ``behind``.

The instance logs one WARNING ``behind`` per :data:`WARN_WINDOW_MS` at most, for all the
backlogs of its jobs in that window (an overloaded instance with thousands of every-second jobs
once logged one per job per backlog: thousands a minute, adding to the load): one backlog alone
is told as before (its job, how far behind, the slots due, what catch_up does); several are
counted (how many jobs, slots due and passed over, the worst lag, the first few job names). It
says why the instance fell behind as far as it can tell
(:func:`why_behind`): its wall clock stepped forward (the timer saw it), its event loop was
blocked (the loop watchdog saw a block end: a handler's blocking code), or its whole process
did not run (SIGSTOP, a paused VM: the watchdog's own thread did not run either). Without the
watchdog (a clock of the caller's own) it cannot tell a block from a freeze and says so.

At most :data:`MAX_BEHIND` ``behind`` records per backlog, the newest (the reason then says how
many were passed over in all); a slot younger than ``jitter_ms`` + :data:`BEHIND_MS` is recorded
once it is that old, after the claims of instances on time. On a broker only slots inside
``max_late_ms + jitter_ms`` are recorded: inside the duplicate window, so a record never doubles
one that another instance wrote. Each record is a claim: a slot another instance ran keeps its
run, so in a cluster a frozen instance that comes back only records what nobody did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ._claims import Claims
from ._clock import Clock
from ._job import Job
from ._missed import gap_slots
from ._models import CatchUp, SkipCause, Trigger
from ._threads import HandlerThreads
from ._timer import Late
from ._watchdog import Block, LoopWatchdog
from .backend import BEHIND, Backend, ClaimRequest, LeaseBackend
from .logs import Action, log_fields, slot_iso

__all__ = [
    "BEHIND_MS",
    "MAX_BEHIND",
    "WARN_JOBS",
    "WARN_WINDOW_MS",
    "Backlogs",
    "behind_reason",
    "is_behind",
    "why_behind",
]

logger = logging.getLogger("anarchon.scheduler")

BEHIND_MS: Final = 1_000
"""How much later than its ``jitter_ms`` an instance must reach a slot, the job's next slot due
too, for the slot to be behind: an event loop a few hundred milliseconds late under load still
claims its slots late, as before; a process that stopped for seconds passes over the older ones."""
MAX_BEHIND: Final = 100
"""At most this many slots passed over are recorded ``behind`` per backlog: the newest."""
WARN_WINDOW_MS: Final = 1_000
"""The backlogs of one instance's jobs that begin within this long of the first are told in one
WARNING ``behind``, logged at the window's end (or when the scheduler stops)."""
WARN_JOBS: Final = 5
"""A WARNING ``behind`` for several jobs names at most this many of them (the worst first)."""


def is_behind(job: Job, slot: int, now: int) -> bool:
    """Whether this instance, reaching ``slot`` of ``job`` at ``now`` (the earlier of this
    host's clock and the backend's), fell behind the job: more than ``jitter_ms`` +
    :data:`BEHIND_MS` after the slot, with the job's next slot due too. Cheap when it is not (no
    schedule walk for a slot on time)."""
    if now - slot <= job.policy.jitter_ms + BEHIND_MS:
        return False
    try:
        return job.schedule.next_slot(slot) <= now
    except (StopIteration, OverflowError):  # no later slot before the end of the calendar
        return False


def why_behind(late: Late, block: Block | None, watched: bool) -> tuple[str, str]:
    """Why this instance fell behind, as far as it can tell: ``(cause, words)``, the cause one
    of ``clock_step``, ``loop_blocked``, ``frozen`` or ``unknown``. ``late``: the timer's look
    that handed the slot over; ``block``: the last block of the event loop the watchdog saw
    end; ``watched``: the watchdog runs (without it a block and a freeze look alike)."""
    if late.step_ms > 0:
        return "clock_step", (
            f"its wall clock stepped forward {late.step_ms} ms (set by hand or NTP, or the "
            "host was asleep)"
        )
    # The block that kept the timer from looking: ended since its look before, most of the gap.
    if (
        block is not None
        and block.ended_ms >= late.monotonic_ms - late.gap_ms
        and block.blocked_ms * 2 >= late.gap_ms
    ):
        by = block.blocker or "code on the event loop (too short for the watchdog to name it)"
        return "loop_blocked", f"its event loop was blocked for {block.blocked_ms} ms by {by}"
    if watched and late.gap_ms > BEHIND_MS:
        return "frozen", (
            f"its process did not run for {late.gap_ms} ms, its watchdog thread neither: "
            "stopped (SIGSTOP), a paused VM or container, or the GIL held that long"
        )
    return "unknown", "its process was frozen, its event loop blocked or its clock stepped"


def behind_reason(
    instance: str,
    slot: int,
    now: int,
    due: tuple[int, int, int],
    mode: CatchUp,
    outcome: str,
) -> str:
    """The reason of a slot passed over: ``behind: <instance> reached the slot <ms> ms after it,
    with <n> slots of the job due at once (<first> to <newest>); catch_up=<mode> <outcome>``.
    ``due``: the first and newest due slots and how many were due."""
    first, newest, count = due
    return (
        f"{BEHIND}{instance} reached the slot {now - slot} ms after it, with {count} slots of the "
        f"job due at once ({slot_iso(first)} to {slot_iso(newest)}); catch_up={mode.value!r} "
        f"{outcome}"
    )


@dataclass(frozen=True, slots=True)
class _Plan:
    """A backlog decided: the job's ``catch_up``, the slots caught up (``all``), the first and
    the newest due slots, how many were due, the slots passed over to record (the newest, at most
    :data:`MAX_BEHIND`) and how many in all, and what the reason says catch_up does."""

    mode: CatchUp
    caught: list[int]
    first: int
    newest: int
    count: int
    passed: list[int]
    passed_total: int
    outcome: str


@dataclass(frozen=True, slots=True)
class _Told:
    """One backlog, to be told in its window's WARNING: its job, how far behind (ms), its plan
    and the cause (:func:`why_behind`)."""

    job: str
    lag_ms: int
    plan: _Plan
    cause: tuple[str, str]


@dataclass(eq=False)
class Backlogs:
    """Decides the backlogs of one scheduler's jobs (see the module doc).

    ``_catch_up``: runs a job's slots one at a time, oldest first, trigger ``catch-up``
    (:meth:`._catchup.CatchingUp.backlog`); ``_watchdog``: the loop watchdog, if it runs;
    ``_spawn``: runs a coroutine as one of the scheduler's tasks (the window's WARNING).
    """

    _backend: Backend
    _clock: Clock
    _claims: Claims
    _threads: HandlerThreads
    _catch_up: Callable[[Job, list[int]], None]
    _watchdog: Callable[[], LoopWatchdog | None]
    _spawn: Callable[[Any], None]
    _told: list[_Told] = field(default_factory=list, init=False)

    async def decide(
        self, job: Job, head: int, until: int, now: int, head_won: bool, late: Late
    ) -> None:
        """Decide the backlog of ``job``, its slots from ``head`` (the timer's slot, behind) up
        to ``until`` (due by this host's clock and the backend's): claim its live slot or catch
        it up, and record the slots passed over. ``now``: the backend's clock, which judges the
        live slot too late or not. ``head_won``: another instance was heard winning ``head``
        (not recorded here). ``late``: the timer's look that handed ``head`` over (why the
        instance fell behind: :func:`why_behind`)."""
        policy = job.policy
        watchdog = self._watchdog()
        # Read now, before the awaits below: a block that ends later is not this one.
        cause = why_behind(late, watchdog.last_block if watchdog else None, watchdog is not None)
        plan = await self._plan(job, head, until)
        passed = plan.passed
        if not isinstance(self._backend, LeaseBackend):  # inside the duplicate window
            passed = [s for s in passed if s >= now - policy.max_late_ms - policy.jitter_ms]
        if head_won:
            passed = [s for s in passed if s != head]
        self._warn(job, now, plan, cause)
        # An instance on time claims a slot within its jitter: a slot younger than that (and a
        # claim's latency) is recorded once those claims are in, so a record made here never
        # takes a slot that another instance was about to run.
        ripe = now - policy.jitter_ms - BEHIND_MS
        requests = self._behind(job, [s for s in passed if s <= ripe], now, plan)
        young = [s for s in passed if s > ripe]
        reserved: set[str] = set()
        if not plan.caught:  # the newest is the live slot, claimed as any
            live = self._claims.request(job, plan.newest, Trigger.SCHEDULE, now)
            if live.skip_reason is not None or job.is_async:
                requests.append(live)
            elif self._threads.reserve():  # a plain handler's thread, as for any slot
                reserved.add(live.run_id)
                requests.append(live)
            else:
                self._claims.starved([live])
        if requests:
            await self._claims.fire(requests, reserved, keep=False)
        if plan.caught:
            self._catch_up(job, plan.caught)
        if young:
            await self._clock.sleep((young[-1] - ripe) / 1000)
            await self._claims.fire(self._behind(job, young, now, plan), set(), keep=False)

    def _behind(self, job: Job, slots: list[int], now: int, plan: _Plan) -> list[ClaimRequest]:
        """The claims that record ``slots`` of ``job`` skipped, ``behind: ...`` (counted in
        ``behind`` when the record is written: a slot another instance ran keeps its run)."""
        shown = (plan.first, plan.newest, plan.count)
        return [
            replace(
                self._claims.request(job, slot, Trigger.SCHEDULE),
                skip_reason=behind_reason(
                    self._claims.instance, slot, now, shown, plan.mode, plan.outcome
                ),
                skip_cause=SkipCause.BEHIND,
            )
            for slot in slots
        ]

    async def _plan(self, job: Job, head: int, until: int) -> _Plan:
        """What becomes of the due slots of ``job`` from ``head`` to ``until``."""
        policy = job.policy
        mode = CatchUp(policy.catch_up)
        caught: list[int] = []
        start = head
        if mode is CatchUp.ALL and isinstance(self._backend, LeaseBackend):
            start = max(head, until - policy.catch_up_window_ms)
            caught = job.schedule.slots(start - 1, until)
        if caught:
            gap = await gap_slots(job.schedule, head - 1, start - 1, keep=MAX_BEHIND)
            newest, count, passed = caught[-1], len(caught) + gap.total, gap.newest
            outcome = f"runs the {len(caught)} inside catch_up_window_ms, oldest first"
            passed_total = gap.total
        else:  # none, latest; all with no due slot inside its window
            gap = await gap_slots(job.schedule, head - 1, until, keep=MAX_BEHIND + 1)
            newest, count, passed = gap.newest[-1], gap.total, gap.newest[:-1]
            outcome = "runs only the newest"
            passed_total = gap.total - 1
        if passed_total > len(passed):
            many = str(passed_total) if gap.exact else f"more than {passed_total}"
            outcome += f"; {many} passed over, the newest {len(passed)} recorded"
        return _Plan(mode, caught, head, newest, count, passed, passed_total, outcome)

    def _warn(self, job: Job, now: int, plan: _Plan, cause: tuple[str, str]) -> None:
        """Tell the backlog in its window's WARNING (the first backlog opens the window)."""
        self._told.append(_Told(job.name, now - plan.first, plan, cause))
        if len(self._told) == 1:
            self._spawn(self._warn_later())

    async def _warn_later(self) -> None:
        """At the window's end, or if the scheduler stops first, its one WARNING."""
        try:
            await self._clock.sleep(WARN_WINDOW_MS / 1000)
        finally:
            self.flush()

    def flush(self) -> None:
        """Log the WARNING ``behind`` of the backlogs told since the last one, if any: one
        backlog as it is, several counted."""
        told, self._told = self._told, []
        if not told:
            return
        if len(told) == 1:
            _warn_one(told[0])
            return
        worst = max(told, key=lambda t: t.lag_ms)
        names = list(dict.fromkeys(t.job for t in sorted(told, key=lambda t: -t.lag_ms)))
        shown = ", ".join(names[:WARN_JOBS]) + (
            f" and {len(names) - WARN_JOBS} more" if len(names) > WARN_JOBS else ""
        )
        count = sum(t.plan.count for t in told)
        passed = sum(t.plan.passed_total for t in told)
        logger.warning(
            "%d jobs: this instance fell up to %d ms behind (%s): %d slot(s) due at once in "
            "all, decided by each job's catch_up, %d passed over (recorded skipped, behind, "
            "unless another instance ran them); jobs %s (one such WARNING a second at most)",
            len(names),
            worst.lag_ms,
            worst.cause[1],
            count,
            passed,
            shown,
            extra=log_fields(
                Action.BEHIND,
                worst.job,
                worst.plan.first,
                count=count,
                behind_ms=worst.lag_ms,
                passed=passed,
                cause=worst.cause[0],
                jobs=len(names),
                job_names=names[:WARN_JOBS],
            ),
        )


def _warn_one(told: _Told) -> None:
    """The WARNING of one backlog: how far behind and why, how many due, what catch_up does."""
    plan = told.plan
    then = (
        f"{len(plan.caught)} caught up, oldest first"
        if plan.caught
        else "the newest claimed as the live slot"
    )
    first = plan.first
    logger.warning(
        "job %s: this instance fell %d ms behind (%s): %d slot(s) due at once, %s to %s; "
        "catch_up=%s: %s, %d passed over (recorded skipped, behind, unless another "
        "instance ran them)",
        told.job,
        told.lag_ms,
        told.cause[1],
        plan.count,
        slot_iso(first),
        slot_iso(plan.newest),
        plan.mode.value,
        then,
        plan.passed_total,
        extra=log_fields(
            Action.BEHIND,
            told.job,
            first,
            count=plan.count,
            behind_ms=told.lag_ms,
            passed=plan.passed_total,
            cause=told.cause[0],
            jobs=1,
            job_names=[told.job],
        ),
    )
