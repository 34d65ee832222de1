"""A job with 1 000 000 recorded runs on PostgreSQL: history, last_run and explain read the
newest runs or one slot through indexes, and pruning removes the excess a batch at a time while
the job keeps running.

The runs are generated on the server (one ``INSERT ... SELECT`` over ``generate_series``, the
secondary indexes dropped meanwhile and built again from the migrations' definitions): a
per-second job, one run per slot, each started 5 ms after its slot. Correctness and plans only;
the timings are in bench/history.py (docs/benchmarks.md, "History at size").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from anarchon import RunStatus
from anarchon.backend import PRUNED_REASON, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN
from tests.long_history import (
    FIRST,
    JOB,
    LAST,
    ROWS,
    check_reads,
    claim_request,
)

pytestmark = pytest.mark.slow


FILL = """
INSERT INTO {runs} (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                    fence, started_at, finished_at, lease_expires_at, released)
SELECT %(job)s, s::text, 1, s, 'r' || i, 't' || i, 'w' || (i %% 3), 'schedule',
       CASE WHEN i %% 500 = 0 THEN 'failed' ELSE 'succeeded' END, i + 1, s + 5, s + 50, NULL,
       false
FROM generate_series(0, %(rows)s - 1) AS i
CROSS JOIN LATERAL (SELECT %(first)s::bigint + i * 1000 AS s) AS slot
"""


async def _fill(schema: str, rows: int) -> None:
    runs = sql.Identifier(schema, "anarchon_runs")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s"
            " AND indexname NOT LIKE '%%pkey'",
            (schema, "anarchon_runs"),
        )
        indexes = await cur.fetchall()
        for name, _ in indexes:
            await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))
        await conn.execute(
            sql.SQL(FILL).format(runs=runs), {"rows": rows, "job": JOB, "first": FIRST}
        )
        for _, definition in indexes:
            await conn.execute(definition.encode())
        await conn.execute(sql.SQL("ANALYZE {}").format(runs))


async def _count(schema: str) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT count(*), min(slot) FROM {} WHERE job = %s").format(
                sql.Identifier(schema, "anarchon_runs")
            ),
            (JOB,),
        )
        found = await cur.fetchone()
        assert found is not None
        return int(found[0]), int(found[1])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _scans(query: bytes, params: dict[str, Any]) -> list[str]:
    """The scans of anarchon_runs in the plan of ``query``."""
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params, prepare=False)
        row = await cur.fetchone()
        assert row is not None
        value = row[0]
        plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    return [
        f"{n['Node Type']} {n.get('Index Name', '')}".strip()
        for n in _nodes(plan)
        if n.get("Relation Name") == "anarchon_runs" and n["Node Type"].endswith("Scan")
    ]


async def test_history_last_run_and_explain_of_a_million_runs(
    make: Callable[..., PostgresBackend], schema: str
) -> None:
    backend = make(history_size=1_000_000)
    await backend.start()
    await _fill(schema, ROWS)
    q = backend._queries
    for name, params in (
        ("history", {"job": JOB, "limit": 100}),
        ("history", {"job": JOB, "limit": 1}),
        ("slot_records", {"job": JOB, "slot": FIRST + 1000}),
    ):
        scans = await _scans(q[name], params)
        assert scans and all("Index" in s for s in scans), f"{name} {params}: {scans}"
    await check_reads(backend)


async def test_pruning_removes_the_excess_a_batch_per_result(
    make: Callable[..., PostgresBackend], schema: str
) -> None:
    backend = make(history_size=1000)
    await backend.start()
    await _fill(schema, ROWS)
    # The job keeps running: each result prunes the 100 oldest slots, never the new ones.
    slot = LAST + 1000
    for n in range(1, 6):
        [won] = await backend.claim([claim_request(slot)])
        assert won.ticket is not None
        await backend.finish(won.ticket, "succeeded", None)
        assert await _count(schema) == (ROWS + n - 100 * n, FIRST + 100 * n * 1000)
        slot += 1000
    history = await backend.history(JOB, limit=100)
    assert history[0].slot_ms == slot - 1000 and len(history) == 100
    assert await backend.last_slot(JOB) == slot - 1000
    # A claim of a pruned slot is refused; one that still has a record is answered by it.
    pruned, recorded = claim_request(FIRST + 5000), claim_request(FIRST + 501_000)
    [gone, kept] = await backend.claim([pruned, recorded])
    assert gone.status is ClaimStatus.LOST and gone.run.reason == PRUNED_REASON
    assert kept.status is ClaimStatus.LOST and kept.run.status is RunStatus.SUCCEEDED


async def test_pruning_stops_at_history_size(
    make: Callable[..., PostgresBackend], schema: str
) -> None:
    """The bounded count still prunes exactly down to history_size."""
    backend = make(history_size=150)
    await backend.start()
    await _fill(schema, 300)
    slot = FIRST + 300 * 1000
    counts = []
    for _ in range(3):
        [won] = await backend.claim([claim_request(slot)])
        assert won.ticket is not None
        await backend.finish(won.ticket, "succeeded", None)
        counts.append((await _count(schema))[0])
        slot += 1000
    assert counts == [201, 150, 150]
