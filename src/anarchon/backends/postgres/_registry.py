"""The PostgreSQL backend's registry: two tables of its own, ``<schema>.<table_prefix>registry``
(one record per instance) and ``<schema>.<table_prefix>definitions`` (one definitions set per
digest).

Every statement runs through the backend's pool (its timeout and error translation). A table
is created (``IF NOT EXISTS``) before the first write and never by a read. Each step is one
statement, so each is atomic.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from anarchon.registry import InstanceRecord

if TYPE_CHECKING:
    from psycopg import AsyncConnection, sql

    from ._backend import PostgresBackend

__all__ = ["PostgresRegistry"]


class PostgresRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in one table next to the backend's."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._created = False
        self._sets_created = False

    @property
    def _prepare(self) -> bool | None:
        return self._backend._db.options.prepare

    def _query(self, template: str, kind: str = "registry") -> sql.Composed:
        from psycopg import sql

        table = sql.Identifier(self._backend.schema, self._backend.table_prefix + kind)
        return sql.SQL(template).format(table=table)

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        create = not self._created
        upsert = self._query(
            "INSERT INTO {table} (instance, heartbeat_ms, record) VALUES (%s, %s, %s) "
            "ON CONFLICT (instance) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms, "
            "record = excluded.record"
        )
        create_table = self._query(
            "CREATE TABLE IF NOT EXISTS {table} (instance text PRIMARY KEY, "
            "heartbeat_ms bigint NOT NULL, record text NOT NULL)"
        )

        async def write(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                if create:
                    await conn.execute(create_table, prepare=False)
                await conn.execute(
                    upsert,
                    (instance.id, instance.heartbeat_ms, instance.to_json()),
                    prepare=self._prepare,
                )

        await self._backend._db.call(write)
        self._created = True

    async def _table_exists(self, conn: AsyncConnection[Any], kind: str = "registry") -> bool:
        cursor = await conn.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
            (self._backend.schema, self._backend.table_prefix + kind),
            prepare=self._prepare,
        )
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        select = self._query("SELECT record FROM {table}")

        async def read(conn: AsyncConnection[Any]) -> list[str]:
            async with conn.transaction():
                if not await self._table_exists(conn):
                    return []
                cursor = await conn.execute(select, prepare=self._prepare)
                return [row[0] for row in await cursor.fetchall()]

        found = (InstanceRecord.from_json(text) for text in await self._backend._db.call(read))
        return [record for record in found if record is not None]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""

        async def work(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                return await self._table_exists(conn)

        return await self._backend._db.call(work)

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        delete = self._query("DELETE FROM {table} WHERE instance = %s")

        async def work(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                if await self._table_exists(conn):
                    await conn.execute(delete, (instance_id,), prepare=self._prepare)

        await self._backend._db.call(work)

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""
        delete = self._query("DELETE FROM {table} WHERE heartbeat_ms < %s RETURNING instance")

        async def work(conn: AsyncConnection[Any]) -> list[str]:
            async with conn.transaction():
                if not await self._table_exists(conn):
                    return []
                cursor = await conn.execute(delete, (cutoff_ms,), prepare=self._prepare)
                return [row[0] for row in await cursor.fetchall()]

        return await self._backend._db.call(work)

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions`."""
        create = self._query(
            "CREATE TABLE IF NOT EXISTS {table} (digest text PRIMARY KEY, "
            "saved_ms bigint NOT NULL, data bytea NOT NULL)",
            "definitions",
        )
        save = self._query(
            "INSERT INTO {table} AS t (digest, saved_ms, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (digest) DO UPDATE SET saved_ms = greatest(t.saved_ms, "
            "excluded.saved_ms)",
            "definitions",
        )

        async def write(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                if not self._sets_created:
                    await conn.execute(create, prepare=False)
                await conn.execute(save, (digest, saved_ms, data), prepare=self._prepare)

        await self._backend._db.call(write)
        self._sets_created = True

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""
        select = self._query("SELECT data FROM {table} WHERE digest = %s", "definitions")

        async def read(conn: AsyncConnection[Any]) -> bytes | None:
            async with conn.transaction():
                if not await self._table_exists(conn, "definitions"):
                    return None
                cursor = await conn.execute(select, (digest,), prepare=self._prepare)
                row = await cursor.fetchone()
                return None if row is None else bytes(row[0])

        return await self._backend._db.call(read)

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""
        select = self._query("SELECT 1 FROM {table} WHERE digest = %s", "definitions")

        async def read(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                if not await self._table_exists(conn, "definitions"):
                    return False
                cursor = await conn.execute(select, (digest,), prepare=self._prepare)
                return await cursor.fetchone() is not None

        return await self._backend._db.call(read)

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions`: one statement."""
        delete = self._query(
            "DELETE FROM {table} WHERE saved_ms < %s AND NOT (digest = ANY(%s)) RETURNING digest",
            "definitions",
        )

        async def work(conn: AsyncConnection[Any]) -> list[str]:
            async with conn.transaction():
                if not await self._table_exists(conn, "definitions"):
                    return []
                cursor = await conn.execute(
                    delete, (cutoff_ms, sorted(keep)), prepare=self._prepare
                )
                return [row[0] for row in await cursor.fetchall()]

        return await self._backend._db.call(work)
