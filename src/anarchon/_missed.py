"""Missed slots: recording, when an instance starts, the slots nobody ran while no instance
carried the job.

For each job whose backend knows its last recorded slot ``L`` (``Backend.last_slots``), the
slots after ``L`` and before the start that catch-up does not run are the gap; the newest
:data:`MAX_RECORDED` of them are claimed as ``missed`` (``ClaimRequest.skip_status``), with the
reason ``missed: no instance carried the job from <L> to <start>`` (and, when there were more,
how many). Those older than ``start - max_late_ms - jitter_ms -`` :data:`MARGIN_MS` are claimed
at once; the newer ones, which an instance that is running could still claim, once that much
time has passed since the start (from the same task: lost if the instance stops first). A slot
that has a record keeps it (a claim never overwrites one), so instances that start together
record each slot once, and a slot a running instance claimed meanwhile keeps its run. The claims
of every job go in one batch per pass, from a task of their own: no slot waits on them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, replace
from typing import Final

from . import otel
from ._batch import isolate
from ._claims import CLAIM_PART, Claims
from ._clock import Clock
from ._job import Job
from ._metrics import Counters
from ._models import CatchUp, RunStatus, Trigger
from ._schedule import CronSchedule
from .backend import Backend, ClaimOutcome, ClaimRequest, ClaimStatus
from .errors import BackendUnavailable
from .logs import Action, log_fields, slot_iso

__all__ = ["MAX_RECORDED", "Gap", "MissedSlots", "gap_slots", "missed_reason"]

logger = logging.getLogger("anarchon.scheduler")

MAX_RECORDED: Final = 20
"""At most this many missed slots are recorded per job and start: the newest."""
MARGIN_MS: Final = 5_000
"""Slots newer than ``start - max_late_ms - jitter_ms`` and this are recorded this much later
than ``max_late_ms + jitter_ms`` after the start (a running instance could still claim them)."""
COUNT_LIMIT: Final = 200_000
"""Missed slots are counted up to this many; beyond, the reason says "more than"."""
_YIELD_EVERY: Final = 2_000
PART: Final = CLAIM_PART
"""Missed claims go to the backend in parts of at most this many, as the claim path's do."""


@dataclass(frozen=True, slots=True)
class Gap:
    """The missed slots of one job: the newest (oldest first), how many in all, exact or not."""

    newest: list[int]
    total: int
    exact: bool = True


def missed_reason(from_ms: int, to_ms: int, gap: Gap) -> str:
    """``missed: no instance carried the job from <iso> to <iso>`` and, when more slots were
    missed than recorded, ``; <N> slots missed in all, the newest <n> recorded``."""
    text = f"missed: no instance carried the job from {slot_iso(from_ms)} to {slot_iso(to_ms)}"
    if gap.total > len(gap.newest):
        count = str(gap.total) if gap.exact else f"more than {gap.total}"
        text += f"; {count} slots missed in all, the newest {len(gap.newest)} recorded"
    return text


