"""PostgreSQL claim paths (issue 11): every item of a batch decided on its own, results of two
instances pruning the same jobs in opposite orders, a server whose default isolation level is
REPEATABLE READ, and fences across a store that lost its data."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from anarchon import BackendError, LeaseLost, Overlap, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus, FinishRequest, TakeoverRequest, Ticket
from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN, drop_schema
from tests.postgres.test_postgres import Make

SLOT = 1_800_000_000_000


def request(slot: int = SLOT, job: str = "job", **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=kw.pop("instance", "i1"),
        trigger=Trigger.SCHEDULE,
        lease_ms=kw.pop("lease_ms", 60_000),
        **kw,
    )


def takeover(ticket: Ticket, instance: str) -> TakeoverRequest:
    return TakeoverRequest(
        job=ticket.job,
        slot_key=ticket.slot_key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=instance,
        lease_ms=60_000,
        max_attempts=3,
    )


async def poison(schema: str, when: str) -> None:
    """Make the server refuse every ``when`` (INSERT or UPDATE) of a run of job 'poison'."""
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'poisoned row' USING ERRCODE = '22023'; END $$"
            ).format(fn=sql.Identifier(schema, f"poison_{when.lower()}"))
        )
        await conn.execute(
            sql.SQL(
                "CREATE TRIGGER {name} BEFORE {when} ON {runs} FOR EACH ROW "
                "WHEN (NEW.job = 'poison') EXECUTE FUNCTION {fn}()"
            ).format(
                name=sql.Identifier(f"poison_{when.lower()}"),
                when=sql.SQL(when),
                runs=sql.Identifier(schema, "anarchon_runs"),
                fn=sql.Identifier(schema, f"poison_{when.lower()}"),
            )
        )


async def test_one_failing_item_fails_alone(make: Make, schema: str) -> None:
    backend = make()
    await backend.start()
    jobs = ["a", "b", "poison", "c", "d"]
    won = await backend.claim([request(job=j) for j in jobs])
    tickets = [o.ticket for o in won]
    assert all(t is not None for t in tickets)
    await poison(schema, "UPDATE")
    renewed = await backend.renew_many(tickets)  # type: ignore[arg-type]
    assert [isinstance(r, BackendError) for r in renewed] == [False, False, True, False, False]
    assert not isinstance(renewed[2], LeaseLost) and "poisoned row" in str(renewed[2])
    results = await backend.finish_many(
        [FinishRequest(t, RunStatus.SUCCEEDED, None) for t in tickets]  # type: ignore[arg-type]
    )
    statuses = [getattr(r, "status", type(r).__name__) for r in results]
    assert statuses == [RunStatus.SUCCEEDED] * 2 + ["BackendError"] + [RunStatus.SUCCEEDED] * 2
    for job in ("a", "b", "c", "d"):
        [run] = await backend.history(job)
        assert run.status is RunStatus.SUCCEEDED
    await poison(schema, "INSERT")
    claimed = await backend.claim([request(SLOT + 1000, job=j) for j in jobs])
    assert [o.status for o in claimed] == [ClaimStatus.WON] * 2 + [ClaimStatus.LOST] + [
        ClaimStatus.WON
    ] * 2
    assert claimed[2].error is not None and "poisoned row" in str(claimed[2].error)


async def test_results_pruning_the_same_jobs_in_opposite_orders(make: Make) -> None:
    """Two instances each finish one run of 40 jobs, in opposite job orders, while both prune
    the same old runs of each job (a TTL of 1 ms): no deadlock, every result recorded."""
    first, second = make(), make()
    await first.start()
    await second.start()
    jobs = [f"job{n:02d}" for n in range(40)]

    def done(outcomes: list[Any]) -> list[Any]:
        return [
            FinishRequest(
                dataclasses.replace(o.ticket, history_ttl_ms=1), RunStatus.SUCCEEDED, None
            )
            for o in outcomes
        ]

    for round_ in range(3):
        base = SLOT + round_ * 60_000
        for n in range(3):  # finished runs for both to prune
            won = await first.claim([request(base + n * 1000, job=j) for j in jobs])
            await first.finish_many(
                [FinishRequest(o.ticket, RunStatus.SUCCEEDED, None) for o in won]  # type: ignore[arg-type]
            )
        mine = await first.claim([request(base + 10_000, job=j) for j in jobs])
        theirs = await second.claim([request(base + 20_000, job=j, instance="i2") for j in jobs])
        await asyncio.sleep(0.01)
        results = await asyncio.gather(
            first.finish_many(done(mine)), second.finish_many(done(theirs)[::-1])
        )
        for batch in results:
            assert all(getattr(r, "status", None) is RunStatus.SUCCEEDED for r in batch), batch
    for job in jobs:
        assert len(await first.history(job)) <= 2


async def test_a_repeatable_read_server_default_changes_nothing(schema: str) -> None:
    """The backend sets READ COMMITTED itself: with REPEATABLE READ as the sessions' default,
    a backup that loses a takeover race is still told HELD and results are still pruned."""
    dsn = f"{DSN}?options=-c%20default_transaction_isolation%3Drepeatable%5C%20read"
    backends = [PostgresBackend(dsn, schema=schema, max_connections=2) for _ in range(5)]
    for b in backends:
        await b.start()
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SHOW default_transaction_isolation")
            assert await cur.fetchone() == ("repeatable read",)
        runner, backups = backends[0], backends[1:]
        told: Counter[str] = Counter()
        for n in range(10):
            [won] = await runner.claim([request(SLOT + n * 1000)])
            assert won.ticket is not None
            await runner.release(won.ticket, "handed over")
            outs = await asyncio.gather(
                *(b.take_over(takeover(won.ticket, f"b{k}")) for k, b in enumerate(backups))
            )
            told.update(o.status.value for o in outs)
            taken = next(o.ticket for o in outs if o.ticket is not None)
            await backups[0].finish(taken, RunStatus.SUCCEEDED, None)
        assert told == {"taken": 10, "held": 30}, told
    finally:
        for b in backends:
            await b.stop()


async def test_one_request_claims_fall_back_to_a_transaction_under_repeatable_read(
    schema: str,
) -> None:
    """A claim of one request is one statement, a transaction of its own, which the claim
    function refuses outside READ COMMITTED: under a REPEATABLE READ default each backend
    falls back to BEGIN READ COMMITTED once, and every slot still has one winner."""
    dsn = f"{DSN}?options=-c%20default_transaction_isolation%3Drepeatable%5C%20read"
    backends = [PostgresBackend(dsn, schema=schema, max_connections=2) for _ in range(3)]
    plain = PostgresBackend(DSN, schema=schema, max_connections=2)
    for b in [*backends, plain]:
        await b.start()
    try:
        for n in range(10):
            outs = await asyncio.gather(
                *(
                    b.claim([request(SLOT + n * 1000, instance=f"i{k}")])
                    for k, b in enumerate([*backends, plain])
                )
            )
            statuses = Counter(o.status for [o] in outs)
            assert statuses == {ClaimStatus.WON: 1, ClaimStatus.LOST: 3}, (n, outs)
        assert [b._one_statement for b in backends] == [False] * 3
        assert plain._one_statement
    finally:
        for b in [*backends, plain]:
            await b.stop()


async def test_fences_rise_across_a_store_that_lost_its_data(make: Make, schema: str) -> None:
    backend = make()
    await backend.start()
    [first] = await backend.claim([request()])
    await backend.stop()
    await drop_schema(schema)  # as after a failover to a replica that never saw these writes
    again = make()
    await again.start()
    [second] = await again.claim([request()])
    assert first.ticket is not None and second.ticket is not None
    assert first.ticket.fence is not None and second.ticket.fence is not None
    assert second.ticket.fence > first.ticket.fence


@pytest.mark.parametrize("offset", [0, 3_600_000])
async def test_the_test_clock_offset_moves_only_its_own_sessions(make: Make, offset: int) -> None:
    moved, plain = make(), make()
    await moved.start()
    await plain.start()
    moved._test_clock_offset_ms = offset
    a, b = await moved.server_time_ms(), await plain.server_time_ms()
    assert a is not None and b is not None and abs(a - b - offset) < 2_000


async def test_a_batch_wins_by_one_insert_only_when_every_request_wins(make: Make) -> None:
    # claim_plain records a batch whose every request wins; any other batch is claim_decide's,
    # whose answers stay those of every other backend: one recorded slot, one paused job, one
    # job twice with overlap="skip", or the whole cluster paused.
    from anarchon.control import ALL_JOBS, Pause

    backend = make()
    await backend.start()
    control = backend.control()
    plain = [request(job=f"plain{n}") for n in range(3)]
    won = await backend.claim(plain)
    assert [o.status for o in won] == [ClaimStatus.WON] * 3
    # A new job's first fence: max(0 + 1, now in ms) when its row was made (take_fences), in
    # the transaction that then records the run: at most its start.
    assert all(
        o.ticket is not None and 0 <= o.ticket.started_at_ms - (o.ticket.fence or 0) < 1_000
        for o in won
    )
    await control.pause(Pause(job="held", by="ops", at_ms=0))
    mixed = [
        request(job="plain0", instance="i2"),  # recorded by i1: lost to it
        request(job="held"),  # paused: recorded skipped
        request(job="free"),
        request(job="twice", overlap=Overlap.SKIP),
        request(SLOT + 1000, job="twice", overlap=Overlap.SKIP),  # the first holds the job
    ]
    outcomes = await backend.claim(mixed)
    assert [o.status for o in outcomes] == [
        ClaimStatus.LOST,
        ClaimStatus.SKIPPED,
        ClaimStatus.WON,
        ClaimStatus.WON,
        ClaimStatus.SKIPPED,
    ]
    assert outcomes[0].run is not None and outcomes[0].run.run_id == plain[0].run_id
    assert outcomes[1].run is not None and outcomes[1].run.reason == "paused by ops"
    await control.pause(Pause(job=ALL_JOBS, by="ops", at_ms=0))
    everyone = await backend.claim([request(SLOT + 2000, job=f"plain{n}") for n in range(3)])
    assert [o.status for o in everyone] == [ClaimStatus.SKIPPED] * 3
    await control.resume(ALL_JOBS)
    later = await backend.claim([request(SLOT + 3000, job=f"plain{n}") for n in range(3)])
    assert [o.status for o in later] == [ClaimStatus.WON] * 3
    for before, after in zip(won, later, strict=True):
        assert before.ticket is not None and after.ticket is not None
        assert before.ticket.fence is not None and after.ticket.fence is not None
        assert after.ticket.fence > before.ticket.fence


async def test_a_winner_has_its_answer_before_its_claim_notices_are_sent(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The notices of a won claim follow the answer on the same connection, which goes back to
    # the pool only then; stop() waits for them.
    backend = make(max_connections=1)
    await backend.start()
    heard: list[Any] = []
    assert await backend.subscribe_claims(heard.extend)
    db = backend._db
    sent = asyncio.Event()
    release = asyncio.Event()
    after_commit = db.after_commit

    async def held_back(conn: Any, after: Any) -> None:
        await release.wait()
        await after_commit(conn, after)
        sent.set()

    monkeypatch.setattr(db, "after_commit", held_back)
    [outcome] = await backend.claim([request(job="first")])
    assert outcome.status is ClaimStatus.WON and not sent.is_set()
    release.set()
    await asyncio.wait_for(sent.wait(), 5)
    # The one connection is free again: a second claim goes through.
    [again] = await backend.claim([request(job="second")])
    assert again.status is ClaimStatus.WON
    for _ in range(50):
        if {n.job for n in heard} >= {"first", "second"}:
            break
        await asyncio.sleep(0.1)
    assert {n.job for n in heard} >= {"first", "second"}
