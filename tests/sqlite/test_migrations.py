"""The SQLite backend migrates with the kit's one runner (``kit.migrations.migrate``, over
``kit.migrations.run``): instances starting at once, each in a process of its own, on a new
file or one an older version left, migrate it once and log it once as the kit words it (as
PostgreSQL does), and a file of a newer version is refused in the kit's words."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from anarchon import BackendError, SQLiteBackend
from anarchon.backends.sqlite._queries import STEPS, Q
from anarchon.kit.migrations import migrate
from tests.migrating import start_at_once

pytestmark = pytest.mark.timeout(240)


def _versions(path: Path, table: str) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [v for (v,) in conn.execute(f"SELECT version FROM {table} ORDER BY 1")]


def _make_version(path: Path, last: int) -> None:
    """A file an anarchon of schema version ``last`` left."""
    with closing(sqlite3.connect(path)) as conn:
        migrate(
            conn,
            STEPS[:last],
            create_table=Q["create_schema_table"],
            read_version=Q["schema_version"],
            write_version=Q["set_schema_version"],
            where=f"version {last}",
        )
        conn.commit()


@pytest.mark.parametrize("left", [0, 5], ids=["new", "version-5"])
async def test_processes_starting_at_once_migrate_the_file_once(tmp_path: Path, left: int) -> None:
    path = tmp_path / "shared.db"
    if left:
        _make_version(path, left)
    logged = await asyncio.to_thread(start_at_once, f"sqlite:///{path}", 4, tmp_path)
    # One process migrated, and said so once on the backend's logger; the others waited on
    # BEGIN IMMEDIATE and found the work done.
    assert [lines for lines in logged if lines] == [
        [("anarchon.backends.sqlite", f"migrated SQLite {path} from schema version {left} to 7")]
    ]
    assert _versions(path, "anarchon_schema") == [1, 2, 3, 4, 5, 6]
    assert _versions(path, "anarchon_schema_additions") == [7]


async def test_a_file_of_a_newer_version_is_refused_in_the_kits_words(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    _make_version(path, 6)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO anarchon_schema (version) VALUES (99)")
        conn.commit()
    with pytest.raises(
        BackendError,
        match=rf"^SQLite {re.escape(str(path))}: database schema version 99, newer than this "
        r"anarchon understands \(7\); upgrade anarchon$",
    ):
        await SQLiteBackend(path).start()
