"""With 1 000 000 runs in the table, history, last_run and last_slot are index scans.

The rows are generated on the server (generate_series) in the test's own schema, as a busy
application would have them: a thousand jobs that ran every minute, each at its history cap of
a thousand runs, all younger than the default history TTL; the planner's statistics are fresh.
Each statement the backend runs is explained with the same text and parameters it uses, and its
plan must reach the runs table through an index, never a sequential scan.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from anarchon import Overlap, Trigger
from anarchon.backend import ClaimRequest
from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._rows import claim_params, retry_params
from tests.backends.postgres import DSN

pytestmark = pytest.mark.slow

JOBS = 1_000
PER_JOB = 1_000
ROWS = JOBS * PER_JOB
SLOT = 1_800_000_000_000

FILL = """
INSERT INTO {runs} (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                    fence, started_at, finished_at, lease_expires_at, released, error, reason)
SELECT 'job' || (n %% %(jobs)s), s::text, 1, s, md5(n::text), md5(n::text), 'i' || (n %% 3),
       'schedule', CASE WHEN n %% 500 = 0 THEN 'failed' ELSE 'succeeded' END,
       n / %(jobs)s + 1, s + 5, s + 50, NULL, false, NULL, NULL
FROM generate_series(0, %(rows)s - 1) AS n
CROSS JOIN LATERAL (
    SELECT (floor(extract(epoch FROM now()) / 60) * 60000
            - (%(per_job)s - n / %(jobs)s) * 60000)::bigint AS s
) AS slot
"""


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


async def _explain(conn: psycopg.AsyncConnection[Any], query: bytes, params: dict[str, Any]) -> Any:
    cur = await conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params, prepare=False)
    row = await cur.fetchone()
    assert row is not None
    value = row[0]
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


async def _explain_generic(
    conn: psycopg.AsyncConnection[Any], query: bytes, params: dict[str, Any]
) -> Any:
    """The generic plan of ``query`` (what a small claim batch runs, see generic_plans), from a
    PREPARE of its text and EXPLAIN EXECUTE under force_generic_plan (PostgreSQL 15 has no
    EXPLAIN (GENERIC_PLAN))."""
    names: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        name = match.group(1).decode()
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}".encode()

    text = re.sub(rb"%\((\w+)\)s", number, query)
    await conn.execute(b"PREPARE anarchon_probe AS " + text, prepare=False)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        # A utility statement's parameters get no types: EXECUTE's arguments go as literals,
        # with the casts the query gives them.
        casts = dict(re.findall(r"%\((\w+)\)s::([\w\[\]]+)", query.decode()))
        args = psycopg.sql.SQL(", ").join(
            psycopg.sql.SQL("{}::{}").format(
                psycopg.sql.Literal(params[n]), psycopg.sql.SQL(casts[n])
            )
            for n in names
        )
        explain = psycopg.sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE anarchon_probe({})").format(args)
        cur = await conn.execute(explain, prepare=False)
        row = await cur.fetchone()
        assert row is not None
        value = row[0]
        return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    finally:
        await conn.execute("RESET plan_cache_mode")
        await conn.execute("DEALLOCATE anarchon_probe")


def _scans_of(plan: dict[str, Any], table: str) -> list[str]:
    """The scan nodes that read ``table`` (ModifyTable nodes write it and are left out), with
    the index each one uses."""
    return [
        f"{n['Node Type']} {n.get('Index Name', '')}".strip()
        for n in _plan_nodes(plan)
        if (n.get("Relation Name") == table or n.get("Index Name", "").startswith(table))
        and n["Node Type"].endswith("Scan")
    ]


@pytest.fixture
async def filled(make: Callable[..., PostgresBackend], schema: str) -> PostgresBackend:
    backend = make()
    await backend.start()
    runs = psycopg.sql.Identifier(schema, "anarchon_runs")
    began = time.perf_counter()
    # Filling a table is faster without its secondary indexes: drop them, fill, and build them
    # again from the definitions the migrations left, so the indexes tested are the real ones.
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s"
            " AND indexname NOT LIKE '%%pkey' ORDER BY indexname",
            (schema, "anarchon_runs"),
        )
        indexes = await cur.fetchall()
        assert [name for name, _ in indexes] == [
            "anarchon_runs_recorded",
            "anarchon_runs_running",
            "anarchon_runs_slot",
        ]
        for name, _ in indexes:
            await conn.execute(
                psycopg.sql.SQL("DROP INDEX {}").format(psycopg.sql.Identifier(schema, name))
            )
        await conn.execute(
            psycopg.sql.SQL(FILL).format(runs=runs),
            {"jobs": JOBS, "per_job": PER_JOB, "rows": ROWS},
        )
        for _, definition in indexes:
            await conn.execute(definition.encode())
        await conn.execute(psycopg.sql.SQL("ANALYZE {}").format(runs))
        cur = await conn.execute(psycopg.sql.SQL("SELECT count(*) FROM {}").format(runs))
        assert await cur.fetchone() == (ROWS,)
    print(f"\npostgres: {ROWS} rows generated and analysed in {time.perf_counter() - began:.1f} s")
    return backend


async def test_history_last_run_and_last_slot_use_indexes(filled: PostgresBackend) -> None:
    for job in ("job7", "job999"):
        await _check(filled, job)


async def _check(filled: PostgresBackend, job: str) -> None:
    q = filled._queries
    statements: dict[str, tuple[bytes, dict[str, Any]]] = {
        "history": (q["history"], {"job": job, "limit": 50}),
        "last_run": (q["history"], {"job": job, "limit": 1}),
        "histories": (q["histories"], {"jobs": [job, "job1", "nobody"], "limit": 20}),
        "last_slot": (q["last_slot"], {"job": job}),
        "claim_lookup": (
            q["claim_decide"],
            claim_params(
                [
                    ClaimRequest(
                        job=job,
                        slot=SLOT,
                        run_id=uuid.uuid4().hex,
                        token=uuid.uuid4().hex,
                        instance="i",
                        trigger=Trigger.SCHEDULE,
                        lease_ms=5000,
                        overlap=Overlap.SKIP,
                    )
                ],
                q.names.channel,
                later=True,
            ),
        ),
        "finish_and_prune": (
            q["finish"],
            {
                "job": job,
                "slot_key": str(SLOT),
                "attempt": 1,
                "token": "t",
                "fence": 1,
                "status": "succeeded",
                "error": None,
                "ttl_ms": 7 * 24 * 3600 * 1000,
                "keep": 1000,
                "batch": 100,
                "channel": q.names.channel,
                "later": True,
                **retry_params(None),
            },
        ),
    }
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        plans = [
            (name, await _explain(conn, text, values))
            for name, (text, values) in statements.items()
        ]
        query, params = statements["claim_lookup"]
        plans.append(("claim_lookup (generic)", await _explain_generic(conn, query, params)))
        for name, plan in plans:
            scans = _scans_of(plan, "anarchon_runs")
            assert scans, f"{name}: the plan does not read anarchon_runs?\n{plan}"
            assert not any(s.startswith("Seq Scan") for s in scans), f"{name}: {scans}\n{plan}"
            assert any("Index" in s for s in scans), f"{name}: {scans}"
            # Below jit_above_cost (100 000 by default): no statement pays for JIT compilation.
            assert plan["Total Cost"] < 100_000, f"{name} costs {plan['Total Cost']}"
            print(f"\npostgres plan {name}({job}): {', '.join(scans)}; cost {plan['Total Cost']}")
            if name.startswith("claim"):
                # The pause check: a lookup of the job's and the cluster's pause.
                pauses = _scans_of(plan, "anarchon_pauses")
                assert pauses, f"{name}: the claim does not read anarchon_pauses?\n{plan}"
                assert any("anarchon_pauses_pkey" in s for s in pauses), f"{name}: {pauses}"
                print(f"postgres plan {name}({job}) of the pauses: {', '.join(pauses)}")

    # The backend's own calls, timed: an index scan of 50 rows, not a scan of a million.
    began = time.perf_counter()
    history = await filled.history(job, limit=50)
    last = await filled.last_run(job)
    last_slot = await filled.last_slot(job)
    took = time.perf_counter() - began
    assert len(history) == 50 and last == history[0]
    assert last_slot == history[0].slot_ms
    assert [r.started_at for r in history] == sorted((r.started_at for r in history), reverse=True)
    assert took < 1.0, f"history + last_run + last_slot took {took:.3f} s"
    print(f"\npostgres: history(50) + last_run + last_slot of {job}: {took * 1000:.1f} ms")
