"""Schema version 5: the skip cause's column and the claim function that writes it, an additive
migration. Tables of version 4 keep their records (a skip stored without a cause reads it from
its words) and lose version 4's claim function, whose calls the new one answers; the version an
instance of version 4 checks stays 4, and its claims (the function called with its fifteen
arguments, the columns it knows) keep working beside this version's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

import psycopg
from psycopg import sql

from anarchon import RunStatus, SkipCause
from anarchon.backend import TOO_LATE, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._queries import Names, Queries
from tests.backends.postgres import DSN, migrate_to
from tests.records import claim_request

SLOT: Final = 1_800_000_000_000
MINUTE: Final = 60_000
Make = Callable[..., PostgresBackend]
TOO_LATE_WORDS: Final = f"{TOO_LATE}i0 reached the slot 70000 ms after it (max_late_ms=60000)"
# Version 4's claim function's arguments, by type.
ARGUMENTS_4: Final = (
    "text[], text[], bigint[], text[], text[], text[], text[], bigint[], boolean[], text[],"
    " text[], boolean[], text[], text, boolean"
)
# A claim as an instance of version 4 makes it (its claim_one statement): the function with its
# fifteen arguments, and the answer's columns it knows.
CLAIM_4: Final = (
    "SELECT o_verdict, o_status, o_reason, o_instance FROM {}("
    "ARRAY[%(job)s::text], ARRAY[%(slot)s::text], ARRAY[%(slot)s::bigint], ARRAY[%(run)s::text],"
    " ARRAY[%(run)s::text], ARRAY[%(instance)s::text], ARRAY['schedule'], ARRAY[60000::bigint],"
    " ARRAY[false], ARRAY[%(reason)s::text], ARRAY['skipped'], ARRAY[%(reason)s::text IS NULL],"
    " ARRAY[NULL::text], %(channel)s::text, false)"
)


async def _fetch(query: sql.SQL | sql.Composed, params: Any = None) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def _make_version_4(schema: str) -> None:
    """The tables as an instance of schema version 4 left them, with three records: a run, a
    skip in anarchon's words, a skip in other words. Its claim function is a stand-in of the
    same signature, which migration 5 drops."""
    q = Queries(Names(schema, "anarchon_"))
    answer = sql.Identifier(schema, "anarchon_claim_answer")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await migrate_to(conn, q, 4)
        await conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}(" + ARGUMENTS_4 + ") RETURNS SETOF {} LANGUAGE plpgsql"
                " AS $$BEGIN RETURN; END$$"
            ).format(sql.Identifier(schema, "anarchon_claim"), answer)
        )
        for n, status, reason in (
            (0, "succeeded", None),
            (1, "skipped", TOO_LATE_WORDS),
            (2, "skipped", "worded by hand"),
        ):
            slot = SLOT + n * MINUTE
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance,"
                    " trigger, status, fence, started_at, finished_at, reason)"
                    " VALUES ('job', %s, 1, %s, %s, 't', 'i0', 'schedule', %s, 0, %s, %s, %s)"
                ).format(sql.Identifier(schema, "anarchon_runs")),
                (str(slot), slot, f"r{n}", status, slot, slot + 5, reason),
            )


async def _claim_as_version_4(
    schema: str, slot: int, instance: str, reason: str | None = None
) -> tuple[Any, ...]:
    q = Queries(Names(schema, "anarchon_"))
    params = {
        "job": "job",
        "slot": slot,
        "run": f"{instance}-{slot}",
        "instance": instance,
        "reason": reason,
        "channel": q.names.channel,
    }
    query = sql.SQL(CLAIM_4).format(sql.Identifier(schema, "anarchon_claim"))
    async with await psycopg.AsyncConnection.connect(DSN) as conn, conn.transaction():
        await conn.execute(q["read_committed"])
        [row] = await (await conn.execute(query, params)).fetchall()
    return row


async def test_a_version_4_schema_gains_the_column_and_keeps_its_records(
    make: Make, schema: str
) -> None:
    await _make_version_4(schema)
    backend = make()
    await backend.start()
    skip = dataclasses.replace(
        claim_request("job", SLOT + 3 * MINUTE, "i1"),
        skip_reason="worded too",
        skip_cause=SkipCause.BEHIND,
    )
    [answer] = await backend.claim([skip])
    assert (answer.status, answer.run.skip_cause) == (ClaimStatus.SKIPPED, SkipCause.BEHIND)
    history = {r.slot_ms: (r.status, r.skip_cause) for r in await backend.history("job")}
    assert history == {
        SLOT: (RunStatus.SUCCEEDED, None),
        SLOT + MINUTE: (RunStatus.SKIPPED, SkipCause.TOO_LATE),
        SLOT + 2 * MINUTE: (RunStatus.SKIPPED, None),
        SLOT + 3 * MINUTE: (RunStatus.SKIPPED, SkipCause.BEHIND),
    }
    found = await backend.slot_records("job", SLOT + 3 * MINUTE)
    assert found is not None and [r.skip_cause for r in found.runs] == [SkipCause.BEHIND]
    versions = sql.Identifier(schema, "anarchon_schema_version")
    additions = sql.Identifier(schema, "anarchon_schema_additions")
    assert await _fetch(sql.SQL("SELECT version FROM {} ORDER BY 1").format(versions)) == [
        (1,),
        (2,),
        (3,),
        (4,),
    ]
    assert await _fetch(sql.SQL("SELECT version FROM {}").format(additions)) == [(5,)]
    # One claim function is left, the new one: sixteen arguments, the last with a default.
    assert await _fetch(
        sql.SQL(
            "SELECT pronargs, pronargdefaults FROM pg_proc"
            " WHERE proname = 'anarchon_claim' AND pronamespace = %s::regnamespace"
        ),
        (schema,),
    ) == [(16, 1)]
    again = make()
    await again.start()  # nothing left to migrate
    reader = make()
    await reader.start_reader()
    assert len(await reader.history("job")) == 4


async def test_an_instance_of_version_4_claims_beside_this_version(make: Make, schema: str) -> None:
    backend = make()
    await backend.start()  # tables made by this version
    # Version 4 wins a slot and skips another in its words (no cause stored): this version
    # answers both from their records.
    assert await _claim_as_version_4(schema, SLOT, "old") == ("won", "running", None, "old")
    words = TOO_LATE_WORDS
    assert await _claim_as_version_4(schema, SLOT + MINUTE, "old", words) == (
        "skip",
        "skipped",
        words,
        "old",
    )
    lost, skipped = await backend.claim(
        [claim_request("job", SLOT, "new"), claim_request("job", SLOT + MINUTE, "new")]
    )
    assert (lost.status, lost.run.instance) == (ClaimStatus.LOST, "old")
    assert (skipped.status, skipped.run.skip_cause) == (ClaimStatus.SKIPPED, SkipCause.TOO_LATE)
    # This version wins a slot and skips another with its cause: version 4 answers from them.
    won, skip = await backend.claim(
        [
            claim_request("job", SLOT + 2 * MINUTE, "new"),
            dataclasses.replace(
                claim_request("job", SLOT + 3 * MINUTE, "new"),
                skip_reason="worded",
                skip_cause=SkipCause.BEHIND,
            ),
        ]
    )
    assert (won.status, skip.status) == (ClaimStatus.WON, ClaimStatus.SKIPPED)
    assert await _claim_as_version_4(schema, SLOT + 2 * MINUTE, "old") == (
        "existing",
        "running",
        None,
        "new",
    )
    assert await _claim_as_version_4(schema, SLOT + 3 * MINUTE, "old") == (
        "existing",
        "skipped",
        "worded",
        "new",
    )
    causes = {r.slot_ms: r.skip_cause for r in await backend.history("job")}
    assert causes == {
        SLOT: None,
        SLOT + MINUTE: SkipCause.TOO_LATE,
        SLOT + 2 * MINUTE: None,
        SLOT + 3 * MINUTE: SkipCause.BEHIND,
    }
