"""The SQLite backend's control store: pauses and run requests in tables of the same file.

``anarchon_pauses`` holds one row per job name (``*``: every job) and ``anarchon_requests`` one
row per run request, indexed by ``(job, due_ms)``; migration 5 creates both when the backend
starts. Every statement runs on the backend's connection (its thread), so it shares the
backend's busy timeout and error translation, and each step is one statement, so each is
atomic. The claim reads the pauses of its job inside its own ``BEGIN IMMEDIATE`` transaction
(:meth:`._rows.SQLiteRows.pauses`). A read of a file whose tables are missing answers empty
and creates nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...control import Pause, RunRequest
from ...errors import BackendError
from ._errors import DATA_ERRORS
from ._queries import Q
from ._rows import pause_of, request_of

if TYPE_CHECKING:
    from ._backend import SQLiteBackend

__all__ = ["SQLiteControl"]

T = TypeVar("T")

# At most this many job names per query (SQLite binds at most 999 parameters by default on old
# builds).
CHUNK = 400


class SQLiteControl:
    """A :class:`~anarchon.control.ControlStore` in the backend's SQLite file."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self._backend = backend
        self._tables = False

    def _have_tables(self, conn: sqlite3.Connection) -> bool:
        """True once the control tables exist; a read before then answers empty."""
        if not self._tables:
            self._tables = int(conn.execute(Q["control_tables"]).fetchone()[0]) == 2
        return self._tables

    async def _write(self, value: Pause | RunRequest, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run one write; a value the file cannot hold (an integer beyond 64 bits) is refused
        with a :class:`~anarchon.errors.BackendError` that names it."""
        try:
            return await self._backend._db.call(fn)
        except DATA_ERRORS as exc:
            raise BackendError(
                f"SQLite {self._backend.path}: cannot store {value!r}: {exc} (times are epoch "
                "milliseconds that fit a 64-bit integer)"
            ) from exc

    async def pause(self, pause: Pause) -> None:
        """See :meth:`anarchon.control.ControlStore.pause`."""
        await self._write(pause, lambda conn: conn.execute(Q["set_pause"], pause.to_dict()))

    async def resume(self, job: str) -> Pause | None:
        """See :meth:`anarchon.control.ControlStore.resume`."""

        def delete(conn: sqlite3.Connection) -> Pause | None:
            if not self._have_tables(conn):
                return None
            found = conn.execute(Q["drop_pause"], (job,)).fetchone()
            return None if found is None else pause_of(found)

        return await self._backend._db.call(delete)

    async def pauses(self) -> list[Pause]:
        """See :meth:`anarchon.control.ControlStore.pauses`."""

        def read(conn: sqlite3.Connection) -> list[Pause]:
            if not self._have_tables(conn):
                return []
            return [pause_of(values) for values in conn.execute(Q["all_pauses"])]

        return await self._backend._db.call(read)

    async def request(self, request: RunRequest) -> bool:
        """See :meth:`anarchon.control.ControlStore.request`."""
        db = self._backend._db

        def add(conn: sqlite3.Connection) -> bool:
            return conn.execute(Q["add_request"], request.to_dict()).fetchone() is not None

        # In a write transaction: a step of the wall clock not yet taken is taken (the stored
        # requests' due times moved by it) before this request, made after the step, is stored.
        return await self._write(request, lambda conn: db.write(conn, lambda rows, now: add(conn)))

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """See :meth:`anarchon.control.ControlStore.requests`: one query per 400 jobs."""
        names = None if jobs is None else list(dict.fromkeys(jobs))

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if not self._have_tables(conn):
                return []
            if names is None:
                return conn.execute(Q["all_requests"]).fetchall()
            rows: list[tuple[Any, ...]] = []
            for start in range(0, len(names), CHUNK):
                chunk = names[start : start + CHUNK]
                query = Q["job_requests"].replace("?jobs", ", ".join("?" * len(chunk)))
                rows += conn.execute(query, chunk).fetchall()
            return rows

        found = [request_of(values) for values in await self._backend._db.call(read)]
        if names is not None and len(names) > CHUNK:
            found.sort(key=lambda r: (r.due_ms, r.requested_at_ms, r.id))
        return found

    async def done(self, request_id: str) -> None:
        """See :meth:`anarchon.control.ControlStore.done`."""

        def delete(conn: sqlite3.Connection) -> None:
            if self._have_tables(conn):
                conn.execute(Q["drop_request"], (request_id,))

        await self._backend._db.call(delete)
