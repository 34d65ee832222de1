"""The PostgreSQL backend's registry: a table of its own, ``<schema>.<table_prefix>registry``.

Every statement runs through the backend's pool (its timeout and error translation). The table
is created (``IF NOT EXISTS``) before the first write and never by a read. Each step is one
statement, so each is atomic.
"""

from __future__ import annotations

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

    @property
    def _prepare(self) -> bool | None:
        return self._backend._db.options.prepare

    def _query(self, template: str) -> sql.Composed:
        from psycopg import sql

        table = sql.Identifier(self._backend.schema, self._backend.table_prefix + "registry")
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

    async def _table_exists(self, conn: AsyncConnection[Any]) -> bool:
        cursor = await conn.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
            (self._backend.schema, self._backend.table_prefix + "registry"),
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
