"""The tables' versions: numbered migrations applied on start, and the check of a reader.

Migrations run in one transaction that first takes ``pg_advisory_xact_lock`` on a key of the
schema and prefix, so instances starting at once on a fresh database wait for the first one
and find the tables made. The SQL is in ``queries.sql`` (``migration_<n>``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from anarchon.control import MAX_UNTIL_MS
from anarchon.errors import BackendError

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ._queries import Queries

__all__ = ["SCHEMA_VERSION", "check_readable", "migrate"]

logger = logging.getLogger("anarchon.backends.postgres")

SCHEMA_VERSION: Final = 4
MIGRATIONS: Final = {1: "migration_1", 2: "migration_2", 3: "migration_3", 4: "migration_4"}


async def migrate(conn: AsyncConnection[Any], q: Queries) -> None:
    """Create the schema and tables if missing, apply the migrations they lack, and end the
    stored pauses whose end no time holds (``end_unbounded_pauses``)."""
    async with conn.transaction():
        # Two instances starting at once on a fresh schema: the second waits here, then
        # finds the tables made and its version recorded.
        await conn.execute(q["migration_lock"], {"key": q.names.lock_key})
        if not await _one(conn, q["schema_exists"], {"schema": q.names.schema}):
            await conn.execute(q["create_schema"])
        await conn.execute(q["create_version_table"])
        version = _known(int(await _one(conn, q["schema_version"]) or 0), q)
        for number in range(version + 1, SCHEMA_VERSION + 1):
            for statement in q.script(MIGRATIONS[number]):
                await conn.execute(statement)
            await conn.execute(q["set_schema_version"], {"version": number})
            logger.info(
                "migrated %s.%s* to schema version %d",
                q.names.schema,
                q.names.prefix,
                number,
                extra={"action": "migrated"},
            )
        await conn.execute(q["end_unbounded_pauses"], {"latest": MAX_UNTIL_MS})


async def check_readable(conn: AsyncConnection[Any], q: Queries, where: str) -> None:
    """Raise :class:`~anarchon.errors.BackendError` unless the tables exist at the version this
    anarchon reads; create and change nothing (for ``anarchon history``)."""
    params = {"schema": q.names.schema, "table": q.names.prefix + "schema_version"}
    async with conn.transaction():
        found = await _one(conn, q["version_table_exists"], params)
        version = int(await _one(conn, q["schema_version"]) or 0) if found else 0
    tables = f"{q.names.schema}.{q.names.prefix}*"
    if version == 0:
        raise BackendError(
            f"no anarchon tables {tables} in PostgreSQL {where}: check the schema and "
            "table_prefix options, or start a scheduler on it first (it creates them)"
        )
    if _known(version, q) < SCHEMA_VERSION:
        raise BackendError(
            f"tables {tables} in PostgreSQL {where} are at schema version {version}, older than "
            f"this anarchon reads ({SCHEMA_VERSION}); start a scheduler of this version on them "
            "once to migrate them"
        )


def _known(version: int, q: Queries) -> int:
    if version > SCHEMA_VERSION:
        raise BackendError(
            f"tables {q.names.schema}.{q.names.prefix}* are at schema version {version}, "
            f"newer than this anarchon understands ({SCHEMA_VERSION}); upgrade anarchon"
        )
    return version


async def _one(conn: AsyncConnection[Any], query: bytes, params: Any = None) -> Any:
    """The first column of the first row of ``query``, or None."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return row[0] if row else None
