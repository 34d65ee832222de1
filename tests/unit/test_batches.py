"""One job's bad request must not fail the claims, results or renewals of the other jobs in its
batch: a batch the backend refuses outright is split until only the bad item fails."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from anarchon import BackendError, BackendUnavailable, Run, RunContext, RunStatus, Scheduler
from anarchon.backend import ClaimOutcome, ClaimRequest, ClaimStatus, FinishRequest, Ticket
from anarchon.testing import FakeClock, MemoryBackend
from tests.unit.core_helpers import MINUTE, START

JOBS = ("alpha", "bad", "omega")


class OneBadJob(MemoryBackend):
    """Refuses, for good (not a transient error), any batch of ``call`` holding an item of job
    ``bad``, as a backend refuses a number out of its range."""

    def __init__(self, clock: FakeClock, call: str) -> None:
        super().__init__(clock=clock)
        self.call = call
        self.sizes: list[int] = []

    def _check(self, call: str, jobs: list[str]) -> None:
        if call == self.call:
            self.sizes.append(len(jobs))
            if "bad" in jobs:
                raise BackendError("integer out of range (job 'bad')")

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        self._check("claim", [r.job for r in requests])
        return await super().claim(requests)

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        self._check("finish", [item.ticket.job for item in items])
        return await super().finish_many(items)

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        self._check("renew", [t.job for t in tickets])
        return await super().renew_many(tickets)


@pytest.mark.parametrize("call", ["claim", "finish", "renew"])
async def test_one_bad_item_fails_alone(call: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(START)
    backend = OneBadJob(clock, call)
    contexts: dict[str, RunContext] = {}

    async def work(ctx: RunContext) -> None:
        contexts[ctx.job] = ctx
        await clock.sleep(3)  # three leases: renewed together, in one batch

    # grace_ms=0: a run still under way when the test is done is cancelled at once; the default
    # 30 s grace would pass in real time (stop()'s bound when nobody moves the test clock).
    scheduler = Scheduler(backend, clock=clock, grace_ms=0)
    for name in JOBS:
        scheduler.add(name, "0 * * * *", work, jitter_ms=0, lease_ms=1_000)
    caplog.set_level(logging.ERROR, "anarchon")
    async with scheduler:
        await clock.advance(60 * MINUTE + 5_000)
        history = {name: await scheduler.history(name) for name in JOBS}
    for good in ("alpha", "omega"):
        assert [(r.attempt, r.status) for r in history[good]] == [(1, RunStatus.SUCCEEDED)], call
        assert not contexts[good].lease_lost
    assert max(backend.sizes) == 3, "the three jobs were not in one batch"
    failed = [r for r in caplog.records if getattr(r, "action", None) == "batch_item_failed"]
    assert failed and {getattr(r, "job", None) for r in failed} == {"bad"}


class RefusesOneClaim(MemoryBackend):
    """Answers job ``bad``'s claim as a backend answers a value it cannot store: lost, with the
    error, while the other claims of the batch are decided as usual."""

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        outcomes = await super().claim([r for r in requests if r.job != "bad"])
        answers = iter(outcomes)
        out: list[ClaimOutcome] = []
        for request in requests:
            if request.job != "bad":
                out.append(next(answers))
                continue
            lost = Run(
                job=request.job,
                slot=None,
                run_id=request.run_id,
                instance=request.instance,
                trigger=request.trigger,
                attempt=1,
                status=RunStatus.SKIPPED,
                started_at=outcomes[0].run.started_at,
            )
            error = BackendError("lease_ms=... is out of range (job 'bad')")
            out.append(ClaimOutcome(status=ClaimStatus.LOST, run=lost, error=error))
        return out


async def test_a_claim_refused_alone_is_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(START)
    ran: list[str] = []

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.job)

    scheduler = Scheduler(RefusesOneClaim(clock=clock), clock=clock)
    for name in JOBS:
        scheduler.add(name, "0 * * * *", work, jitter_ms=0)
    caplog.set_level(logging.ERROR, "anarchon")
    async with scheduler:
        await clock.advance(60 * MINUTE + 1_000)
    assert sorted(ran) == ["alpha", "omega"]
    refused = [r for r in caplog.records if getattr(r, "action", None) == "claim_refused"]
    assert [getattr(r, "job", None) for r in refused] == ["bad"]
    assert "out of range" in refused[0].getMessage()
    assert scheduler.metrics()["claims_refused"] == 1


class ResultsDown(MemoryBackend):
    """Recording results fails (the backend is unreachable) while ``down`` is set."""

    down = True

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        if self.down:
            raise BackendUnavailable("results: connection refused")
        return await super().finish_many(items)


async def test_an_outage_of_results_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Fifty runs whose results fail together, several times each: one ``finish_retry``
    WARNING for the outage and one ``finish_recovered`` when results are recorded again, not
    one line per result and retry; every result is recorded."""
    clock = FakeClock(START)
    backend = ResultsDown(clock=clock)

    async def work(ctx: RunContext) -> None:
        pass

    scheduler = Scheduler(backend, clock=clock)
    names = [f"j{n}" for n in range(50)]
    for name in names:
        scheduler.add(name, "0 * * * *", work, jitter_ms=0)
    caplog.set_level(logging.WARNING, "anarchon")
    async with scheduler:
        await clock.advance(60 * MINUTE + 10_000)  # several retries of every result
        backend.down = False
        await clock.advance(30_000)
        history = {name: await scheduler.history(name) for name in names}
        metrics = scheduler.metrics()
    assert all([r.status for r in h] == [RunStatus.SUCCEEDED] for h in history.values())
    assert metrics["runs_succeeded"] == len(names)
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("finish_retry") == 1, actions
    [recovered] = [r for r in caplog.records if getattr(r, "action", None) == "finish_recovered"]
    assert getattr(recovered, "retries", 0) > len(names)
