"""SQLite specifics: the file, its schema version, pruning by count, and the default path."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from anarchon import BackendError, InvalidOption, RunStatus, Scheduler, SQLiteBackend, Trigger
from anarchon.backend import ClaimRequest
from anarchon.backends.sqlite import _clock as sqlite_clock
from anarchon.backends.sqlite import _queries as sqlite_queries

SLOT = 1_800_000_000_000


def request(slot: int) -> ClaimRequest:
    return ClaimRequest(
        job="job",
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="i",
        trigger=Trigger.SCHEDULE,
        lease_ms=5_000,
    )


async def test_the_path_is_logged_once_by_the_scheduler_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A scheduler with every option at its default logged the path twice (its lease keeper's
    # clone of the backend too), and every command (start_reader) once more.
    caplog.set_level(logging.INFO, logger="anarchon.backends.sqlite")
    backend = SQLiteBackend(tmp_path / "a.db")
    scheduler = Scheduler(backend)
    scheduler.add("j", "0 0 1 1 *", lambda ctx: None)
    async with scheduler:
        await asyncio.sleep(0.5)  # the keeper's clone is open by now
    lines = [r for r in caplog.records if r.getMessage().startswith("SQLite database ")]
    assert [r.getMessage() for r in lines] == [f"SQLite database {tmp_path / 'a.db'}"]
    assert lines[0].action == "sqlite_path"  # type: ignore[attr-defined]
    caplog.clear()
    reader = SQLiteBackend(tmp_path / "a.db")
    await reader.start_reader()
    await reader.stop()
    clone = backend.clone()
    await clone.start()
    await clone.stop()
    assert not caplog.records


async def test_wal_and_schema_version(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "a.db")
    await backend.start()
    await backend.start()  # idempotent
    await backend.stop()
    with closing(sqlite3.connect(tmp_path / "a.db")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT max(version) FROM anarchon_schema").fetchone()[0] == 6
        conn.execute("INSERT INTO anarchon_schema (version) VALUES (99)")
        conn.commit()
    with pytest.raises(BackendError, match="schema version 99, newer than this anarchon"):
        await SQLiteBackend(tmp_path / "a.db").start()


async def test_many_backends_migrate_one_file_at_once(tmp_path: Path) -> None:
    backends = [SQLiteBackend(tmp_path / "b.db") for _ in range(6)]
    await asyncio.gather(*(b.start() for b in backends))
    outcomes = await asyncio.gather(*(b.claim([request(SLOT)]) for b in backends))
    assert sum(o[0].status == "won" for o in outcomes) == 1
    for backend in backends:
        await backend.stop()
    with closing(sqlite3.connect(tmp_path / "b.db")) as conn:
        assert conn.execute("SELECT count(*) FROM anarchon_schema").fetchone()[0] == 6


async def test_history_is_capped_by_count(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "c.db", history_size=5)
    await backend.start()
    for n in range(12):
        [won] = await backend.claim([request(SLOT + n * 1000)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    history = await backend.history("job", limit=100)
    assert [r.slot_ms for r in history] == [SLOT + n * 1000 for n in range(11, 6, -1)]
    [again] = await backend.claim([request(SLOT + 3000)])
    assert again.status == "lost", "a pruned slot was claimed a second time"
    await backend.stop()


async def test_default_path_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ANARCHON_DB", raising=False)
    # Absolute: a later chdir must not move the file, and the log names it exactly.
    assert Scheduler().backend.path == Path.cwd() / "anarchon.db"  # type: ignore[attr-defined]
    monkeypatch.setenv("ANARCHON_DB", str(tmp_path / "env.db"))
    assert SQLiteBackend().path == tmp_path / "env.db"


async def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="history_size=0"):
        SQLiteBackend(tmp_path / "d.db", history_size=0)
    with pytest.raises(BackendError, match="does not exist"):
        await SQLiteBackend(tmp_path / "missing" / "d.db").start()
    with pytest.raises(BackendError, match="not started"):
        await SQLiteBackend(tmp_path / "e.db").history("job")


async def test_a_version_1_file_is_migrated(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "old.db")) as conn:
        conn.executescript(
            sqlite_queries.Q["create_schema_table"] + ";" + sqlite_queries.Q["migration_1"]
        )
        conn.execute("INSERT INTO anarchon_schema (version) VALUES (1)")
        conn.commit()
    backend = SQLiteBackend(tmp_path / "old.db")
    await backend.start()
    [won] = await backend.claim([request(SLOT)])
    assert won.ticket is not None
    await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    await backend.stop()
    with closing(sqlite3.connect(tmp_path / "old.db")) as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM anarchon_schema ORDER BY 1")] == [
            1,
            2,
            3,
            4,
            5,
            6,
        ]
        assert conn.execute("SELECT count(*) FROM anarchon_events").fetchone()[0] == 1
        indexes = {
            n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        assert "anarchon_runs_by_start" in indexes and "anarchon_runs_newest" not in indexes


async def test_history_orders_one_millisecond_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock that does not move: the wall clock and the boot clock both stand still.
    monkeypatch.setattr(sqlite_clock, "_wall_ms", lambda: 1_900_000_000_000)
    monkeypatch.setattr(sqlite_clock, "_boot_ms", lambda: 5_000)
    backend = SQLiteBackend(tmp_path / "tie.db")
    await backend.start()
    for n in range(3):
        [won] = await backend.claim([request(SLOT + n * 1000)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    assert [r.slot_ms for r in await backend.history("job")] == [SLOT + 2000, SLOT + 1000, SLOT]
    await backend.stop()


def test_history_reads_the_start_index_in_reverse(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "plan.db")) as conn:
        conn.executescript(
            sqlite_queries.Q["create_schema_table"]
            + ";"
            + ";".join(step.sql for step in sqlite_queries.STEPS)
        )
        plan = " ".join(
            row[3]
            for row in conn.execute("EXPLAIN QUERY PLAN " + sqlite_queries.Q["history"], ("j", 5))
        )
    assert "anarchon_runs_by_start" in plan and "TEMP B-TREE" not in plan, plan


async def test_other_processes_hear_of_releases_and_results(tmp_path: Path) -> None:
    writer, reader = SQLiteBackend(tmp_path / "f.db"), SQLiteBackend(tmp_path / "f.db")
    await writer.start()
    await reader.start()
    heard: list[tuple[str, str, bool]] = []
    await reader.subscribe(lambda job, key, released: heard.append((job, key, released)))
    [a] = await writer.claim([request(SLOT)])
    [b] = await writer.claim([request(SLOT + 1000)])
    assert a.ticket is not None and b.ticket is not None
    await writer.release(a.ticket, "handed over")
    await writer.finish(b.ticket, RunStatus.SUCCEEDED, None)
    for _ in range(50):
        if len(heard) == 2:
            break
        await asyncio.sleep(0.05)
    assert heard == [("job", str(SLOT), True), ("job", str(SLOT + 1000), False)]
    await reader.stop()
    await writer.stop()


def test_a_row_is_read_in_the_order_of_its_columns() -> None:
    """row_of unpacks a row by position: each value lands in the field of its column."""
    from anarchon.backends.sqlite._rows import _COLUMNS, row_of

    values = tuple(f"value of {name}" for name in _COLUMNS)
    row = row_of(values)
    assert row is not None
    for name, value in zip(_COLUMNS, values, strict=True):
        assert getattr(row, name) == (True if name == "released" else value), name
    assert row_of(None) is None
