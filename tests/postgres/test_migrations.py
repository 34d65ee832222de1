"""The PostgreSQL backend migrates with the kit's one runner (``kit.migrations.run``): instances
starting at once, each in a process of its own, on a fresh schema or one an older version left,
migrate it once, log it once as the kit words it, and record the additive version apart."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from anarchon.backends.postgres._queries import Names, Queries
from tests.backends.postgres import DSN, migrate_to, url_of
from tests.migrating import start_at_once

pytestmark = pytest.mark.timeout(240)


async def _versions(schema: str, table: str) -> list[int]:
    name = sql.Identifier(schema, table)
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(sql.SQL("SELECT version FROM {} ORDER BY 1").format(name))
        return [v for (v,) in await cur.fetchall()]


@pytest.mark.parametrize("left", [0, 3], ids=["fresh", "version-3"])
async def test_processes_starting_at_once_migrate_the_schema_once(
    schema: str, tmp_path: Path, left: int
) -> None:
    if left:
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await migrate_to(conn, Queries(Names(schema, "anarchon_")), left)
    logged = await asyncio.to_thread(start_at_once, url_of(schema), 4, tmp_path)
    # One process migrated, and said so once on the backend's logger; the others waited on
    # the advisory lock and found the work done.
    [[(name, message)]] = [lines for lines in logged if lines]
    assert name == "anarchon.backends.postgres"
    assert re.fullmatch(
        rf"migrated tables {schema}\.anarchon_\* in PostgreSQL \S+ from schema version {left} to 5",
        message,
    ), message
    assert await _versions(schema, "anarchon_schema_version") == [1, 2, 3, 4]
    assert await _versions(schema, "anarchon_schema_additions") == [5]
