"""A job with 1 000 000 recorded runs on SQLite: history, last_run and explain read the newest
runs or one slot, and pruning removes the excess a batch at a time while the job keeps running.

The runs are generated in the file by one ``INSERT ... SELECT`` over a recursive series (about
3 s): a per-second job, one run per slot, each started 5 ms after its slot. Correctness only;
the timings are in bench/history.py (docs/benchmarks.md, "History at size").
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from anarchon import RunStatus, SQLiteBackend
from anarchon.backend import PRUNED_REASON, ClaimStatus
from anarchon.backends.sqlite._queries import Q
from tests.long_history import FIRST, JOB, LAST, ROWS, check_reads, claim_request

pytestmark = pytest.mark.slow


FILL = """
INSERT INTO anarchon_runs (job, slot_key, attempt, slot, run_id, token, instance, trigger,
                           status, fence, started_at, finished_at, lease_expires_at, released)
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :rows - 1)
SELECT :job, CAST(:first + i * 1000 AS TEXT), 1, :first + i * 1000, 'r' || i, 't' || i,
       'w' || (i % 3), 'schedule', CASE WHEN i % 500 = 0 THEN 'failed' ELSE 'succeeded' END,
       i + 1, :first + i * 1000 + 5, :first + i * 1000 + 50, NULL, 0
FROM n
"""


async def _filled(path: Path, history_size: int) -> SQLiteBackend:
    """A started backend on ``path`` whose job holds ROWS runs."""
    backend = SQLiteBackend(path, history_size=history_size)
    await backend.start()
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(FILL, {"rows": ROWS, "job": JOB, "first": FIRST})
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM anarchon_runs").fetchone() == (ROWS,)
    return backend


async def test_history_last_run_and_explain_of_a_million_runs(tmp_path: Path) -> None:
    backend = await _filled(tmp_path / "long.db", history_size=1_000_000)
    try:
        # The plans, without statistics (the backend never runs ANALYZE): each read of the
        # runs goes through the index that bounds it (a LIMIT bounds history and slot_count).
        with closing(sqlite3.connect(tmp_path / "long.db")) as conn:
            for name, params, wanted in (
                ("history", (JOB, 100), ["anarchon_runs_by_start (job=?)"]),
                ("slot_records", (JOB, FIRST), ["anarchon_runs_slot (job=? AND slot=?)"]),
                (
                    "oldest_record",
                    {"job": JOB},
                    ["anarchon_runs_slot (job=? AND slot>?)", "anarchon_runs_by_start (job=?)"],
                ),
                ("slot_count", (JOB, 1100), ["sqlite_autoindex_anarchon_runs_1 (job=?)"]),
            ):
                steps = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + Q[name], params)]
                reads = [s for s in steps if "anarchon_runs" in s]
                assert len(reads) == len(wanted), (name, steps)
                for step, index in zip(reads, wanted, strict=True):
                    assert step.startswith("SEARCH") and step.endswith(index), (name, steps)
        await check_reads(backend)
    finally:
        await backend.stop()


async def test_pruning_removes_the_excess_a_batch_per_result(tmp_path: Path) -> None:
    path = tmp_path / "long.db"
    backend = await _filled(path, history_size=1000)
    try:
        # The job keeps running: each result prunes the 100 oldest slots, never the new ones.
        slot = LAST + 1000
        for n in range(1, 6):
            [won] = await backend.claim([claim_request(slot)])
            assert won.ticket is not None
            await backend.finish(won.ticket, "succeeded", None)
            with closing(sqlite3.connect(path)) as conn:
                count, oldest = conn.execute(
                    "SELECT count(*), min(slot) FROM anarchon_runs WHERE job = ?", (JOB,)
                ).fetchone()
            assert (count, oldest) == (ROWS + n - 100 * n, FIRST + 100 * n * 1000)
            slot += 1000
        history = await backend.history(JOB, limit=100)
        assert history[0].slot_ms == slot - 1000 and len(history) == 100
        assert await backend.last_slot(JOB) == slot - 1000
        # A claim of a pruned slot is refused; one that still has a record is answered by it.
        pruned, recorded = claim_request(FIRST + 5000), claim_request(FIRST + 501_000)
        [gone, kept] = await backend.claim([pruned, recorded])
        assert gone.status is ClaimStatus.LOST and gone.run.reason == PRUNED_REASON
        assert kept.status is ClaimStatus.LOST and kept.run.status is RunStatus.SUCCEEDED
    finally:
        await backend.stop()


async def test_pruning_stops_at_history_size(tmp_path: Path) -> None:
    """The bounded count still prunes exactly down to history_size."""
    path = tmp_path / "small.db"
    backend = SQLiteBackend(path, history_size=150)
    await backend.start()
    try:
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(FILL, {"rows": 300, "job": JOB, "first": FIRST})
        slot = FIRST + 300 * 1000
        counts = []
        for _ in range(3):
            [won] = await backend.claim([claim_request(slot)])
            assert won.ticket is not None
            await backend.finish(won.ticket, "succeeded", None)
            with closing(sqlite3.connect(path)) as conn:
                counts.append(
                    conn.execute(
                        "SELECT count(*) FROM anarchon_runs WHERE job = ?", (JOB,)
                    ).fetchone()[0]
                )
            slot += 1000
        assert counts == [201, 150, 150]
    finally:
        await backend.stop()
