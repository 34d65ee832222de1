"""The claim function of schema version 4: the migration from version 3 (data kept, instances
migrating at once), an instance of version 3 claiming beside it, and the recorded-slot answer
that locks no row."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from anarchon import BackendUnavailable, RunStatus
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._queries import Names, Queries
from anarchon.backends.postgres._rows import (
    claim_batch_params,
    claim_one_params,
    claim_outcome,
    claim_params,
)
from tests.backends.postgres import DSN, migrate_to
from tests.records import claim_request

SLOT = 1_800_000_000_000
Make = Callable[..., PostgresBackend]


async def _versions(schema: str) -> list[int]:
    table = sql.Identifier(schema, "anarchon_schema_version")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(sql.SQL("SELECT version FROM {} ORDER BY 1").format(table))
        return [v for (v,) in await cur.fetchall()]


async def _make_version_3(schema: str) -> None:
    """The tables as a scheduler of schema version 3 left them, with one run recorded."""
    q = Queries(Names(schema, "anarchon_"))
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await migrate_to(conn, q, 3)
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance, trigger,"
                " status, fence, started_at, finished_at, requested_by)"
                " VALUES ('job', %s, 1, %s, 'old', 't', 'i0', 'schedule', 'succeeded', 7, 5, 6,"
                " NULL)"
            ).format(sql.Identifier(schema, "anarchon_runs")),
            (str(SLOT), SLOT),
        )
        await conn.execute(
            sql.SQL("INSERT INTO {} (job, fence) VALUES ('job', 7)").format(
                sql.Identifier(schema, "anarchon_jobs")
            )
        )


async def test_a_version_3_schema_is_migrated_once_by_instances_starting_at_once(
    make: Make, schema: str
) -> None:
    await _make_version_3(schema)
    backends = [make() for _ in range(4)]
    await asyncio.gather(*(b.start() for b in backends))
    assert await _versions(schema) == [1, 2, 3, 4]
    [old] = await backends[0].history("job")
    assert (old.run_id, old.status, old.slot_ms) == ("old", RunStatus.SUCCEEDED, SLOT)
    # The recorded slot is answered from its record; the next slot is won, with a higher fence.
    recorded, fresh = await backends[1].claim(
        [claim_request("job", SLOT, "i1"), claim_request("job", SLOT + 60_000, "i1")]
    )
    assert recorded.status is ClaimStatus.LOST and recorded.run.run_id == "old"
    assert fresh.status is ClaimStatus.WON and fresh.ticket is not None
    assert (fresh.ticket.fence or 0) > 7
    await backends[2].stop()
    await backends[2].start()  # again: nothing to migrate
    assert await _versions(schema) == [1, 2, 3, 4]


async def _claim_as_version_3(
    conn: psycopg.AsyncConnection[Any], q: Queries, req: ClaimRequest
) -> ClaimStatus:
    """One claim as a scheduler of schema version 3 makes it: lock_jobs, then the decision, in
    one READ COMMITTED transaction (no function, no advisory lock)."""
    async with conn.transaction():
        await conn.execute(q["read_committed"])
        await conn.execute(q["lock_jobs"], {"jobs": [req.job]})
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(q["claim_decide"], claim_params([req], q.names.channel, later=False))
        [row] = await cur.fetchall()
    return claim_outcome(req, row).status


async def test_an_instance_of_version_3_and_one_of_version_4_elect_one_winner(
    make: Make, schema: str
) -> None:
    backend = make()
    await backend.start()
    q = Queries(Names(schema, "anarchon_"))
    async with await psycopg.AsyncConnection.connect(DSN) as conn:
        for n in range(20):
            slot = SLOT + n * 60_000
            old, [new] = await asyncio.gather(
                _claim_as_version_3(conn, q, claim_request("job", slot, "old")),
                backend.claim([claim_request("job", slot, "new")]),
            )
            assert sorted([old.value, new.status.value]) == ["lost", "won"], (n, old, new)
    runs = await backend.history("job", limit=100)
    assert len(runs) == 20 and len({r.slot_ms for r in runs}) == 20


async def test_a_recorded_slot_is_answered_without_waiting_for_the_job_lock(
    make: Make, schema: str
) -> None:
    winner, loser = make(), make(timeout_ms=1_000)
    await winner.start()
    await loser.start()
    [won] = await winner.claim([claim_request("job", SLOT, "i1")])
    assert won.status is ClaimStatus.WON
    async with await psycopg.AsyncConnection.connect(DSN) as holder:
        # A takeover or result of the job holding its row, as long as it likes.
        await holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE job = 'job' FOR UPDATE").format(
                sql.Identifier(schema, "anarchon_jobs")
            )
        )
        [late] = await loser.claim([claim_request("job", SLOT, "i2")])
        assert late.status is ClaimStatus.LOST and late.run.run_id == won.run.run_id
        # A slot not recorded yet still waits for the row: the lock decides, not the record.
        with pytest.raises(BackendUnavailable, match="timeout_ms=1000"):
            await loser.claim([claim_request("job", SLOT + 60_000, "i2")])
        await holder.rollback()


async def test_a_claim_queued_on_its_jobs_row_decides_on_what_the_holder_committed(
    make: Make, schema: str
) -> None:
    # One request locks its job's row by taking the next fence (take_fence), then decides in a
    # statement of its own: a claim of version 3 holding the row records the slot and raises
    # the fence meanwhile; the waiting claim answers from that record (not a key conflict),
    # and the next slot's winner gets a fence above the one the holder wrote.
    backend = make(timeout_ms=3_000)
    await backend.start()
    [first] = await backend.claim([claim_request("job", SLOT, "i1")])
    assert first.status is ClaimStatus.WON and first.ticket is not None
    q = Queries(Names(schema, "anarchon_"))
    held = claim_request("job", SLOT + 60_000, "old")
    fence = (first.ticket.fence or 0) + 10**9
    async with await psycopg.AsyncConnection.connect(DSN) as holder:
        await holder.execute(q["lock_jobs"], {"jobs": ["job"]})
        waiting = asyncio.create_task(
            backend.claim([dataclasses.replace(held, run_id="new", token="new", instance="i2")])
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        jobs, runs = (sql.Identifier(schema, f"anarchon_{t}") for t in ("jobs", "runs"))
        await holder.execute(
            sql.SQL(
                "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance, trigger,"
                " status, fence, started_at, lease_expires_at)"
                " VALUES ('job', %s, 1, %s, 'old', 'old', 'old', 'schedule', 'running', %s, 1,"
                " 1)"
            ).format(runs),
            (str(held.slot), held.slot, fence),
        )
        await holder.execute(sql.SQL("UPDATE {} SET fence = %s").format(jobs), (fence,))
        await holder.commit()
        [answer] = await waiting
    assert answer.status is ClaimStatus.LOST and answer.run is not None
    assert (answer.run.run_id, answer.run.fence) == ("old", fence)
    [after] = await backend.claim([claim_request("job", SLOT + 120_000, "i2")])
    assert after.status is ClaimStatus.WON and after.ticket is not None
    assert (after.ticket.fence or 0) > fence


async def test_a_claim_reads_a_few_pages_whatever_the_history_of_its_job(
    make: Make, schema: str
) -> None:
    # The claim function keeps generic plans for its session, made at its first call: here on
    # an empty table. A lookup of the slot's record that took runs_recorded (job) read the
    # job's whole history, fetching each run to compare its slot key, at every claim.
    backend = make()
    await backend.start()
    q = backend._queries
    runs = sql.Identifier(schema, "anarchon_runs")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        plain = conn.cursor(row_factory=dict_row)
        for slot in (SLOT, SLOT + 60_000):
            req = claim_request("job", slot, "i1")
            params = claim_one_params(req, q.names.channel, later=False)
            if slot > SLOT:
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance,"
                        " trigger, status, fence, started_at, finished_at)"
                        " SELECT 'job', (%s - n * 60000)::text, 1, %s - n * 60000, 'r' || n,"
                        " 't', 'i0', 'schedule', 'succeeded', n, n, n"
                        " FROM generate_series(1, 10000) n"
                    ).format(runs),
                    (SLOT, SLOT),
                )
                explain = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q["claim_one"]
                await plain.execute(explain, params)
                [row] = await plain.fetchall()
                [plan] = row["QUERY PLAN"]
                top = plan["Plan"]
                pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
                # 24 by the primary key; about 300 through runs_recorded (10 000 runs)
                assert pages < 100, pages
            else:
                await plain.execute(q["claim_one"], params)
                [row] = await plain.fetchall()
                assert claim_outcome(req, row).status is ClaimStatus.WON
    [newest] = await backend.history("job", limit=1)
    assert newest.slot_ms == SLOT + 60_000 and newest.instance == "i1"


@pytest.mark.parametrize("batch", [False, True])
async def test_claims_of_a_job_queue_on_its_advisory_lock(
    make: Make, schema: str, batch: bool
) -> None:
    # One request takes its job's lock by a plain expression, a batch by a query over its
    # jobs: the same key, so each waits for the other. Held elsewhere, the lock keeps even a
    # recorded slot's claim waiting; another job's claim goes on.
    winner, waiting = make(), make(timeout_ms=1_000)
    await winner.start()
    await waiting.start()
    [won] = await winner.claim([claim_request("job", SLOT, "i1")])
    assert won.status is ClaimStatus.WON
    key = f"anarchon claims {schema}.anarchon_ job"
    async with await psycopg.AsyncConnection.connect(DSN) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])
        again = [claim_request("job", SLOT, "i2")]
        if batch:
            again.append(claim_request("other", SLOT, "i2"))
        with pytest.raises(BackendUnavailable, match="timeout_ms=1000"):
            await waiting.claim(again)
        [other] = await waiting.claim([claim_request("other", SLOT + 60_000, "i2")])
        assert other.status is ClaimStatus.WON
        await holder.rollback()
    answers = await waiting.claim(again)
    assert answers[0].status is ClaimStatus.LOST and answers[0].run.run_id == won.run.run_id


async def test_a_claim_answered_from_the_records_takes_no_transaction_id(
    make: Make, schema: str
) -> None:
    # No transaction id, no commit record to flush: the losers of a race commit at no cost.
    backend = make()
    await backend.start()
    [won] = await backend.claim([claim_request("job", SLOT, "i1")])
    q = backend._queries

    async def xid_after(req: ClaimRequest) -> tuple[str, Any]:
        async with await psycopg.AsyncConnection.connect(DSN) as conn:
            params = claim_batch_params([req], q.names.channel, later=False)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q["claim"], params)
            [row] = await cur.fetchall()
            xid = await conn.execute("SELECT pg_current_xact_id_if_assigned()")
            found = await xid.fetchone()
            await conn.rollback()
        assert found is not None
        return claim_outcome(req, row).status, found[0]

    assert await xid_after(claim_request("job", SLOT, "i2")) == (ClaimStatus.LOST, None)
    status, xid = await xid_after(claim_request("job", SLOT + 60_000, "i2"))
    assert status is ClaimStatus.WON and xid is not None
    assert won.status is ClaimStatus.WON


async def test_a_generic_claim_plan_made_on_empty_tables_looks_rows_up_by_index(
    make: Make, schema: str
) -> None:
    # The function keeps a generic plan of claim_decide for its session, made at its first call:
    # on a fresh install, over empty tables. A plan that hashed whole tables then (the records'
    # check, the jobs and pruned joins) went on scanning them as they grew: 240 ms a claim
    # after 100 000 runs were added, against 8 ms for a new session's plan.
    from tests.postgres.test_plans import _explain_generic, _scans_of

    backend = make()
    await backend.start()
    q = backend._queries
    params = claim_params([claim_request("job", SLOT, "i1")], q.names.channel, later=True)
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        plan = await _explain_generic(conn, q["claim_decide"], params)
    for table in ("anarchon_runs", "anarchon_jobs", "anarchon_pruned"):
        scans = _scans_of(plan, table)
        assert scans, f"the claim does not read {table}?\n{plan}"
        assert not any(s.startswith("Seq Scan") for s in scans), (table, scans)


@pytest.mark.parametrize("later", [True, False])
def test_claim_one_is_given_what_claim_is_given_for_one_request(later: bool) -> None:
    req = claim_request("job", SLOT, "i1")
    skipped = dataclasses.replace(req, skip_reason="too late")
    for r in (req, skipped):
        arrays = claim_params([r], "chan", later=later)
        # Only "later" differs: with notices sent after COMMIT, a claim of one request keeps
        # none (NULL) and the backend sends a winner's own (notify_claim).
        assert claim_one_params(r, "chan", later=later) == {
            k: v if k == "channel" else (None if later else False) if k == "later" else v[0]
            for k, v in arrays.items()
        }


def test_claim_batch_params_hold_what_claim_params_hold() -> None:
    import json

    reqs = [claim_request("job", SLOT, "i1"), claim_request("j\u00e9b \"'{,}\\", SLOT + 1, "i2")]
    reqs[1] = dataclasses.replace(reqs[1], skip_reason="too late", requested_by="ops")
    arrays = claim_params(reqs, "chan", later=True)
    batch = claim_batch_params(reqs, "chan", later=True)
    assert batch["channel"] == "chan" and batch["later"] is True
    fields = [k for k in arrays if k not in ("channel", "later")]
    assert json.loads(batch["batch"]) == {f: arrays[f] for f in fields}


async def test_the_claim_statement_reads_back_every_value_of_a_batch(make: Make) -> None:
    # The JSON the claim statement unpacks: odd characters, NULLs and numbers come back as sent.
    backend = make()
    await backend.start()
    reqs = [
        dataclasses.replace(claim_request(job, SLOT, "i\u00e9 \"'{,}\\"), requested_by=by)
        for job, by in (("j\u00e9b \"'{,}\\", None), ("job2", "ops \u2603"))
    ]
    outcomes = await backend.claim(reqs)
    for req, outcome in zip(reqs, outcomes, strict=True):
        assert outcome.status is ClaimStatus.WON and outcome.run is not None
        assert (outcome.run.job, outcome.run.instance) == (req.job, req.instance)
        assert outcome.run.requested_by == req.requested_by
        assert outcome.ticket is not None and outcome.ticket.slot == SLOT
    [recorded] = await backend.history(reqs[0].job, limit=1)
    assert (recorded.run_id, recorded.instance) == (reqs[0].run_id, reqs[0].instance)