async def gap_slots(
    schedule: CronSchedule,
    after_ms: int,
    until_ms: int,
    exclude: frozenset[int] = frozenset(),
    keep: int = MAX_RECORDED,
    limit: int = COUNT_LIMIT,
) -> Gap:
    """The slots of ``schedule`` in ``(after_ms, until_ms]`` that are not in ``exclude``: the
    newest ``keep`` and how many. Counting stops at ``limit`` (an every-second job down for a
    month); the newest are then found by walking back from ``until_ms``. Yields to the event
    loop as it goes."""
    newest: collections.deque[int] = collections.deque(maxlen=keep)
    total = 0
    last = after_ms
    for n, second in enumerate(schedule._walk(after_ms)):
        slot = second * 1000
        if slot > until_ms:
            return Gap(list(newest), total)
        if n % _YIELD_EVERY == _YIELD_EVERY - 1:
            await asyncio.sleep(0)
        if slot in exclude:
            continue
        newest.append(slot)
        total += 1
        last = slot
        if total >= limit:
            break
    else:
        return Gap(list(newest), total)
    # Too many to count: look for the newest in a span that should hold about 2 * keep slots,
    # widened until it does (or reaches what was walked already).
    span = max(1, (last - after_ms) * 2 * keep // max(total, 1))
    while True:
        start = max(last, until_ms - span)
        found = [s for s in schedule.slots(start, until_ms) if s not in exclude]
        if len(found) >= keep or start == last:
            newest.extend(found)
            return Gap(list(newest), total, exact=False)
        span *= 2
        await asyncio.sleep(0)


@dataclass(eq=False)
class MissedSlots:
    """Records the missed slots of the jobs an instance starts with (see the module doc)."""

    _backend: Backend
    _claims: Claims
    _counters: Counters
    _clock: Clock

    async def record(
        self,
        jobs: list[Job],
        last_slots: dict[str, int | None],
        start_ms: int,
        catch_up: dict[str, list[int]],
    ) -> None:
        """Claim the missed slots of ``jobs`` (``last_slots`` from the backend, ``catch_up``:
        the slots catch-up runs, per job) as ``missed``: the old ones in one batch now, the
        recent ones in batches once no running instance could claim them any more; log each
        job once per batch. Returns when every batch is done."""
        now: list[ClaimRequest] = []
        later: dict[int, list[ClaimRequest]] = {}  # delay after the start (ms) -> claims
        gaps: dict[str, tuple[int, Gap]] = {}
        for job in jobs:
            last = last_slots.get(job.name)
            if last is None:
                continue
            policy = job.policy
            delay = policy.max_late_ms + policy.jitter_ms + MARGIN_MS
            planned = catch_up.get(job.name, [])
            until = start_ms - 1  # the slots before the start: from it on, the timer's
            if policy.catch_up == CatchUp.ALL and planned:
                # catch-up runs every slot from the start of its window on
                until = min(until, planned[0] - 1)
            if until <= last:
                continue
            gap = await gap_slots(job.schedule, last, until, frozenset(planned))
            if not gap.newest:
                continue
            reason = missed_reason(last, start_ms, gap)
            gaps[job.name] = (last, gap)
            for slot in gap.newest:
                request = self._claims.request(job, slot, Trigger.SCHEDULE)
                missed = replace(request, skip_reason=reason, skip_status=RunStatus.MISSED)
                if slot <= start_ms - delay:
                    now.append(missed)
                else:
                    later.setdefault(delay, []).append(missed)
        if now:
            await self._claim(now, gaps, start_ms)
        waited = 0
        for delay in sorted(later):
            await self._clock.sleep((delay - waited) / 1000)
            waited = delay
            await self._claim(later[delay], gaps, start_ms)

    async def _claim(
        self, requests: list[ClaimRequest], gaps: dict[str, tuple[int, Gap]], start_ms: int
    ) -> None:
        """One batch of missed claims, sent in parts of at most :data:`PART` (a backend may
        bound how long one call may take to send: NATS, within ``CLAIM_RETRY_S``); a WARNING
        per job with how many were recorded."""
        answered: list[tuple[ClaimRequest, ClaimOutcome | Exception]] = []
        for first in range(0, len(requests), PART):
            part = requests[first : first + PART]
            # One try: these are records of the past, not runs (the claim path's retries would
            # drop them as too late anyway); if the backend cannot take them now, they and the
            # parts after them stay unrecorded.
            try:
                answers = await isolate(
                    self._backend.claim, part, _job_of, "recording missed slots"
                )
            except BackendUnavailable as exc:
                left = requests[first:]
                logger.warning(
                    "missed slots of %d job(s) not recorded: %s",
                    len({r.job for r in left}),
                    exc,
                    extra=log_fields(Action.CATCH_UP_FAILED),
                )
                break
            answered += zip(part, answers, strict=True)
            otel.missed(part, answers, self._backend.name)
        recorded: collections.Counter[str] = collections.Counter()
        for request, outcome in answered:
            if (
                isinstance(outcome, ClaimOutcome)
                and outcome.status is ClaimStatus.SKIPPED
                and outcome.run.run_id == request.run_id
            ):
                recorded[request.job] += 1
        for name, count in recorded.items():
            last, gap = gaps[name]
            self._counters.missed(name, count)
            logger.warning(
                "job %s: %d slot(s) missed while no instance carried it, from %s to %s "
                "(%s in all); recorded missed",
                name,
                count,
                slot_iso(last),
                slot_iso(start_ms),
                gap.total if gap.exact else f"more than {gap.total}",
                extra={
                    **log_fields(Action.SLOTS_MISSED, name, count=count, total=gap.total),
                    "from": slot_iso(last),
                    "to": slot_iso(start_ms),
                },
            )


def _job_of(request: ClaimRequest) -> str:
    return request.job
