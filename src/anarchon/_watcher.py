"""Backup runners: watch runs other instances hold, and take over those whose lease ends.

An instance watches the runs it lost a claim to, the runs others are heard to win, and, when it
starts carrying a job, the job's runs still open from before (:meth:`BackupWatcher.adopt`): a
run whose runner dies is then taken over even when every instance that lost its claim is gone
too (a restart, a rolling deploy). A run handed over (released) is checked at once by every
instance that carries its job, watched or not. An instance whose own attempt was lost (its
renewal refused, or its lease ran out) watches the slot from then on (:meth:`BackupWatcher.follow`),
and every :data:`ADOPT_EVERY_MS` the scheduler adopts again, so a run whose lease ended is taken
over whoever watched it before.

A watcher that finds the backend unavailable gives the runs' holders a grace after it answers
again (:func:`outage_grace_ms`) before it takes over: a lease that ran out during the outage could
not be renewed, and a handler that finished meanwhile has its result still being retried.

Checks are scheduled on the monotonic clock (a wall-clock step neither brings a check forward
nor holds it back); whether a lease has expired is the backend's decision, on its own clock.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Final

from ._clock import Clock, sleep_or_wake
from ._job import Job
from ._metrics import Counters
from ._models import Run, RunStatus
from ._threads import HandlerThreads
from .backend import LeaseBackend, TakeoverOutcome, TakeoverRequest, TakeoverStatus, Ticket
from .errors import AnarchonError, BackendError
from .logs import Action, log_fields

__all__ = ["BackupWatcher"]

logger = logging.getLogger("anarchon.scheduler")

# Check this long after the expiry the backend announced, so the backend surely sees it expired.
EXPIRY_MARGIN_MS: Final = 50
RETRY_MS: Final = 1_000
# Takeover checks in flight at once. A burst's thousands of runs held by others have leases that
# end together: checking them all at once would open thousands of backend calls (past a Redis
# client's pool, or waiting on a PostgreSQL pool until timeout_ms); the rest wait their turn.
MAX_CHECKS: Final = 32
# The takeover answers that come of a write recording the attempt they ended failed.
_RECORDS_FAILED: Final = frozenset({TakeoverStatus.TAKEN, TakeoverStatus.EXHAUSTED})
# adopt(): the jobs of one open_runs() call (the bound last_slots has).
ADOPT_PART: Final = 2_000
ADOPT_EVERY_MS: Final = 60_000
"""How often a running scheduler adopts its jobs' open runs again (the safety net)."""
# After an outage, a holder's result is retried with a backoff capped at 5 s (see _retry) and
# its renewal every lease_ms // 3: the grace covers both, with a margin for a loaded machine.
OUTAGE_MARGIN_MS: Final = 6_000


def outage_grace_ms(lease_ms: int) -> int:
    """How long after the backend answers again a watcher that saw it unavailable waits before
    taking over a run of a job with ``lease_ms``: its renewal interval plus a margin."""
    return lease_ms // 3 + OUTAGE_MARGIN_MS


OnTaken = Callable[[Job, Ticket, bool, int], None]
"""``on_taken(job, ticket, reserved, sent_ms)``: run a taken-over attempt (``reserved``: a
handler thread is set aside for it; ``sent_ms``: when the takeover was sent, monotonic)."""


