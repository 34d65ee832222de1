"""Catching up on start: which slots were missed while no instance ran, and claiming them, one
at a time and oldest first; the missed slots catch-up does not run are recorded ``missed``
(:mod:`._missed`). A backlog this instance fell behind on while it ran (:mod:`._backlog`) is
caught up the same way with ``catch_up="all"``.

One catch-up per job at a time on an instance: slots of a job whose catch-up is under way (the
instance fell behind again while it ran, or on start) join it, in slot order, rather than
running beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from ._active import ActiveRun
from ._claims import CLAIM_PART, Claims
from ._clock import Clock
from ._job import Job
from ._missed import MissedSlots
from ._models import CatchUp, Trigger
from ._schedule import CronSchedule
from ._threads import HandlerThreads
from .backend import Backend, ClaimOutcome, LeaseBackend
from .errors import BackendUnavailable
from .logs import Action, log_fields

__all__ = ["CatchingUp", "missed_slots"]

logger = logging.getLogger("anarchon.scheduler")

CATCH_UP_POLL_S: Final = 0.25


def missed_slots(
    schedule: CronSchedule, last_slot: int | None, now_ms: int, window_ms: int, mode: CatchUp
) -> tuple[list[int], int]:
    """Return (slots to claim, how many missed slots are left out) for a job starting at ``now_ms``.

    Missed slots are those after the job's last recorded slot, not in the future, and inside the
    window. A job without history (``last_slot`` None) has nothing to catch up. ``latest`` keeps
    only the newest missed slot; ``all`` keeps them all, oldest first.
    """
    if mode is CatchUp.NONE or last_slot is None:
        return [], 0
    since = max(last_slot, now_ms - window_ms)
    missed = schedule.slots(since, now_ms)
    if mode is CatchUp.LATEST and len(missed) > 1:
        return missed[-1:], len(missed) - 1
    return missed, 0


def _mode(value: CatchUp | str) -> CatchUp:
    return value if isinstance(value, CatchUp) else CatchUp(value)


@dataclass(eq=False, slots=True)
class _Queue:
    """A job's catch-up under way: the slots it has still to claim, oldest first, and the job
    (the newest definition given: a job added again under its name decides the rest)."""

    job: Job
    slots: list[int]


@dataclass(eq=False)
class CatchingUp:
    """Starts a catch-up for each job that missed slots (``catch_up`` other than ``none``)."""

    _backend: Backend
    _clock: Clock
    _claims: Claims
    _threads: HandlerThreads
    _running: Callable[[], bool]
    _spawn: Callable[[Coroutine[Any, Any, Any]], None]
    _missed: MissedSlots | None = None
    _queues: dict[str, _Queue] = field(default_factory=dict, init=False)
    """The catch-ups under way, by job name (see :meth:`_enqueue`)."""

    async def start(self, jobs: list[Job], now: int) -> None:
        """Look up the last recorded slot of every job, in backend calls of at most
        :data:`~._claims.CLAIM_PART` jobs; start a catch-up for each job that missed slots, and
        record the missed slots it does not run. ``now``: when the scheduler started carrying
        the jobs, on the backend's clock (estimated), the instant from which the timer fires
        their slots: a slot after it is the timer's (deferred there while it is still in the
        future by the backend's clock), never caught up early by a host whose clock is ahead.
        The jobs of a look-up that fails are skipped (logged)."""
        backend = self._backend
        lease = isinstance(backend, LeaseBackend)
        wanted = [j for j in jobs if lease and j.policy.catch_up != CatchUp.NONE]
        asked = jobs if self._missed is not None else wanted
        if not asked:
            return
        # A job missing from last_slots (its look-up failed) is neither caught up nor recorded.
        last_slots: dict[str, int | None] = {}
        for first in range(0, len(asked), CLAIM_PART):
            part = asked[first : first + CLAIM_PART]
            try:
                last_slots.update(await backend.last_slots([j.name for j in part]))
            except BackendUnavailable as exc:
                logger.warning(
                    "catch-up skipped for %d job(s) (%s%s): %s",
                    len(part),
                    part[0].name,
                    f" and {len(part) - 1} more" if len(part) > 1 else "",
                    exc,
                    extra=log_fields(Action.CATCH_UP_FAILED),
                )
        # Up to ``now`` on the backend's clock; the timer fires the slots after it.
        planned: dict[str, list[int]] = {}
        for job in wanted:
            last = last_slots.get(job.name)
            if last is None:
                continue  # no history: nothing to catch up (most jobs of a first start)
            policy = job.policy
            slots, left_out = missed_slots(
                job.schedule, last, now, policy.catch_up_window_ms, _mode(policy.catch_up)
            )
            planned[job.name] = slots
            if slots:
                logger.info(
                    "catching up %d missed slot(s) of %s (%d older left out, catch_up=%s)",
                    len(slots),
                    job.name,
                    left_out,
                    policy.catch_up,
                    extra=log_fields(Action.CATCH_UP, job.name),
                )
                self._enqueue(job, slots)
        if self._missed is not None:
            await self._missed.record(jobs, last_slots, now, planned)

    def backlog(self, job: Job, slots: list[int]) -> None:
        """Run ``slots`` of ``job``, due at once because this instance fell behind (a frozen
        process, a clock step: :mod:`._backlog`, ``catch_up="all"``), one at a time, oldest
        first, as missed slots are caught up on start. A catch-up of the job under way (a
        backlog before, still running) takes them on: they never run beside it."""
        self._enqueue(job, slots)

    def _enqueue(self, job: Job, slots: list[int]) -> None:
        """Catch ``slots`` of ``job`` up: in the job's catch-up under way if there is one (the
        slots it has still to claim and these, oldest first), else in a new one."""
        queue = self._queues.get(job.name)
        if queue is None:
            self._queues[job.name] = queue = _Queue(job, sorted(set(slots)))
            self._spawn(self._catch_up_slots(queue))
            return
        queue.job = job
        queue.slots = sorted({*queue.slots, *slots})
        logger.info(
            "job %s: %d more slot(s) to catch up join the catch-up under way (%d left in it); "
            "a job's catch-up runs one slot at a time",
            job.name,
            len(slots),
            len(queue.slots),
            extra=log_fields(Action.CATCH_UP, job.name),
        )

    async def _catch_up_slots(self, queue: _Queue) -> None:
        # One slot at a time, oldest first, the slots that join meanwhile too. Before each
        # claim an instance waits until no run of the job is going (instances that start
        # together may have read different last slots), so that a missed slot is rarely
        # recorded skipped for overlapping another missed slot. Rarely, not never: another
        # instance's live slot (or catch-up) may win between the wait's last look and this
        # claim. So the claim follows the job's ``overlap``, which the backend checks in the
        # claim's own atomic step: with "skip" such a slot is recorded skipped (overlap), never
        # run beside the other run. (It once allowed overlap after the wait: the two ran at
        # once.) A run still going after the wait (longer than two leases) is the same case.
        name = queue.job.name
        try:
            while queue.slots and self._running():
                job, slot = queue.job, queue.slots.pop(0)
                if not await self._until_idle(job, job.policy.lease_ms * 2 / 1000):
                    return
                active = await self._catch_up_slot(job, slot)
                if active is False:
                    return
                if isinstance(active, ActiveRun):
                    # Shielded: cancelling this catch-up (on stop) must not cancel the run's
                    # result.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(active.result)
        finally:
            # No await between the last look at the slots and this: a slot that joins after
            # it starts a catch-up of its own.
            if self._queues.get(name) is queue:
                del self._queues[name]

    async def _catch_up_slot(self, job: Job, slot: int) -> ActiveRun | bool:
        """Claim one missed slot (overlap as the job says); the run started, True to go on,
        False to give up."""
        policy = job.policy
        reserved = False
        if not job.is_async:
            reserved = await self._claims.reserve_thread(policy.max_late_ms / 1000)
            if not reserved:
                self._claims.starved([self._claims.request(job, slot, Trigger.CATCH_UP)])
                return False
        try:
            request = self._claims.request(job, slot, Trigger.CATCH_UP)
            claimed = await self._claims.claim([request], deadline_s=policy.max_late_ms / 1000)
            if not claimed:
                return False
            _, outcome, sent = claimed[0]
            if not isinstance(outcome, ClaimOutcome):
                return True
            active = self._claims.handle(outcome, reserved, sent)
            if active is not None:
                reserved = False
                return active
            return True
        finally:
            if reserved:
                self._threads.unreserve()

    async def _until_idle(self, job: Job, limit_s: float) -> bool:
        """Wait up to ``limit_s`` until no run of the job is going (:meth:`_going`), or one
        still goes after ``limit_s``: True; False if stopping."""
        began = self._clock.monotonic_ms()
        while self._running():
            if not await self._going(job):
                return True
            if (self._clock.monotonic_ms() - began) / 1000 >= limit_s:
                return True  # the claim decides, by the job's overlap
            await self._clock.sleep(CATCH_UP_POLL_S)
        return False

    async def _going(self, job: Job) -> bool:
        """A run of ``job`` is recorded ``running``: on a lease backend any open attempt, not
        only the newest record (a live slot skipped for overlap is newer than the run it
        overlapped, and ended); elsewhere the newest. False if the backend cannot tell."""
        backend = self._backend
        try:
            if isinstance(backend, LeaseBackend):
                return bool(await backend.open_runs([job.name], 0))
            last = await backend.last_run(job.name)
        except BackendUnavailable:
            return False
        return last is not None and not last.status.finished
