"""SQLite's control store: its tables and their migration, pauses seen by another process's
claim at once, reads that create nothing, indexed lookups, requested_by across a takeover."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from anarchon import BackendError, RunStatus, SQLiteBackend, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus, TakeoverRequest, TakeoverStatus
from anarchon.backends.sqlite import _queries as sqlite_queries
from anarchon.backends.sqlite._rows import PAUSES_READ_AT_ONCE
from anarchon.control import ALL_JOBS, Pause, RunRequest

SLOT = 1_800_000_000_000


def claim(job: str = "job", slot: int | None = SLOT, **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=str(kw.pop("instance", "i")),
        trigger=kw.pop("trigger", Trigger.SCHEDULE),
        lease_ms=kw.pop("lease_ms", 5_000),
        **kw,
    )


def run_request(job: str, due_ms: int, n: int = 0) -> RunRequest:
    request_id = f"{n:032x}"
    return RunRequest(
        id=request_id,
        job=job,
        trigger=Trigger.MANUAL,
        key=f"manual-{request_id}",
        slot=None,
        due_ms=due_ms,
        requested_by="alice@ops",
        requested_at_ms=due_ms,
    )


def tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


async def test_a_version_4_file_is_migrated_and_keeps_its_history(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    steps = sqlite_queries.STEPS[:4]
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            sqlite_queries.Q["create_schema_table"] + ";" + ";".join(s.sql for s in steps)
        )
        versions = [(1,), (2,), (3,), (4,)]
        conn.executemany("INSERT INTO anarchon_schema (version) VALUES (?)", versions)
        conn.execute(
            "INSERT INTO anarchon_runs (job, slot_key, attempt, slot, run_id, token, instance, "
            "trigger, status, fence, started_at, finished_at) VALUES "
            "('job', ?, 1, ?, 'old', 't', 'i', 'schedule', 'succeeded', 5, ?, ?)",
            (str(SLOT), SLOT, 1_700_000_000_000, 1_700_000_000_001),
        )
        conn.commit()
    backend = SQLiteBackend(path)
    await backend.start()
    [old] = await backend.history("job")
    assert old.run_id == "old" and old.requested_by is None
    [won] = await backend.claim([claim(slot=None, trigger=Trigger.MANUAL, requested_by="bob")])
    assert won.status is ClaimStatus.WON and won.run.requested_by == "bob"
    assert [r.requested_by for r in await backend.history("job")] == ["bob", None]
    await backend.stop()
    assert {"anarchon_pauses", "anarchon_requests"} <= tables(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT max(version) FROM anarchon_schema").fetchone()[0] == 6


async def test_a_pause_holds_another_processes_next_claim(tmp_path: Path) -> None:
    operator, worker = SQLiteBackend(tmp_path / "p.db"), SQLiteBackend(tmp_path / "p.db")
    await operator.start()
    await worker.start()
    store = operator.control()
    now = await operator.server_time_ms()
    assert now is not None
    await store.pause(Pause(job="job", by="alice@ops", at_ms=now))
    [held] = await worker.claim([claim()])
    assert held.status is ClaimStatus.SKIPPED and held.run.reason == "paused by alice@ops"
    assert await worker.control().pauses() == [Pause(job="job", by="alice@ops", at_ms=now)]
    assert await worker.control().resume("job") is not None
    [won] = await worker.claim([claim(slot=SLOT + 1000)])
    assert won.status is ClaimStatus.WON
    await operator.stop()
    await worker.stop()


@pytest.mark.parametrize("others", [0, PAUSES_READ_AT_ONCE + 1])
async def test_a_batch_obeys_each_jobs_pause_and_the_clusters(tmp_path: Path, others: int) -> None:
    """A batch reads the pauses once when there are few, one job at a time when there are
    many: the same answers either way, the cluster-wide pause included."""
    backend = SQLiteBackend(tmp_path / "b.db")
    await backend.start()
    store = backend.control()
    now = await backend.server_time_ms()
    assert now is not None
    for n in range(others):
        await store.pause(Pause(job=f"other{n}", by="ops", at_ms=now))
    await store.pause(Pause(job="held", by="alice@ops", at_ms=now))
    first = await backend.claim([claim("held"), claim("free"), claim("held2")])
    assert [o.status for o in first] == [ClaimStatus.SKIPPED, ClaimStatus.WON, ClaimStatus.WON]
    assert first[0].run.reason == "paused by alice@ops"
    await store.pause(Pause(job=ALL_JOBS, by="bob@ops", at_ms=now))
    second = await backend.claim([claim("free", SLOT + 1000), claim("new", SLOT + 1000)])
    assert [o.status for o in second] == [ClaimStatus.SKIPPED] * 2
    await backend.stop()


async def test_reads_without_the_tables_answer_empty_and_create_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bare.db"
    backend = SQLiteBackend(path)
    await backend.start()
    await backend.stop()
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript("DROP TABLE anarchon_pauses; DROP TABLE anarchon_requests;")
    reader = SQLiteBackend(path)
    await reader.start_reader()
    store = reader.control()
    assert await store.pauses() == []
    assert await store.requests() == []
    assert await store.requests(["job"]) == []
    assert await store.resume("job") is None
    await store.done("nothing")
    await reader.stop()
    assert not {"anarchon_pauses", "anarchon_requests"} & tables(path)


async def test_requests_of_many_jobs_are_due_first(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "many.db")
    await backend.start()
    store = backend.control()
    jobs = [f"job{n}" for n in range(900)]
    stored = [run_request(job, 10_000 - n, n) for n, job in enumerate(jobs[::100])]
    for request in stored:
        assert await store.request(request) is True
    found = await store.requests(jobs)
    assert found == sorted(stored, key=lambda r: r.due_ms)
    assert await store.requests(jobs[:1]) == [stored[0]]
    await backend.stop()


async def test_a_value_the_file_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "big.db")
    await backend.start()
    store = backend.control()
    with pytest.raises(BackendError, match=r"cannot store Pause\(.*at_ms=1180591620717411303424"):
        await store.pause(Pause(job="job", by="x", at_ms=2**70))
    with pytest.raises(BackendError, match="cannot store RunRequest"):
        await store.request(run_request("job", 2**70))
    assert await store.pauses() == [] and await store.requests() == []
    await backend.stop()


def test_the_pause_and_request_lookups_use_indexes(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "plan.db")) as conn:
        conn.executescript(
            sqlite_queries.Q["create_schema_table"]
            + ";"
            + ";".join(step.sql for step in sqlite_queries.STEPS)
        )

        def plan(query: str, *params: Any) -> str:
            return " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params))

        pauses = plan(sqlite_queries.Q["job_pauses"], "job")
        assert "USING INDEX sqlite_autoindex_anarchon_pauses_1" in pauses, pauses
        requests = plan(sqlite_queries.Q["job_requests"].replace("?jobs", "?"), "job")
        assert "USING INDEX anarchon_requests_due" in requests, requests


async def test_a_takeover_keeps_who_asked(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "t.db")
    await backend.start()
    [won] = await backend.claim(
        [claim(slot=None, key="manual-x", trigger=Trigger.MANUAL, requested_by="alice@ops")]
    )
    assert won.ticket is not None
    backend._test_clock_offset_ms = 10_000
    taken = await backend.take_over(
        TakeoverRequest(
            job="job",
            slot_key="manual-x",
            run_id=uuid.uuid4().hex,
            token=uuid.uuid4().hex,
            instance="backup",
            lease_ms=5_000,
            max_attempts=3,
        )
    )
    assert taken.status is TakeoverStatus.TAKEN
    assert taken.run is not None and taken.run.requested_by == "alice@ops"
    assert [(r.attempt, r.status, r.requested_by) for r in await backend.history("job")] == [
        (2, RunStatus.RUNNING, "alice@ops"),
        (1, RunStatus.FAILED, "alice@ops"),
    ]
    await backend.stop()
