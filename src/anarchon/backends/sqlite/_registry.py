"""The SQLite backend's registry: two tables of its own in the same file, ``anarchon_registry``
(one record per instance) and ``anarchon_definitions`` (one definitions set per digest).

Every statement runs on the backend's connection (its thread), so it shares the backend's busy
timeout and error translation. A table is created (``IF NOT EXISTS``) before the first write
and never by a read: a reader of a file where no scheduler recorded itself sees no instances.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from anarchon.registry import InstanceRecord

if TYPE_CHECKING:
    from ._backend import SQLiteBackend

__all__ = ["SQLiteRegistry"]

TABLE: Final = "anarchon_registry"
CREATE: Final = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (instance TEXT PRIMARY KEY, "
    "heartbeat_ms INTEGER NOT NULL, record TEXT NOT NULL)"
)
UPSERT: Final = (
    f"INSERT INTO {TABLE} (instance, heartbeat_ms, record) VALUES (?, ?, ?) "
    "ON CONFLICT (instance) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms, "
    "record = excluded.record"
)
EXISTS: Final = f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{TABLE}'"
SELECT: Final = f"SELECT record FROM {TABLE}"
DELETE: Final = f"DELETE FROM {TABLE} WHERE instance = ?"
DELETE_SILENT: Final = f"DELETE FROM {TABLE} WHERE heartbeat_ms < ? RETURNING instance"
SETS: Final = "anarchon_definitions"
CREATE_SETS: Final = (
    f"CREATE TABLE IF NOT EXISTS {SETS} (digest TEXT PRIMARY KEY, "
    "saved_ms INTEGER NOT NULL, data BLOB NOT NULL)"
)
SAVE_SET: Final = (
    f"INSERT INTO {SETS} (digest, saved_ms, data) VALUES (?, ?, ?) "
    "ON CONFLICT (digest) DO UPDATE SET saved_ms = max(saved_ms, excluded.saved_ms)"
)
SETS_EXIST: Final = f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{SETS}'"
SELECT_SET: Final = f"SELECT data FROM {SETS} WHERE digest = ?"
HAS_SET: Final = f"SELECT 1 FROM {SETS} WHERE digest = ?"
TOUCH_SET: Final = (
    f"UPDATE {SETS} SET saved_ms = max(saved_ms, ?) WHERE digest = ? RETURNING digest"
)
OLD_SETS: Final = f"SELECT digest FROM {SETS} WHERE saved_ms < ?"
DELETE_SET: Final = f"DELETE FROM {SETS} WHERE digest = ? AND saved_ms < ?"


class SQLiteRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in the backend's SQLite file; each step is
    one statement, so each is atomic."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self._backend = backend
        self._created = False

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        create = not self._created

        def write(conn: sqlite3.Connection) -> None:
            if create:
                conn.execute(CREATE)
            conn.execute(UPSERT, (instance.id, instance.heartbeat_ms, instance.to_json()))

        # In a write transaction: a step of the wall clock not yet taken is taken (the stored
        # heartbeats moved by it) before this heartbeat, measured after the step, is stored.
        db = self._backend._db
        await db.call(lambda conn: db.write(conn, lambda rows, now: write(conn)))
        self._created = True

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""

        def read(conn: sqlite3.Connection) -> list[str]:
            if conn.execute(EXISTS).fetchone() is None:
                return []
            self._backend._db.settle(conn)  # heartbeats moved by a step not yet taken
            return [row[0] for row in conn.execute(SELECT).fetchall()]

        found = (InstanceRecord.from_json(text) for text in await self._backend._db.call(read))
        return [record for record in found if record is not None]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        return await self._backend._db.call(lambda c: c.execute(EXISTS).fetchone() is not None)

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""

        def delete(conn: sqlite3.Connection) -> None:
            if conn.execute(EXISTS).fetchone() is not None:
                conn.execute(DELETE, (instance_id,))

        await self._backend._db.call(delete)

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""

        def delete(conn: sqlite3.Connection) -> list[str]:
            if conn.execute(EXISTS).fetchone() is None:
                return []
            return [row[0] for row in conn.execute(DELETE_SILENT, (cutoff_ms,)).fetchall()]

        # In a write transaction, so the heartbeats are moved by a step not yet taken first.
        db = self._backend._db
        return await db.call(lambda conn: db.write(conn, lambda rows, now: delete(conn)))

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions`."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(CREATE_SETS)
            conn.execute(SAVE_SET, (digest, saved_ms, data))

        await self._backend._db.call(write)

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""

        def read(conn: sqlite3.Connection) -> bytes | None:
            if conn.execute(SETS_EXIST).fetchone() is None:
                return None
            row = conn.execute(SELECT_SET, (digest,)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._backend._db.call(read)

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""

        def read(conn: sqlite3.Connection) -> bool:
            if conn.execute(SETS_EXIST).fetchone() is None:
                return False
            return conn.execute(HAS_SET, (digest,)).fetchone() is not None

        return await self._backend._db.call(read)

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.touch_definitions`: one ``UPDATE``."""

        def write(conn: sqlite3.Connection) -> bool:
            if conn.execute(SETS_EXIST).fetchone() is None:
                return False
            return conn.execute(TOUCH_SET, (saved_ms, digest)).fetchone() is not None

        return await self._backend._db.call(write)

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions`: each removal is one
        statement that checks the saved time again."""
        kept = set(keep)

        def delete(conn: sqlite3.Connection) -> list[str]:
            if conn.execute(SETS_EXIST).fetchone() is None:
                return []
            old = [row[0] for row in conn.execute(OLD_SETS, (cutoff_ms,)).fetchall()]
            gone = []
            for digest in old:
                if digest not in kept and conn.execute(DELETE_SET, (digest, cutoff_ms)).rowcount:
                    gone.append(digest)
            return gone

        return await self._backend._db.call(delete)
