"""The request poller: runs the cluster's run requests (triggers and retries) on this instance.

About once every ``control_poll_ms`` it reads the requests of the jobs this instance carries
from the backend's :class:`~anarchon.control.ControlStore`. Each request that is due on the
backend's clock is claimed through the ordinary claim path under the request's key, with the
request's id as the run id: the backend decides, as for any slot, which one instance runs it.
What is won runs like any other run (lease, keeper, result, drain, takeovers). Once the claim is
decided (won, lost or skipped) the request is removed; a claim that could not be decided (the
backend unavailable) is tried again at the next poll with the same run id and token, so a claim
whose answer was lost is recognised as this instance's.

It runs as a task of its own: no scheduled claim waits on it. A control store that fails is
logged once per outage (``control_unavailable``) and once when it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from ._claims import Claims
from ._clock import BackendTime, Clock
from ._job import Job
from ._metrics import Counters
from ._options import Bound
from ._threads import HandlerThreads
from .backend import ClaimOutcome, ClaimRequest, ClaimStatus
from .control import ControlStore, RunRequest
from .errors import AnarchonError
from .logs import Action, log_fields

__all__ = ["CONTROL_POLL", "DEFAULT_CONTROL_POLL_MS", "RequestPoller"]

logger = logging.getLogger("anarchon.scheduler")

DEFAULT_CONTROL_POLL_MS: Final = 1_000
CONTROL_POLL: Final = Bound(100, 60_000, ms=True)
"""The range of the Scheduler's ``control_poll_ms``."""
# A poll's claims are retried (backend unavailable) this long, then left to the next poll (s).
CLAIM_DEADLINE_S: Final = 1.0


@dataclass(eq=False)
class RequestPoller:
    """Reads due run requests and claims them, one poll at a time, on a task of its own."""

    store: ControlStore
    clock: Clock
    backend_time: BackendTime
    jobs: Callable[[], Mapping[str, Job]]
    """The jobs carried here, by name (the scheduler's own table: read, never copied)."""
    claims: Claims
    threads: HandlerThreads
    counters: Counters
    interval_ms: int = DEFAULT_CONTROL_POLL_MS
    _failing: bool = field(default=False, init=False)
    _stopping: bool = field(default=False, init=False)
    _polling: bool = field(default=False, init=False)
    # Claims not decided yet (the backend unavailable), kept to be retried with the same token.
    _pending: dict[str, ClaimRequest] = field(default_factory=dict, init=False)
    # Requests whose claim was decided but whose removal failed: removed again, not claimed.
    _decided: set[str] = field(default_factory=set, init=False)
    # The (job, kind) pairs ever seen pending: each stays in the gauge, at 0 once none is.
    _seen: set[tuple[str, str]] = field(default_factory=set, init=False)

    async def run(self) -> None:
        """Poll until :meth:`stop` (or cancelled)."""
        while not self._stopping:
            self._polling = True
            try:
                await self.poll()
            finally:
                self._polling = False
            if self._stopping:
                return
            await self.clock.sleep(self.interval_ms / 1000)

    async def stop(self, task: asyncio.Future[None], settle_s: float) -> None:
        """Stop polling: a poll in flight gets up to ``settle_s`` to finish (so a request won
        is run or handed over), then ``task`` is cancelled; a sleeping one at once."""
        self._stopping = True
        if self._polling and not task.done():
            await asyncio.wait([task], timeout=settle_s)
        task.cancel()

    async def poll(self) -> None:
        """Read the due requests of the jobs carried here once, claim them and act."""
        if not self.jobs():
            return
        try:
            # Every stored request, filtered here: the store holds few, and naming thousands of
            # carried jobs in the query every second would cost more than the answer.
            requests = await self.store.requests()
        except AnarchonError as exc:
            self.counters.pending_requests = None
            self._outage(exc)
            return
        self._recovered()
        # The gauge of pending requests (metrics, Prometheus): what this read found, so a
        # scrape costs what the requests are, and never reads the store. A (job, kind) seen
        # pending once keeps its series at 0 afterwards: a series that vanished instead of
        # dropping to 0 would break rate() and the alerts on it (Prometheus's practice).
        counts = Counter((r.job, r.kind) for r in requests)
        self._seen.update(counts)
        self.counters.pending_requests = {pair: counts[pair] for pair in self._seen}
        table = self.jobs()
        # The requested jobs only (a poll costs what the requests are, not what the jobs are),
        # kept: the claims below await, and jobs may change meanwhile.
        jobs = {r.job: table[r.job] for r in requests if r.job in table}
        listed = {r.id for r in requests}
        self._decided &= listed
        for stale in set(self._pending) - listed:
            del self._pending[stale]
        now = self.backend_time.now_ms()
        due = [r for r in requests if r.due_ms <= now and r.job in jobs]
        for request in [r for r in due if r.id in self._decided]:
            await self._done(request)
        await self._claim([r for r in due if r.id not in self._decided], jobs)

    async def _claim(self, due: list[RunRequest], jobs: dict[str, Job]) -> None:
        claims: list[ClaimRequest] = []
        reserved: set[str] = set()
        for request in due:
            job = jobs[request.job]
            if not job.is_async:
                # A plain handler needs a thread before a lease is taken; without one this
                # instance leaves the request to others (or to its next poll).
                if not self.threads.reserve():
                    continue
                reserved.add(request.id)
            claims.append(self._claim_request(job, request))
        if not claims:
            return
        by_id = {r.id: r for r in due}
        # The claims are acted on as fired slots are (runs started, threads given back); a
        # request whose claim was decided, run or not (refused for good), is removed.
        for sent_request, outcome, _ in await self.claims.fire(claims, reserved, CLAIM_DEADLINE_S):
            request = by_id[sent_request.run_id]
            if isinstance(outcome, ClaimOutcome) and outcome.status is ClaimStatus.WON:
                self.counters.requests_run += 1
                logger.info(
                    "running %s request %s of %s (asked by %s)",
                    request.trigger.value,
                    request.id,
                    request.job,
                    request.requested_by,
                    extra=log_fields(
                        Action.REQUEST_CLAIMED,
                        request.job,
                        request.slot,
                        request=request.id,
                        trigger=request.trigger.value,
                        requested_by=request.requested_by,
                    ),
                )
            self._decided.add(request.id)
            self._pending.pop(request.id, None)
            await self._done(request)

    def _claim_request(self, job: Job, request: RunRequest) -> ClaimRequest:
        """The claim of ``request``: the same one again while it is undecided."""
        kept = self._pending.get(request.id)
        if kept is None:
            kept = self._pending[request.id] = replace(
                self.claims.request(job, request.slot, request.trigger),
                run_id=request.id,
                key=request.key,
                requested_by=request.requested_by,
            )
        return kept

    async def _done(self, request: RunRequest) -> None:
        try:
            await self.store.done(request.id)
        except AnarchonError as exc:
            self._outage(exc)
        else:
            self._decided.discard(request.id)

    def _outage(self, exc: AnarchonError) -> None:
        if self._failing:
            return
        self._failing = True
        logger.warning(
            "reading run requests (triggers, retries) failed: %s; retrying every %d ms "
            "(scheduled slots are not affected)",
            exc,
            self.interval_ms,
            extra=log_fields(Action.CONTROL_UNAVAILABLE),
        )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            logger.info(
                "run requests can be read again", extra=log_fields(Action.CONTROL_RECOVERED)
            )
