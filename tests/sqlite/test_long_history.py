"""A job with 1 000 000 recorded runs on SQLite: history, last_run and explain read the newest
runs or one slot, and pruning removes the excess a batch at a time while the job keeps running.

The runs are generated in the file by one ``INSERT ... SELECT`` over a recursive series (about
3 s): a per-second job, one run per slot, each started 5 ms after its slot. Correctness only;
the timings are in bench/history.py (docs/benchmarks.md, "History at size").
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from anarchon import RunStatus, SQLiteBackend, Trigger
from anarchon.backend import PRUNED_REASON, ClaimRequest, ClaimStatus
from anarchon.backends.sqlite._queries import Q
from anarchon.explain import Fate, explain
from anarchon.registry import JobDefinition

pytestmark = pytest.mark.slow

ROWS = 1_000_000
FIRST = 1_700_000_000_000  # 2023-11-14T22:13:20Z, a whole second
LAST = FIRST + (ROWS - 1) * 1000
JOB = "big"
PER_SECOND = JobDefinition(name=JOB, expression="* * * * * *", zone="UTC")

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
    with sqlite3.connect(path) as conn:
        conn.execute(FILL, {"rows": ROWS, "job": JOB, "first": FIRST})
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM anarchon_runs").fetchone() == (ROWS,)
    return backend


def _claim(slot: int) -> ClaimRequest:
    return ClaimRequest(
        job=JOB,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="w0",
        trigger=Trigger.SCHEDULE,
        lease_ms=30_000,
    )


async def test_history_last_run_and_explain_of_a_million_runs(tmp_path: Path) -> None:
    backend = await _filled(tmp_path / "long.db", history_size=1_000_000)
    try:
        # The plans, without statistics (the backend never runs ANALYZE): each read of the
        # runs goes through the index that bounds it (a LIMIT bounds history and slot_count).
        with sqlite3.connect(tmp_path / "long.db") as conn:
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
        history = await backend.history(JOB, limit=100)
        assert [r.slot_ms for r in history] == [LAST - n * 1000 for n in range(100)]
        assert await backend.last_run(JOB) == history[0]
        now = LAST + 60_000
        for slot in (LAST - 10_000, FIRST + 1000 * 1000, FIRST):
            fate = await explain(backend, JOB, slot, definition=PER_SECOND, now_ms=now)
            assert fate.fate is Fate.RAN, fate.describe()
            failed = (slot - FIRST) // 1000 % 500 == 0
            expected = RunStatus.FAILED if failed else RunStatus.SUCCEEDED
            assert fate.outcome is expected and fate.records_read == 1
            assert [a.started_ms for a in fate.attempts] == [slot + 5]
            assert fate.oldest_record_ms == FIRST
        before = await explain(backend, JOB, FIRST - 1000, definition=PER_SECOND, now_ms=now)
        assert before.fate is Fate.NO_RECORD and before.history_pruned is True
        assert "older than the oldest record" in (before.reason or "")
    finally:
        await backend.stop()


async def test_pruning_removes_the_excess_a_batch_per_result(tmp_path: Path) -> None:
    path = tmp_path / "long.db"
    backend = await _filled(path, history_size=1000)
    try:
        # The job keeps running: each result prunes the 100 oldest slots, never the new ones.
        slot = LAST + 1000
        for n in range(1, 6):
            [won] = await backend.claim([_claim(slot)])
            assert won.ticket is not None
            await backend.finish(won.ticket, "succeeded", None)
            with sqlite3.connect(path) as conn:
                count, oldest = conn.execute(
                    "SELECT count(*), min(slot) FROM anarchon_runs WHERE job = ?", (JOB,)
                ).fetchone()
            assert (count, oldest) == (ROWS + n - 100 * n, FIRST + 100 * n * 1000)
            slot += 1000
        history = await backend.history(JOB, limit=100)
        assert history[0].slot_ms == slot - 1000 and len(history) == 100
        assert await backend.last_slot(JOB) == slot - 1000
        # A claim of a pruned slot is refused; one that still has a record is answered by it.
        [gone, kept] = await backend.claim([_claim(FIRST + 5000), _claim(FIRST + 501_000)])
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
        with sqlite3.connect(path) as conn:
            conn.execute(FILL, {"rows": 300, "job": JOB, "first": FIRST})
        slot = FIRST + 300 * 1000
        counts = []
        for _ in range(3):
            [won] = await backend.claim([_claim(slot)])
            assert won.ticket is not None
            await backend.finish(won.ticket, "succeeded", None)
            with sqlite3.connect(path) as conn:
                counts.append(
                    conn.execute(
                        "SELECT count(*) FROM anarchon_runs WHERE job = ?", (JOB,)
                    ).fetchone()[0]
                )
            slot += 1000
        assert counts == [201, 150, 150]
    finally:
        await backend.stop()
