"""Bursts on PostgreSQL: ten thousand runs due at once, claimed by three instances at once and
every result recorded.

Ten thousand results, one transaction each in one call, took longer than ``timeout_ms``: the
call was given up and retried, again and again, and none was recorded. Results are now grouped
(``FINISH_GROUP`` to a transaction, ``FINISH_CALL`` to a call)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

from anarchon import RunStatus
from anarchon.backend import ClaimStatus, FinishRequest
from anarchon.backends.postgres._backend import FINISH_CALL, FINISH_GROUP
from tests.backends.postgres import DSN
from tests.postgres.test_claim_paths import SLOT, poison, request
from tests.postgres.test_postgres import Make

BURST = 10_000

pytestmark = pytest.mark.timeout(300)


async def test_ten_thousand_results_at_once_are_all_recorded(make: Make, schema: str) -> None:
    claimer = make(timeout_ms=120_000)  # a busy test machine: the claims are not the subject
    await claimer.start()
    jobs = [f"b{n}" for n in range(BURST)]
    won = await claimer.claim([request(job=job) for job in jobs])
    backend = make()  # timeout_ms at its default
    await backend.start()
    assert {o.status for o in won} == {ClaimStatus.WON}
    # In an order that is not the jobs': results are grouped by job whatever order they come in.
    tickets = [o.ticket for o in won][::-1]
    results = await backend.finish_many(
        [FinishRequest(t, RunStatus.SUCCEEDED, None) for t in tickets]  # type: ignore[arg-type]
    )
    assert [getattr(r, "job", r) for r in results] == [t.job for t in tickets]  # type: ignore[union-attr]
    assert {getattr(r, "status", r) for r in results} == {RunStatus.SUCCEEDED}
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(
                sql.Identifier(schema, "anarchon_runs")
            )
        )
        assert dict(await cur.fetchall()) == {"succeeded": BURST}


async def test_a_failing_result_in_a_group_fails_alone(make: Make, schema: str) -> None:
    """One result the server refuses, in the middle of a group: the group is sent again one
    result per transaction; every other result of the call is recorded."""
    assert FINISH_CALL > FINISH_GROUP > 2
    backend = make()
    await backend.start()
    jobs = [f"a{n}" for n in range(FINISH_CALL + 10)]
    jobs[FINISH_GROUP + 3] = "poison"
    won = await backend.claim([request(SLOT, job=job) for job in jobs])
    await poison(schema, "UPDATE")
    results = await backend.finish_many(
        [FinishRequest(o.ticket, RunStatus.FAILED, "x") for o in won]  # type: ignore[arg-type]
    )
    refused = [job for job, r in zip(jobs, results, strict=True) if not hasattr(r, "status")]
    assert refused == ["poison"]
    assert {r.status for r in results if hasattr(r, "status")} == {RunStatus.FAILED}
    [run] = await backend.history("poison")
    assert run.status is RunStatus.RUNNING


async def test_three_instances_claiming_ten_thousand_jobs_at_once(make: Make) -> None:
    # Each batch is its own transaction over 10 000 jobs: the claim takes no lock per job in the
    # server's shared lock table (it holds about 64 per connection), which three such batches
    # at once would overflow ("out of shared memory").
    backends = [make(timeout_ms=120_000) for _ in range(3)]
    await asyncio.gather(*(b.start() for b in backends))
    jobs = [f"c{n}" for n in range(BURST)]
    batches = [[request(job=job, instance=f"i{k}") for job in jobs] for k in range(3)]
    answers = await asyncio.gather(*(b.claim(r) for b, r in zip(backends, batches, strict=True)))
    assert all(o.error is None for batch in answers for o in batch)
    for n in range(BURST):
        assert sorted(batch[n].status.value for batch in answers) == ["lost", "lost", "won"], n
