"""Backup runners: watch runs other instances hold, and take over those whose lease ends."""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
from collections.abc import Callable

from ._clock import Clock, sleep_or_wake
from ._job import Job
from .backend import LeaseBackend, TakeoverRequest, TakeoverStatus, Ticket
from .errors import BackendError

__all__ = ["BackupWatcher"]

logger = logging.getLogger("anarchon.scheduler")

# Check this long after the expiry the backend announced, so the backend surely sees it expired.
EXPIRY_MARGIN_MS = 50
RETRY_MS = 1_000


class BackupWatcher:
    """Keeps a heap of watched runs by when to check them; one task for all of them."""

    def __init__(
        self,
        backend: LeaseBackend,
        clock: Clock,
        instance: str,
        jobs: Callable[[str], Job | None],
        on_taken: Callable[[Job, Ticket], None],
        counters: dict[str, int],
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._instance = instance
        self._jobs = jobs
        self._on_taken = on_taken
        self._counters = counters
        self._heap: list[tuple[int, int, str, str]] = []
        self._watched: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._wake = asyncio.Event()
        self._checks: set[asyncio.Future[None]] = set()

    def watch(
        self, job: str, slot_key: str, expires_at_ms: int | None, backend_now_ms: int | None
    ) -> None:
        """Watch ``(job, slot_key)``; check it when its lease should have ended."""
        now = self._clock.now_ms()
        if expires_at_ms is not None and backend_now_ms is not None:
            due = now + max(0, expires_at_ms - backend_now_ms) + EXPIRY_MARGIN_MS
        else:
            due = now + RETRY_MS
        poll = self._backend.release_poll_ms
        if poll is not None:
            due = min(due, now + poll)
        self._schedule(job, slot_key, due)

    def poke(self, job: str, slot_key: str, released: bool = True) -> None:
        """The backend says ``(job, slot_key)`` was released (check it now) or finished (stop
        watching it, without asking the backend)."""
        if (job, slot_key) not in self._watched:
            return
        if released:
            self._schedule(job, slot_key, self._clock.now_ms())
        else:
            del self._watched[(job, slot_key)]

    def __len__(self) -> int:
        return len(self._watched)

    def _schedule(self, job: str, slot_key: str, due: int) -> None:
        self._seq += 1
        self._watched[(job, slot_key)] = self._seq
        heapq.heappush(self._heap, (due, self._seq, job, slot_key))
        if self._heap[0][1] == self._seq:
            self._wake.set()

    async def run(self) -> None:
        """Check watched runs as they come due, until cancelled."""
        while True:
            now = self._clock.now_ms()
            while self._heap and self._heap[0][0] <= now:
                _, seq, job, slot_key = heapq.heappop(self._heap)
                if self._watched.get((job, slot_key)) == seq:
                    check = asyncio.ensure_future(self._check(job, slot_key))
                    self._checks.add(check)
                    check.add_done_callback(self._checks.discard)
            delay = (self._heap[0][0] - now) / 1000 if self._heap else 30.0
            self._wake.clear()
            await sleep_or_wake(self._clock.sleep(min(delay, 30.0)), self._wake)

    async def _check(self, job_name: str, slot_key: str) -> None:
        job = self._jobs(job_name)
        if job is None:
            self._watched.pop((job_name, slot_key), None)
            return
        request = TakeoverRequest(
            job=job_name,
            slot_key=slot_key,
            run_id=os.urandom(16).hex(),
            token=os.urandom(16).hex(),
            instance=self._instance,
            lease_ms=job.policy.lease_ms,
            max_attempts=job.policy.max_attempts,
            history_ttl_ms=job.policy.history_ttl_ms,
        )
        try:
            outcome = await self._backend.take_over(request)
        except BackendError as exc:
            logger.warning(
                "checking %s %s failed, retrying: %s",
                job_name,
                slot_key,
                exc,
                extra={"job": job_name, "slot": slot_key, "action": "takeover_retry"},
            )
            self._schedule(job_name, slot_key, self._clock.now_ms() + RETRY_MS)
            return
        if outcome.status is TakeoverStatus.HELD:
            self.watch(job_name, slot_key, outcome.lease_expires_at_ms, outcome.backend_now_ms)
            return
        self._watched.pop((job_name, slot_key), None)
        extra = {"job": job_name, "slot": slot_key}
        if outcome.status is TakeoverStatus.TAKEN:
            assert outcome.ticket is not None
            self._counters["taken_over"] += 1
            logger.warning(
                "took over %s %s as attempt %d (fence %s)",
                job_name,
                slot_key,
                outcome.ticket.attempt,
                outcome.ticket.fence,
                extra={**extra, "action": "taken_over"},
            )
            self._on_taken(job, outcome.ticket)
        elif outcome.status is TakeoverStatus.EXHAUSTED:
            logger.error(
                "%s %s: lease expired on its last attempt; recorded failed",
                job_name,
                slot_key,
                extra={**extra, "action": "attempts_exhausted"},
            )

    def clear(self) -> None:
        """Forget every watched run and cancel checks in flight (on stop)."""
        self._watched.clear()
        self._heap.clear()
        for check in self._checks:
            check.cancel()
