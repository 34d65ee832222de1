"""The PostgreSQL backend's registry: two tables of its own, ``<schema>.<table_prefix>registry``
(one record per instance) and ``<schema>.<table_prefix>definitions`` (one definitions set per
digest).

Every statement runs through the backend's pool (its timeout and error translation). A table
is created (``IF NOT EXISTS``) before the first write and never by a read, under an advisory
lock of the table's name (instances that start together would otherwise race in the catalog:
``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``). Each step is one
statement, so each is atomic, sent alone (autocommit: one round trip; a heartbeat of a hundred
instances a second should not hold a hundred connections for a BEGIN and a COMMIT each); a
read or delete of a table that is not there yet answers empty.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from anarchon.registry import InstanceRecord

if TYPE_CHECKING:
    from ._backend import PostgresBackend
    from ._connection import Rows

__all__ = ["PostgresRegistry"]


class PostgresRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in one table next to the backend's."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._created: set[str] = set()  # the tables this instance created (or found)

    async def _run(self, name: str, params: dict[str, Any] | None = None) -> Rows:
        """The rows of the statement ``name`` of ``queries.sql``, alone; none when its table is
        not there."""
        return await self._backend._db.read_if_there(self._backend._queries[name], params)

    async def _write(self, table: str, name: str, params: dict[str, Any]) -> None:
        """One write into ``table`` (``registry`` or ``definitions``); the first one also
        creates the table (its ``create_`` statement, under the advisory lock), in one
        transaction."""
        if table in self._created:
            await self._run(name, params)
            return
        db, queries = self._backend._db, self._backend._queries
        before = [(queries["registry_lock"], None), (queries[f"create_{table}"], None)]
        query = queries[name]
        await db.call(lambda conn: db.transaction(conn, before, query, params))
        self._created.add(table)

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        params = {
            "instance": instance.id,
            "heartbeat_ms": instance.heartbeat_ms,
            "record": instance.to_json(),
        }
        await self._write("registry", "registry_record", params)

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        found = (
            InstanceRecord.from_json(row["record"]) for row in await self._run("registry_instances")
        )
        return [record for record in found if record is not None]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        params = {"schema": self._backend.schema, "table": self._backend.table_prefix + "registry"}
        [row] = await self._run("registry_exists", params)
        return bool(row["found"])

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        await self._run("registry_remove", {"instance": instance_id})

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""
        removed = await self._run("registry_remove_silent", {"cutoff_ms": cutoff_ms})
        return [row["instance"] for row in removed]

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions`."""
        params = {"digest": digest, "saved_ms": saved_ms, "data": data}
        await self._write("definitions", "save_definitions", params)

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""
        found = await self._run("definitions", {"digest": digest})
        return bytes(found[0]["data"]) if found else None

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""
        return bool(await self._run("has_definitions", {"digest": digest}))

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.touch_definitions`: one ``UPDATE``
        (none when the table is not there yet)."""
        params = {"digest": digest, "saved_ms": saved_ms}
        return bool(await self._run("touch_definitions", params))

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions`: one statement."""
        params = {"cutoff_ms": cutoff_ms, "keep": sorted(keep)}
        return [row["digest"] for row in await self._run("prune_definitions", params)]
