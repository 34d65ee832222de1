"""Conformance harness: PostgreSQL, one fresh schema per test on the shared server.

The server is ``$ANARCHON_TEST_POSTGRES`` (default ``postgresql://127.0.0.1:5432/test``); each
test gets a schema of its own, created by the backend's migrations on start and dropped with
everything in it afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._queries import Queries
from tests.harness import Namespace

DSN: Final = os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")


def fresh_schema() -> str:
    """A schema name no other test uses."""
    return f"anarchon_t_{uuid.uuid4().hex[:12]}"


async def drop_schema(schema: str, dsn: str = DSN) -> None:
    """Drop ``schema`` and everything in it, if it exists."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


def url_of(schema: str, dsn: str = DSN, **params: str) -> str:
    """The URL of ``schema`` on ``dsn`` (plus libpq or backend query parameters)."""
    query = "&".join(f"{k}={v}" for k, v in {"schema": schema, **params}.items())
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


class PostgresHarness:
    name = "postgres"
    lease = True
    multiprocess = True

    @asynccontextmanager
    async def namespace(self, tmp_path: Path) -> AsyncIterator[Namespace]:
        schema = fresh_schema()
        try:
            yield Namespace(
                make=lambda: PostgresBackend(DSN, schema=schema, max_connections=4),
                url=url_of(schema),
                extra={"schema": schema, "dsn": DSN},
            )
        finally:
            await drop_schema(schema)


HARNESS = PostgresHarness()


async def migrate_to(conn: psycopg.AsyncConnection[object], queries: Queries, last: int) -> None:
    """Create the schema and run migrations 1 to ``last`` as a release that stopped there did:
    a store an older version left behind, for the tests of a newer one's migrations."""
    await conn.execute(queries["create_schema"])
    await conn.execute(queries["create_version_table"])
    for version in range(1, last + 1):
        for statement in queries.script(f"migration_{version}"):
            await conn.execute(statement)
        await conn.execute(queries["set_schema_version"], {"version": version})
