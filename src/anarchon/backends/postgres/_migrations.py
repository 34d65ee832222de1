"""The tables' versions: numbered migrations applied on start, and the check of a reader.

The kit's runner (:func:`anarchon.kit.migrations.run`) applies them; this module says what only
PostgreSQL knows (:class:`_Tables`): they run in one transaction that first takes
``pg_advisory_xact_lock`` on a key of the schema and prefix, so instances starting at once on a
fresh database wait for the first one and find the tables made. The SQL is in ``queries.sql``
(``migration_<n>``).

An additive migration (:data:`ADDITIVE`: it only adds what older versions ignore) is recorded
in ``<prefix>schema_additions``, not in ``<prefix>schema_version``: older versions check the
latter alone, so they still start on tables that only gained additions (a rolling deploy), and
this version likewise starts on tables with additions newer than it knows. Tables whose
``schema_version`` is newer are refused.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from anarchon.control import MAX_UNTIL_MS
from anarchon.errors import BackendError
from anarchon.kit.migrations import Step, Versions, numbered_steps, pending, run

from ._queries import RAW

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ._queries import Queries

__all__ = ["SCHEMA_VERSION", "STEPS", "check_readable", "migrate"]

logger = logging.getLogger("anarchon.backends.postgres")

SCHEMA_VERSION: Final = 5
# Version 5: the skip cause's column, and the claim function that writes it (older instances
# call it with their fifteen arguments, and read the columns they know).
ADDITIVE: Final = frozenset({5})
STEPS: Final = numbered_steps(RAW, SCHEMA_VERSION, additive=ADDITIVE)


async def migrate(conn: AsyncConnection[Any], q: Queries, where: str) -> None:
    """Create the schema and tables if missing, apply the migrations they lack, and end the
    stored pauses whose end no time holds (``end_unbounded_pauses``). ``where``: the server,
    as the backend names it."""
    await run(_Tables(conn, q), STEPS, where=_tables(q, where), logger=logger)


class _Tables:
    """The :class:`~anarchon.kit.migrations.Store` of one (schema, table prefix) pair."""

    def __init__(self, conn: AsyncConnection[Any], q: Queries) -> None:
        self.conn, self.q = conn, q

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        q = self.q
        async with self.conn.transaction():
            # Two instances starting at once on a fresh schema: the second waits here, then
            # finds the tables made and its version recorded.
            await self.conn.execute(q["migration_lock"], {"key": q.names.lock_key})
            yield
            # On every start, after the migrations, in their transaction.
            await self.conn.execute(q["end_unbounded_pauses"], {"latest": MAX_UNTIL_MS})

    async def versions(self) -> Versions:
        q = self.q
        if not await _one(self.conn, q["schema_exists"], {"schema": q.names.schema}):
            await self.conn.execute(q["create_schema"])
        await self.conn.execute(q["create_version_table"])
        await self.conn.execute(q["create_additions_table"])
        stored = int(await _one(self.conn, q["schema_version"]) or 0)
        return Versions(stored, int(await _one(self.conn, q["schema_additions"]) or 0))

    async def execute(self, step: Step) -> None:
        for statement in self.q.script(step.name):
            await self.conn.execute(statement)

    async def record(self, version: int, *, addition: bool) -> None:
        record = "set_schema_addition" if addition else "set_schema_version"
        await self.conn.execute(self.q[record], {"version": version})


async def check_readable(conn: AsyncConnection[Any], q: Queries, where: str) -> None:
    """Raise :class:`~anarchon.errors.BackendError` unless the tables exist at the version this
    anarchon reads; create and change nothing (for ``anarchon history``)."""
    params = {"schema": q.names.schema, "table": q.names.prefix + "schema_version"}
    added = {**params, "table": q.names.prefix + "schema_additions"}
    async with conn.transaction():
        found = await _one(conn, q["version_table_exists"], params)
        version = int(await _one(conn, q["schema_version"]) or 0) if found else 0
        found = await _one(conn, q["version_table_exists"], added)
        additions = int(await _one(conn, q["schema_additions"]) or 0) if found else 0
    tables = _tables(q, where)
    if version == 0:
        raise BackendError(
            f"no anarchon {tables}: check the schema and table_prefix options, or start a "
            "scheduler on it first (it creates them)"
        )
    if pending(STEPS, version, where=tables, added=additions):
        raise BackendError(
            f"{tables} are at schema version {max(version, additions)}, older than this "
            f"anarchon reads ({SCHEMA_VERSION}); start a scheduler of this version on them once "
            "to migrate them"
        )


def _tables(q: Queries, where: str) -> str:
    """The tables of ``q`` on the server ``where``, as messages name them."""
    return f"tables {q.names.schema}.{q.names.prefix}* in PostgreSQL {where}"


async def _one(conn: AsyncConnection[Any], query: bytes, params: Any = None) -> Any:
    """The first column of the first row of ``query``, or None."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return row[0] if row else None
