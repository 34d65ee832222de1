"""The PostgreSQL backend's control store: pauses and run requests (:mod:`anarchon.control`) in
two tables beside the runs, ``<schema>.<table_prefix>pauses`` and ``<table_prefix>requests``.

The tables are made by the backend's migrations (``migration_3`` in ``queries.sql``), so a
started backend has them; the claim statement reads ``pauses`` itself (the pause check adds no
round trip). Every call here is one statement through the backend's pool (its timeout and error
translation), so each is atomic. A read of tables that are not there (a reader on a schema no
scheduler of this version has migrated) answers empty and creates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from anarchon.control import Pause, RunRequest

if TYPE_CHECKING:
    from ._backend import PostgresBackend
    from ._connection import Rows

__all__ = ["PostgresControl"]


class PostgresControl:
    """A :class:`~anarchon.control.ControlStore` in the backend's ``pauses`` and ``requests``
    tables."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend

    async def _run(self, name: str, params: dict[str, Any] | None = None) -> Rows:
        db = self._backend._db
        query = self._backend._queries[name]
        return await db.call(lambda conn: db.select(conn, query, params))

    async def _read(self, name: str, params: dict[str, Any] | None = None) -> Rows:
        """The rows of a read; none when the tables are not there."""
        return await self._backend._db.read_if_there(self._backend._queries[name], params)

    async def pause(self, pause: Pause) -> None:
        """See :meth:`anarchon.control.ControlStore.pause`."""
        await self._run("pause", pause.to_dict())

    async def resume(self, job: str) -> Pause | None:
        """See :meth:`anarchon.control.ControlStore.resume`."""
        found = await self._run("resume", {"job": job})
        return Pause.from_dict(found[0]) if found else None

    async def pauses(self) -> list[Pause]:
        """See :meth:`anarchon.control.ControlStore.pauses`."""
        return [Pause.from_dict(row) for row in await self._read("pauses")]

    async def request(self, request: RunRequest) -> bool:
        """See :meth:`anarchon.control.ControlStore.request`."""
        return bool(await self._run("request", request.to_dict()))

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """See :meth:`anarchon.control.ControlStore.requests`: one index scan per job."""
        found = await self._read("requests", {"jobs": None if jobs is None else list(jobs)})
        return [RunRequest.from_dict(row) for row in found]

    async def done(self, request_id: str) -> None:
        """See :meth:`anarchon.control.ControlStore.done`."""
        await self._run("request_done", {"id": request_id})
