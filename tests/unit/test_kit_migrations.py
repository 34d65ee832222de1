"""The kit's one migration runner (``kit.migrations.run``) on a store of the test's own, and the
blocking ``migrate`` over it: what the runner decides (order, versions, the additions' table,
the refusal, the log line) whatever the backend, every option at its default included."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from typing import Any, Final

import pytest

from anarchon import BackendError
from anarchon.kit.migrations import (
    LOGGER,
    Additions,
    Step,
    Store,
    Versions,
    migrate,
    numbered_steps,
    run,
)

STEPS: Final = [
    Step(1, "runs", "CREATE TABLE runs (id INTEGER)"),
    Step(2, "jobs", "CREATE TABLE jobs (name TEXT)"),
    Step(3, "note", "ALTER TABLE jobs ADD COLUMN note TEXT", additive=True),
]


class Toy:
    """A store in memory that notes what the runner asks of it, in order."""

    def __init__(self, versions: Versions, fail: str | None = None) -> None:
        self.found, self.fail = versions, fail
        self.calls: list[str] = []

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.calls.append("lock")
        try:
            yield
        except BaseException:
            self.calls.append("rollback")
            raise
        self.calls.append("commit")

    async def versions(self) -> Versions:
        self.calls.append("versions")
        return self.found

    async def execute(self, step: Step) -> None:
        await asyncio.sleep(0)  # a real store waits for its server
        if step.name == self.fail:
            raise RuntimeError(f"{step.name} failed")
        self.calls.append(f"execute {step.name}")

    async def record(self, version: int, *, addition: bool) -> None:
        self.calls.append(f"record {version}{' apart' if addition else ''}")


def migrated(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.name, r.getMessage()) for r in caplog.records if getattr(r, "action", None) == "migrated"
    ]


async def test_run_with_its_defaults_runs_records_and_logs_each_step_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    # Versions' default (added=None): the store keeps no additions table, so the additive step
    # is recorded in the version table as the others; the log goes to the kit's own logger.
    new: Store = Toy(Versions(0))
    assert [s.name for s in await run(new, STEPS, where="toy")] == ["runs", "jobs", "note"]
    assert isinstance(new, Toy)
    assert new.calls == [
        "lock",
        "versions",
        "execute runs",
        "record 1",
        "execute jobs",
        "record 2",
        "execute note",
        "record 3",
        "commit",
    ]
    assert migrated(caplog) == [
        ("anarchon.kit.migrations", "migrated toy from schema version 0 to 3")
    ]
    assert LOGGER.name == "anarchon.kit.migrations"
    caplog.clear()
    done = Toy(Versions(3))
    assert await run(done, STEPS, where="toy") == []
    assert done.calls == ["lock", "versions", "commit"]
    assert migrated(caplog) == []


async def test_run_records_additions_apart_and_refuses_a_newer_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    mine = logging.getLogger("anarchon.backends.toy")
    store = Toy(Versions(1, 0))
    assert [s.version for s in await run(store, STEPS, where="toy", logger=mine)] == [2, 3]
    assert store.calls[2:-1] == ["execute jobs", "record 2", "execute note", "record 3 apart"]
    assert migrated(caplog) == [
        ("anarchon.backends.toy", "migrated toy from schema version 1 to 3")
    ]
    # Additions newer than this code knows are ignored; a newer version table is refused
    # before any step runs.
    assert await run(Toy(Versions(2, 9)), STEPS, where="toy") == []
    newer = Toy(Versions(4, 0))
    with pytest.raises(
        BackendError,
        match=r"^toy: database schema version 4, newer than this anarchon understands \(3\); "
        "upgrade anarchon$",
    ):
        await run(newer, STEPS, where="toy")
    assert newer.calls == ["lock", "versions", "rollback"]
    with pytest.raises(ValueError, match=r"numbered 1, 2, 3 ... in order, not \[2, 3\]"):
        await run(Toy(Versions(0)), STEPS[1:], where="toy")


async def test_a_failed_step_rolls_back_and_logs_no_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The version reached is logged once committed: a step that fails rolls back the ones
    # before it in the same transaction, and the store was not migrated.
    caplog.set_level(logging.INFO)
    store = Toy(Versions(0), fail="note")
    with pytest.raises(RuntimeError, match="note failed"):
        await run(store, STEPS, where="toy")
    assert store.calls[-2:] == ["record 2", "rollback"]
    assert migrated(caplog) == []


def test_numbered_steps_reads_migration_queries_in_order() -> None:
    queries = {"migration_2": "B", "migration_1": "A", "other": "C"}
    assert numbered_steps(queries, 2) == [Step(1, "migration_1", "A"), Step(2, "migration_2", "B")]
    assert [s.additive for s in numbered_steps(queries, 2, additive={2})] == [False, True]
    assert numbered_steps(queries, 0) == []
    with pytest.raises(ValueError, match=r"no named queries \['migration_3'\] .* steps 1 to 3"):
        numbered_steps(queries, 3)


VERSION: Final[dict[str, Any]] = {
    "create_table": "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    "read_version": "SELECT max(version) FROM schema_version",
    "write_version": "INSERT INTO schema_version (version) VALUES (?)",
}


def test_migrate_opens_the_given_transaction_and_logs_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    seen: list[str] = []
    mine = logging.getLogger("anarchon.backends.toy")

    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:

        @contextlib.contextmanager
        def immediate() -> Iterator[None]:
            conn.execute("BEGIN IMMEDIATE")
            seen.append(f"begin, {len(migrated(caplog))} logged")
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            seen.append(f"commit, {len(migrated(caplog))} logged")

        broken = Step(3, "broken", "CREATE TABLE jobs (name TEXT)")  # exists: fails
        with pytest.raises(sqlite3.OperationalError, match="already exists"):
            migrate(conn, [*STEPS[:2], broken], **VERSION, where="toy", transaction=immediate)
        # Rolled back whole: no table, no version, nothing logged.
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
        assert migrated(caplog) == []
        ran = migrate(conn, STEPS, **VERSION, where="toy", transaction=immediate, logger=mine)
        assert [s.name for s in ran] == ["runs", "jobs", "note"]
        assert seen == ["begin, 0 logged", "begin, 0 logged", "commit, 0 logged"]
        assert migrated(caplog) == [
            ("anarchon.backends.toy", "migrated toy from schema version 0 to 3")
        ]


def test_migrate_with_its_defaults_runs_in_the_callers_transaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    additions = Additions(
        create_table="CREATE TABLE IF NOT EXISTS additions (version INTEGER NOT NULL)",
        read_version="SELECT max(version) FROM additions",
        write_version="INSERT INTO additions (version) VALUES (?)",
    )
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        conn.execute("BEGIN")
        assert len(migrate(conn, STEPS, **VERSION, where="toy", additions=additions)) == 3
        assert conn.in_transaction  # opened none, committed nothing: the caller's own
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    assert migrated(caplog) == [
        ("anarchon.kit.migrations", "migrated toy from schema version 0 to 3")
    ]