@dataclass(eq=False)
class BackupWatcher:
    """Keeps a heap of watched runs by when to check them; one task for all of them."""

    backend: LeaseBackend
    clock: Clock
    instance: str
    jobs: Callable[[str], Job | None]
    on_taken: OnTaken
    counters: Counters
    threads: HandlerThreads
    _heap: list[tuple[int, int, str, str]] = field(default_factory=list, init=False)
    _watched: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    # A takeover whose answer was lost is retried with the same request (run id and token),
    # so the backend can recognise it as ours instead of spending an attempt.
    _requests: dict[tuple[str, str], TakeoverRequest] = field(default_factory=dict, init=False)
    _seq: int = field(default=0, init=False)
    # The backend failed a call since (monotonic ms; None: it answers), and when it answered
    # again after one: checks wait for outage_grace_ms() after that.
    # A single failed call may be a lost answer: only a probe that fails too makes an outage.
    _down_since: int | None = field(default=None, init=False)
    _outage: bool = field(default=False, init=False)
    _recovered_at: int | None = field(default=None, init=False)
    _closed: bool = field(default=False, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _checks: set[asyncio.Future[None]] = field(default_factory=set, init=False)
    # Made by run(), in the loop it runs on (a scheduler may start again in another loop).
    _gate: asyncio.Semaphore | None = field(default=None, init=False)
    on_exhausted: Callable[[Job, Run], None] | None = field(default=None, init=False)
    """Set by the scheduler: a run this instance recorded failed on its last attempt (the
    job's ``on_failure`` hook)."""

    def watch(
        self, job: str, slot_key: str, expires_at_ms: int | None, backend_now_ms: int | None
    ) -> None:
        """Watch ``(job, slot_key)``; check it when its lease should have ended."""
        now = self.clock.monotonic_ms()
        if expires_at_ms is not None and backend_now_ms is not None:
            due = now + max(0, expires_at_ms - backend_now_ms) + EXPIRY_MARGIN_MS
        else:
            due = now + RETRY_MS
        poll = self.backend.release_poll_ms
        if poll is not None:
            due = min(due, now + poll)
        self._schedule(job, slot_key, due)

    def poke(self, job: str, slot_key: str, released: bool = True) -> None:
        """The backend says ``(job, slot_key)`` was released (check it now) or finished (stop
        watching it, without asking the backend)."""
        if (job, slot_key) not in self._watched:
            # A hand-over nobody here watched (this instance began carrying the job after the
            # run started, or no claim of it was made here: a manual run): check it now.
            if released and not self._closed and self.jobs(job) is not None:
                self._schedule(job, slot_key, self.clock.monotonic_ms())
            return
        if released:
            self._schedule(job, slot_key, self.clock.monotonic_ms())
        else:
            self._forget(job, slot_key)

    def follow(self, job: str, slot_key: str) -> None:
        """This instance's own attempt of ``(job, slot_key)`` was lost (a renewal refused, a
        lease that ran out): watch the slot, so a newer attempt whose runner stops too is taken
        over, or this one if nobody took it over (any thread is wrong: call on the loop)."""
        if self._closed or self.jobs(job) is None or (job, slot_key) in self._watched:
            return
        self._schedule(job, slot_key, self.clock.monotonic_ms() + RETRY_MS)

    async def adopt(
        self, jobs: Sequence[Job], now_ms: int, skip: Container[str] = (), quiet: bool = False
    ) -> None:
        """Watch the runs of ``jobs`` still recorded running that started within each job's
        ``catch_up_window_ms`` before ``now_ms`` (the backend's clock): runs that began before
        this instance carried the job, which no claim of its own lost to
        (:meth:`~anarchon.backend.LeaseBackend.open_runs`, :data:`ADOPT_PART` jobs a call).
        Each is checked at once; a live lease answers held and is watched until it ends. A
        run the backend names no key for is left alone, and so are the runs whose ids are in
        ``skip`` (those this instance runs); jobs whose runs cannot be read are logged and left
        to the instances that watch them. Only runs not watched yet are logged; ``quiet``: the
        periodic pass, which logs a failure to read at debug level only."""
        for first in range(0, len(jobs), ADOPT_PART):
            part = {job.name: job for job in jobs[first : first + ADOPT_PART]}
            since = now_ms - max(job.policy.catch_up_window_ms for job in part.values())
            try:
                runs = await self.backend.open_runs(list(part), since)
            except AnarchonError as exc:
                self._saw_outage()
                logger.log(
                    logging.DEBUG if quiet else logging.WARNING,
                    "could not read the open runs of %d job(s) (%s%s) to watch them: %s",
                    len(part),
                    next(iter(part)),
                    f" and {len(part) - 1} more" if len(part) > 1 else "",
                    exc,
                    extra=log_fields(Action.ADOPT_FAILED),
                )
                continue
            if self._closed:
                return
            keys: dict[str, list[str]] = {}
            for run in runs:
                job = part.get(run.job)
                if job is None or run.slot_key is None or self.jobs(run.job) is not job:
                    continue
                if run.run_id in skip or (run.job, run.slot_key) in self._watched:
                    continue
                if run.started_at.timestamp() * 1000 >= now_ms - job.policy.catch_up_window_ms:
                    keys.setdefault(run.job, []).append(run.slot_key)
            for name, found in keys.items():
                for slot_key in found:
                    self._schedule(name, slot_key, self.clock.monotonic_ms())
                logger.info(
                    "watching %d run(s) of %s still open%s: %s",
                    len(found),
                    name,
                    " (their leases may have ended unwatched)"
                    if quiet
                    else " from before this instance carried it",
                    ", ".join(found),
                    extra=log_fields(Action.RUNS_ADOPTED, name, runs=len(found)),
                )

    def watching(self) -> bool:
        """Whether any run is watched: a cheap test before posting a :meth:`poke` to the
        loop (safe from another thread: one read of the dict's size). A notice that arrives
        just before its run is watched is not lost: the watch checks at the lease's end."""
        return bool(self._watched)

    def __len__(self) -> int:
        return len(self._watched)

    def _forget(self, job: str, slot_key: str) -> None:
        self._watched.pop((job, slot_key), None)
        self._requests.pop((job, slot_key), None)

    def _schedule(self, job: str, slot_key: str, due: int) -> None:
        self._seq += 1
        self._watched[(job, slot_key)] = self._seq
        heapq.heappush(self._heap, (due, self._seq, job, slot_key))
        if self._heap[0][1] == self._seq:
            self._wake.set()

    async def run(self) -> None:
        """Check watched runs as they come due, until cancelled."""
        self._gate = asyncio.Semaphore(MAX_CHECKS)
        while True:
            now = self.clock.monotonic_ms()
            while self._heap and self._heap[0][0] <= now:
                _, seq, job, slot_key = heapq.heappop(self._heap)
                if self._watched.get((job, slot_key)) == seq:
                    check = asyncio.ensure_future(self._check(job, slot_key))
                    self._checks.add(check)
                    check.add_done_callback(self._checks.discard)
            delay = (self._heap[0][0] - now) / 1000 if self._heap else 30.0
            self._wake.clear()
            await sleep_or_wake(self.clock.sleep(min(delay, 30.0)), self._wake)

    def _request(self, job: Job, slot_key: str) -> TakeoverRequest:
        key = (job.name, slot_key)
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = TakeoverRequest(
                job=job.name,
                slot_key=slot_key,
                run_id=os.urandom(16).hex(),
                token=os.urandom(16).hex(),
                instance=self.instance,
                lease_ms=job.policy.lease_ms,
                max_attempts=job.policy.max_attempts,
                history_ttl_ms=job.policy.history_ttl_ms,
            )
        return request

    async def _check(self, job_name: str, slot_key: str) -> None:
        assert self._gate is not None, "checks are made by run()"
        async with self._gate:
            if (job_name, slot_key) in self._watched:  # else it ended while the check waited
                await self._check_now(job_name, slot_key)

    async def _check_now(self, job_name: str, slot_key: str) -> None:
        job = self.jobs(job_name)
        if job is None:
            self._forget(job_name, slot_key)
            return
        # A plain handler needs a thread: without one free, this instance does not take the
        # run over (it would hold the lease of a run that cannot start); others may.
        reserved = False
        if not job.is_async:
            reserved = self.threads.reserve()
            if not reserved:
                self.counters.no_thread += 1
                logger.debug(
                    "not taking over %s %s now: every handler thread is busy (max_workers=%d)",
                    job_name,
                    slot_key,
                    self.threads.max_workers,
                    extra=log_fields(Action.NO_THREAD, job_name, _slot_of(slot_key)),
                )
                self._schedule(job_name, slot_key, self.clock.monotonic_ms() + RETRY_MS)
                return
        try:
            if not await self._calm(job, slot_key):
                return
            request = self._request(job, slot_key)
            sent = self.clock.monotonic_ms()
            try:
                outcome = await self.backend.take_over(request)
            except BackendError as exc:
                self._saw_outage()
                logger.warning(
                    "checking %s %s failed, retrying with the same request: %s",
                    job_name,
                    slot_key,
                    exc,
                    extra=log_fields(Action.TAKEOVER_RETRY, job_name, _slot_of(slot_key)),
                )
                self._schedule(job_name, slot_key, self.clock.monotonic_ms() + RETRY_MS)
                return
            if self._decide(job, slot_key, outcome, sent, reserved):
                reserved = False  # passed on with the taken run
        finally:
            if reserved:
                self.threads.unreserve()

    def _saw_outage(self) -> None:
        if self._down_since is None:
            self._down_since = self.clock.monotonic_ms()

    async def _calm(self, job: Job, slot_key: str) -> bool:
        """Whether a takeover may be sent now: the backend answers and no outage's grace is
        under way. If not, the check is scheduled again (at the grace's end)."""
        now = self.clock.monotonic_ms()
        if self._down_since is not None:
            try:
                # A cheap read that reaches the store (nothing opened tomorrow): does it answer?
                await self.backend.open_runs([job.name], self.clock.now_ms() + 86_400_000)
            except AnarchonError:
                self._outage = True
                self._schedule(job.name, slot_key, self.clock.monotonic_ms() + RETRY_MS)
                return False
            now = self.clock.monotonic_ms()
            if self._down_since is not None and not self._outage:
                self._down_since = None  # one failed call: a lost answer, retried at once
            elif self._down_since is not None:
                self._down_since = None
                self._outage = False
                self._recovered_at = now
                logger.debug(
                    "the backend answers again: runs whose leases ended meanwhile are taken "
                    "over after their holders' grace",
                    extra=log_fields(Action.BACKEND_RECOVERED, job.name),
                )
        if self._recovered_at is not None:
            calm = self._recovered_at + outage_grace_ms(job.policy.lease_ms)
            if now < calm:
                self._schedule(job.name, slot_key, calm)
                return False
        return True

    def _decide(
        self, job: Job, slot_key: str, outcome: TakeoverOutcome, sent: int, reserved: bool
    ) -> bool:
        """Act on a takeover's answer; True if a run was started (it keeps the reservation)."""
        job_name = job.name
        if outcome.status is TakeoverStatus.HELD:
            self._requests.pop((job_name, slot_key), None)
            self.watch(job_name, slot_key, outcome.lease_expires_at_ms, outcome.backend_now_ms)
            return False
        self._forget(job_name, slot_key)
        if outcome.status in _RECORDS_FAILED:
            # This takeover recorded the attempt it ended failed (handed over, lease lost, or
            # its last attempt): a run's result in history, counted by the instance that wrote it.
            self.counters.count_run(RunStatus.FAILED, job_name)
        if outcome.status is TakeoverStatus.TAKEN:
            assert outcome.ticket is not None
            self.counters.count(job_name, "taken_over")
            logger.warning(
                "took over %s %s as attempt %d (fence %s)",
                job_name,
                slot_key,
                outcome.ticket.attempt,
                outcome.ticket.fence,
                extra=log_fields(Action.TAKEN_OVER, ticket=outcome.ticket),
            )
            self.on_taken(job, outcome.ticket, reserved, sent)
            return True
        if outcome.status is TakeoverStatus.EXHAUSTED:
            logger.error(
                "%s %s: lease expired on its last attempt; recorded failed",
                job_name,
                slot_key,
                extra=log_fields(Action.ATTEMPTS_EXHAUSTED, job_name, _slot_of(slot_key)),
            )
            if self.on_exhausted is not None and outcome.run is not None:
                self.on_exhausted(job, outcome.run)
        return False

    async def close(self, settle_s: float) -> None:
        """Stop checking (on stop): wait up to ``settle_s`` for checks in flight, so a takeover
        the backend granted is run or handed over rather than left to expire, then forget
        every watched run."""
        self._closed = True
        self._watched.clear()
        self._heap.clear()
        if self._checks:
            await asyncio.wait(list(self._checks), timeout=settle_s)
        for check in list(self._checks):
            check.cancel()
        self._requests.clear()


def _slot_of(slot_key: str) -> int | None:
    """The slot (epoch ms) a takeover's slot key names; None for a manual run's."""
    return int(slot_key) if slot_key.isdigit() else None
