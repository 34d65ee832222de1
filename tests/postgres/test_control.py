"""PostgreSQL's steering storage: migration 3, the pause check inside the claim statement, the
control store's tables, and what a takeover keeps of who asked."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from anarchon import Overlap, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus, TakeoverRequest, TakeoverStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._queries import Names, Queries
from anarchon.control import ALL_JOBS, Pause, RunRequest, paused_reason
from tests.backends.postgres import DSN, migrate_to

from .test_postgres import SLOT, Make, fetch, request


async def _tables(schema: str) -> list[str]:
    found = await fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
        schema,
    )
    return [t for (t,) in found]


@pytest.mark.parametrize("prefix", ["anarchon_", "p" * 40])
async def test_a_version_2_schema_is_migrated_and_keeps_its_history(
    schema: str, prefix: str
) -> None:
    q = Queries(Names(schema, prefix))
    runs = sql.Identifier(schema, prefix + "runs")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await migrate_to(conn, q, 2)
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance,"
                " trigger, status, fence, started_at)"
                " VALUES ('job', %s, 1, %s, 'old', 't', 'i', 'schedule', 'succeeded', 1, 5)"
            ).format(runs),
            (str(SLOT), SLOT),
        )
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(
                sql.SQL("UPDATE {} SET status = 'missed' WHERE run_id = 'old'").format(runs)
            )
    backend = PostgresBackend(DSN, schema=schema, table_prefix=prefix, max_connections=2)
    await backend.start()
    try:
        [old] = await backend.history("job")
        assert old.run_id == "old" and old.requested_by is None
        missed = request(SLOT + 1000, skip_reason="nobody", skip_status=RunStatus.MISSED)
        [answer] = await backend.claim([missed])
        assert answer.status is ClaimStatus.SKIPPED and answer.run.status is RunStatus.MISSED
        await backend.control().pause(Pause(job="job", by="ops", at_ms=1))
        assert [p.by for p in await backend.control().pauses()] == ["ops"]
    finally:
        await backend.stop()
    # The check still refuses a status nobody writes, under the name migration 1 gave it.
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match=f"{prefix}runs_status_check"):
            await conn.execute(
                sql.SQL("UPDATE {} SET status = 'lost' WHERE run_id = 'old'").format(runs)
            )
    assert [
        v
        for (v,) in await fetch(
            sql.SQL("SELECT version FROM {} ORDER BY 1")
            .format(sql.Identifier(schema, prefix + "schema_version"))
            .as_string(None)
        )
    ] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("job", "until_offset_ms"),
    [("job", None), ("job", 3_600_000), (ALL_JOBS, 3_600_123), (ALL_JOBS, 7), ("job", 1_000)],
)
async def test_the_paused_reason_is_pythons(
    make: Make, job: str, until_offset_ms: int | None
) -> None:
    backend = make()
    await backend.start()
    now = await backend.server_time_ms()
    assert now is not None
    # A whole second, or an odd millisecond: isoformat() writes microseconds only for the latter.
    until = None if until_offset_ms is None else (now // 1000 + 3600) * 1000 + until_offset_ms
    pause = Pause(job=job, by="alice@web-1", at_ms=now, until_ms=until)
    await backend.control().pause(pause)
    [skipped] = await backend.claim([request(trigger=Trigger.RETRY, key=f"{SLOT}-retry-1")])
    assert skipped.status is ClaimStatus.SKIPPED
    assert skipped.run.reason == paused_reason(pause)
    [stored] = await backend.history("job")
    assert stored.reason == paused_reason(pause) and stored.status is RunStatus.SKIPPED


async def test_the_claim_keeps_the_reference_order(make: Make) -> None:
    backend = make()
    await backend.start()
    control = backend.control()
    now = await backend.server_time_ms()
    assert now is not None
    await control.pause(Pause(job=ALL_JOBS, by="everyone", at_ms=now))
    await control.pause(Pause(job="job", by="owner", at_ms=now))
    [holder] = await backend.claim([request(slot=None, trigger=Trigger.MANUAL)])
    assert holder.status is ClaimStatus.WON  # manual runs are not paused
    batch = [
        request(SLOT, overlap=Overlap.SKIP),  # the job's own pause wins over '*' and overlap
        request(SLOT + 1000, skip_reason="too late"),  # a skip reason wins over the pause
        request(SLOT, job="other"),  # the cluster's pause
        request(SLOT, job="free", trigger=Trigger.MANUAL),
    ]
    answers = await backend.claim(batch)
    assert [a.status for a in answers] == [
        ClaimStatus.SKIPPED,
        ClaimStatus.SKIPPED,
        ClaimStatus.SKIPPED,
        ClaimStatus.WON,
    ]
    assert [a.run.reason for a in answers] == [
        "paused by owner",
        "too late",
        "paused by everyone (all jobs)",
        None,
    ]
    # An existing record answers before any pause: a paused slot stays skipped once resumed.
    await control.resume("job")
    await control.resume(ALL_JOBS)
    [again] = await backend.claim([request(SLOT, instance="i2")])
    assert again.status is ClaimStatus.SKIPPED and again.run.reason == "paused by owner"


async def test_reads_of_missing_tables_answer_empty_and_create_nothing(
    make: Make, schema: str
) -> None:
    backend = make()
    await backend.start()
    for table in ("anarchon_pauses", "anarchon_requests"):
        await _drop(schema, table)
    control = backend.control()
    assert await control.pauses() == []
    assert await control.requests() == []
    assert await control.requests(["job"]) == []
    assert "anarchon_pauses" not in await _tables(schema)
    assert "anarchon_requests" not in await _tables(schema)


async def _drop(schema: str, table: str) -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, table)))


async def test_a_reader_reads_the_control_store(make: Make) -> None:
    writer = make()
    await writer.start()
    now = await writer.server_time_ms()
    assert now is not None
    request_id = uuid.uuid4().hex
    stored = RunRequest(
        id=request_id,
        job="job",
        trigger=Trigger.MANUAL,
        key=f"manual-{request_id}",
        slot=None,
        due_ms=now,
        requested_by="alice@ops",
        requested_at_ms=now,
    )
    assert await writer.control().request(stored)
    await writer.control().pause(Pause(job="job", by="alice@ops", at_ms=now))
    reader = make()
    await reader.start_reader()
    assert await reader.control().requests() == [stored]
    assert [p.job for p in await reader.control().pauses()] == ["job"]


async def test_a_takeover_keeps_who_asked(make: Make) -> None:
    backend = make()
    await backend.start()
    key = f"{SLOT}-retry-1"
    [won] = await backend.claim(
        [request(key=key, trigger=Trigger.RETRY, requested_by="retry of r1")]
    )
    assert won.ticket is not None and won.run.requested_by == "retry of r1"
    await backend.release(won.ticket, "draining")
    taken = await backend.take_over(_takeover(key))
    assert taken.status is TakeoverStatus.TAKEN and taken.run is not None
    assert taken.run.attempt == 2 and taken.run.requested_by == "retry of r1"
    runs = await backend.history("job")
    assert [(r.attempt, r.requested_by, r.slot_ms) for r in runs] == [
        (2, "retry of r1", SLOT),
        (1, "retry of r1", SLOT),
    ]


def _takeover(key: str, **kw: Any) -> TakeoverRequest:
    return TakeoverRequest(
        job="job",
        slot_key=key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="i2",
        lease_ms=5_000,
        max_attempts=3,
        **kw,
    )


def test_claim_requests_name_the_trigger_the_pause_holds() -> None:
    from anarchon.backends.postgres._rows import claim_params

    reqs = [
        ClaimRequest(job="j", slot=1, run_id="r", token="t", instance="i", trigger=trigger)
        for trigger in Trigger
    ]
    params = claim_params(reqs, "anarchon", later=False)
    assert dict(zip([r.trigger for r in reqs], params["pausable"], strict=True)) == {
        Trigger.SCHEDULE: True,
        Trigger.MANUAL: False,
        Trigger.CATCH_UP: True,
        Trigger.RETRY: True,
    }
