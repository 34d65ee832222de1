"""Firing: the timer's due slots become claim requests, and each fired job's next slot goes on
the timer.

The timer (:mod:`._timer`) holds every job's next slot, due after its rank delay
(:mod:`._rendezvous`). When slots come due, :meth:`Firing.on_due` judges them early or not on
the backend's clock (:mod:`._clock`), drops those another instance was heard winning, sets a
thread aside for each claim of a plain handler (none free: the slot is starved and others run
it) and hands the requests to :mod:`._claims` in one task; then it puts each fired job's next
slot on the timer. A slot reached so late that the job's next slot is due too (the process was
frozen, the clock stepped) starts a backlog, decided by the job's ``catch_up``
(:mod:`._backlog`); the job's next slot is then the first after now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ._backlog import BEHIND_MS, Backlogs, is_behind
from ._claims import Claims, share_first
from ._clock import BackendClock, Clock
from ._job import Job
from ._members import BACKUP, PREFERRED
from ._metrics import Counters
from ._models import Trigger
from ._rendezvous import Rendezvous
from ._threads import HandlerThreads
from ._timer import Due, SlotTimer
from .backend import Backend, ClaimRequest
from .logs import Action, log_fields

__all__ = ["Firing"]

logger = logging.getLogger("anarchon.scheduler")


@dataclass(eq=False)
class Firing:
    """Fires one scheduler's slots: owns its timer and the generation of each job name.

    ``_jobs`` is the scheduler's registry, read here; a slot on the timer fires only if its job
    is still registered under the generation it was put on the timer with (see :meth:`added`).
    ``_running`` says whether slots are claimed (fired slots still schedule the next ones).
    """

    # What a slot is fired from: the registry, whether to claim, the rank plan, the clocks.
    _jobs: dict[str, Job]
    _running: Callable[[], bool]
    _rendezvous: Rendezvous
    _clock: Clock
    _backend_clock: BackendClock
    _backend: Backend
    # What it is handed to: the claim path, the handler threads, the counters, a new task.
    _claims: Claims
    _threads: HandlerThreads
    _counters: Counters
    _spawn: Callable[[Coroutine[Any, Any, Any]], None]
    _backlogs: Backlogs
    _generation: dict[str, int] = field(default_factory=dict, init=False)
    timer: SlotTimer = field(init=False)
    """The one timer: every job's next slot (the scheduler runs and stops it)."""

    def __post_init__(self) -> None:
        self.timer = SlotTimer(self._clock, self.on_due, self._backend_clock.stepped)

    def added(self, name: str) -> None:
        """Job ``name`` was registered (again): slots of an earlier job of that name still on
        the timer no longer fire."""
        self._generation[name] = self._generation.get(name, 0) + 1

    def schedule_next(self, job: Job, after_ms: int) -> None:
        """Put ``job``'s next slot after ``after_ms`` on the timer."""
        self.timer.push(*self._planned(job, after_ms))

    def schedule_all(self, jobs: list[Job], after_ms: int) -> None:
        """:meth:`schedule_next` for every job of ``jobs``, put on the timer at once."""
        self.timer.push_many([self._planned(job, after_ms) for job in jobs])

    def _planned(self, job: Job, after_ms: int) -> tuple[str, int, int, int]:
        """The timer's entry for ``job``'s next slot after ``after_ms``: ``(job, slot, due_ms,
        generation)``, due after its rank delay (or, unranked, a random jitter: see
        _rendezvous)."""
        slot = job.schedule.next_slot(after_ms)
        plan = self._rendezvous.plan(job.name, slot, job.policy.jitter_ms)
        if plan.kind is BACKUP:
            self._backend.expect_claims(slot, slot + plan.delay_ms)  # a notice may save the claim
        return job.name, slot, slot + plan.delay_ms, self._generation[job.name]

    def on_due(self, batch: list[Due]) -> None:
        """The timer's call: claim the slots of ``batch`` (one task), then schedule the next."""
        # "Too late" is a decision shared with other instances: judged on the backend's clock
        # as measured, not on this host's wall clock (which may have been stepped).
        now = self._backend_clock.time.now_ms()
        wall = self._clock.now_ms()
        at, sent_at = _sent(batch, now, wall)
        # Behind (a backlog) by both clocks: a process frozen, or one host's clock stepped. By
        # one alone, this clock is off: ahead, its slots wait for the backend's time (early);
        # behind, each slot is claimed late, as any late slot.
        until = min(now, wall)
        # The jobs fired and their slots, as two lists rather than a pair each: a burst's
        # thousands wait for _reschedule, and each pair would be one more object to walk.
        fired: list[Job] = []
        slots: list[int] = []
        try:
            requests: list[ClaimRequest] = []
            reserved: set[str] = set()
            starved: list[ClaimRequest] = []
            early: list[Due] = []
            # On one host every instance's wall clock stepped alike: nobody is early.
            early_check = self._backend_clock.early_slots_possible()
            # Read once, not per slot (a step of its own per read on Python 3.11; nothing in
            # the loop awaits, so the state stays as it is).
            running, schedule = self._running(), Trigger.SCHEDULE
            for due in batch:
                job = self._jobs.get(due.job)
                if job is None or self._generation.get(due.job) != due.generation:
                    continue
                if early_check and self._backend_clock.is_early(due.slot, sent_at):
                    early.append(due)
                    continue
                fired.append(job)
                if self._fell_behind(job, due, until, now, running):
                    slots.append(until)  # the job's next slot on the timer: the first after it
                    continue
                slots.append(due.slot)
                if not running or self._heard(job, due.slot):
                    continue
                request = self._claims.request(job, due.slot, schedule, now)
                if request.skip_reason is None and not job.is_async:
                    # A plain handler needs a thread: no lease is taken before one is set
                    # aside. Without one this instance does not claim; others run the slot.
                    if not self._threads.reserve():
                        starved.append(request)
                        continue
                    reserved.add(request.run_id)
                requests.append(request)
            if starved:
                self._claims.starved(starved)
            if requests:
                requests = share_first(requests, self._rendezvous.share)
                self._spawn(self._claims.fire(requests, reserved, not_before_ms=at, keep=False))
            if early:
                self._backend_clock.defer(early, now, self._push_back)
        finally:
            if fired:
                # After the claim is on its way: a batch of thousands would otherwise hold it.
                self._spawn(self._reschedule(fired, slots, now))

    def _fell_behind(self, job: Job, due: Due, until: int, now: int, running: bool) -> bool:
        """If ``due`` came so late that the job's next slot is due too (up to ``until``),
        decide its due slots at once, by its ``catch_up`` (:mod:`._backlog`), and return True.
        ``now``: the backend's clock."""
        # due_ms is at most slot + jitter_ms: a slot on time costs one comparison.
        if until - due.due_ms <= BEHIND_MS or not is_behind(job, due.slot, until):
            return False
        if running:
            head_won = self._heard(job, due.slot)
            late = self.timer.late
            self._spawn(self._backlogs.decide(job, due.slot, until, now, head_won, late))
        return True

    def _heard(self, job: Job, slot: int) -> bool:
        """Count how this slot came to be claimed; True if another instance's win was heard
        meanwhile (then it is not claimed: the claim could only lose)."""
        kind, notice = self._rendezvous.due(job.name, slot)
        counters = self._counters
        if notice is None:
            if kind is PREFERRED:
                counters.claims_preferred += 1
            elif kind is BACKUP:
                counters.claims_backup += 1
            else:
                counters.claims_unranked += 1
            return False
        counters.claims_heard += 1
        if logger.isEnabledFor(logging.DEBUG):  # in a burst, one per slot another instance won
            logger.debug(
                "not claiming %s slot %s: %s won it first",
                job.name,
                slot,
                notice.instance,
                extra=log_fields(Action.CLAIM_HEARD, job.name, slot, holder=notice.instance),
            )
        return True

    def _push_back(self, due: Due, wall_ms: int) -> None:
        self.timer.push(due.job, due.slot, wall_ms, due.generation)

    async def _reschedule(self, fired: list[Job], slots: list[int], now: int) -> None:
        """Put each fired job's next slot (after its fired one in ``slots``, or after now for
        a backlog) on the timer. Slots that are already too late (on the backend's clock) are
        passed over without a claim."""
        for n, (job, slot) in enumerate(zip(fired, slots, strict=True)):
            if self._jobs.get(job.name) is job:
                self.schedule_next(job, max(slot, now - job.policy.max_late_ms))
            if n % 512 == 511:
                await asyncio.sleep(0)


def _sent(batch: list[Due], now: int, wall: int) -> tuple[int | None, int]:
    """When the claims of ``batch`` go out: ``(at, sent_at)``, ``at`` the wall time to wait for
    (None: at once) and ``sent_at`` the backend's time then (``now`` plus the wait). A batch
    handed over before its slot (the timer's lead_ms) is claimed at it, not before, and judged
    early or not by the backend's clock then."""
    at = batch[-1].due_ms if batch else None
    if at is None or at - wall <= 0:
        return None, now
    return at, now + (at - wall)
