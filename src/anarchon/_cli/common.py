"""What every ``anarchon`` command shares: exit codes, and opening a backend without creating
anything (what they print: :mod:`.output`)."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final
from urllib.parse import quote

from .._redact import redact_url
from .._urls import ENV_BACKEND as ENV_BACKEND
from .._urls import backend_from_url
from ..backend import Backend
from ..errors import BackendError, BackendUnavailable

EXIT_OK: Final = 0
"""The command did what it was asked."""
EXIT_FAILED: Final = 1
"""The command ran and its answer is a failure: ``health`` found a problem, ``cancel`` could not
cancel every request, the demo saw a slot run twice or not at all, or anarchon failed otherwise."""
EXIT_USAGE: Final = 2
"""The call was wrong: a bad option or value, a configuration that cannot work, a missing extra."""
EXIT_NO_DATA: Final = 3
"""Nothing to answer from: no anarchon data at the backend, no pending request of that id, no
live instance that carries the job."""
EXIT_BACKEND: Final = 4
"""The backend could not be reached or failed the call (:class:`~anarchon.errors.BackendError`)."""
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C (SIGINT) ended the command: 128 + the signal's number, as a shell reports it."""
EXIT_PIPE_CLOSED: Final = 141
"""The reader of the output went away (``anarchon history JOB | head``): 128 + SIGPIPE."""


class Exit(Exception):
    """Leave the command with one line on stderr and an exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def make_backend(url: str | None) -> Backend:
    """The backend to use: ``--backend``, else ``$ANARCHON_BACKEND``, else the SQLite file. An
    empty ``--backend`` is a bad URL (exit 2), not the default: a shell variable left unset."""
    if url is None:
        url = os.environ.get(ENV_BACKEND) or None
    if url is None:
        from ..backends.sqlite import SQLiteBackend

        return SQLiteBackend()
    return backend_from_url(url)


def where(backend: Backend) -> str:
    """The backend as messages name it: a SQLite file's path, else its redacted repr."""
    from ..backends.sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        return str(backend.path)
    return redact_url(repr(backend))


def no_data(backend: Backend, detail: str = "") -> Exit:
    """The exit for a backend that holds no anarchon data."""
    return Exit(EXIT_NO_DATA, f"no anarchon data at {where(backend)}" + detail)


def require_sqlite_data(path: Path) -> None:
    """Exit with EXIT_NO_DATA unless ``path`` is a SQLite file that anarchon wrote; never
    create or change the file (opening it read-only)."""
    missing = Exit(EXIT_NO_DATA, f"no anarchon data at {path}")
    if not path.is_file():
        raise missing
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'anarchon_schema'"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise Exit(EXIT_NO_DATA, f"no anarchon data at {path}: {exc}") from None
    if found is None:
        raise missing


async def require_postgres_data(backend: Backend) -> None:
    """Exit with EXIT_NO_DATA unless anarchon's tables exist in the schema, checked on a
    connection of our own before the backend starts (starting it could create them);
    BackendUnavailable when that connection fails."""
    dsn = getattr(backend, "dsn", None)
    if dsn is None:
        return  # a pool or connection passed in: nothing to check without starting
    import psycopg

    from ..backends.postgres._errors import refusal

    name = f"{backend.schema}.{backend.table_prefix}schema_version"  # type: ignore[attr-defined]
    try:
        async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=5) as conn:
            cursor = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
            row = await cursor.fetchone()
    except psycopg.Error as exc:
        # A BackendError, as Redis and NATS raise when they cannot connect: exit 4, and
        # `health --json` still prints its JSON. Refused for good: the backend's own words.
        refused = refusal(exc)
        if refused is not None:
            raise BackendError(f"{where(backend)} refused the connection: {refused}") from None
        raise BackendUnavailable(f"cannot reach {where(backend)}: {exc}") from None
    if not (row and row[0]):
        raise no_data(backend)


async def require_storage(backend: Backend) -> bool:
    """Before starting ``backend``: exit with EXIT_NO_DATA where its storage is missing (a
    SQLite file, PostgreSQL tables); True if the storage was checked here, False where only a
    read can tell (Redis, NATS)."""
    from ..backends.sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        require_sqlite_data(backend.path)
        return True
    # A PostgresBackend exists only once its module is loaded: not loaded, none to check.
    postgres = sys.modules.get("anarchon.backends.postgres")
    if postgres is not None and isinstance(backend, postgres.PostgresBackend):
        await require_postgres_data(backend)
        return True
    return False


def storage_checked(backend: Backend) -> bool:
    """True where opening ``backend`` proves anarchon's storage exists (a SQLite file,
    PostgreSQL tables, a NATS stream); False where only a record can tell (Redis)."""
    return backend.name in ("sqlite", "postgres", "nats")


def _missing_stream(backend: Backend, exc: BackendError) -> bool:
    # NatsBackend.start_reader raises a plain BackendError when the stream does not exist, or
    # holds no subject under the backend's prefix (no scheduler with that prefix ran on it).
    if backend.name != "nats":
        return False
    from ..backends.nats._stream import PREFIX_MISSING

    return "does not exist" in str(exc) or PREFIX_MISSING in str(exc)


@asynccontextmanager
async def opened(url: str | None, *, registry: bool) -> AsyncIterator[Backend]:
    """The backend ``url`` names, opened with ``start_reader`` (which creates no file, table,
    stream or bucket and changes no stream's settings) and stopped afterwards.

    Exit with EXIT_NO_DATA where it holds no anarchon data: a missing SQLite file or
    PostgreSQL tables, a missing NATS stream, and with ``registry`` where no scheduler ever
    recorded itself (the registry does not exist). Writes (pauses, run requests) go through
    the same opening: they never create a store either.
    """
    backend = make_backend(url)
    await require_storage(backend)
    try:
        await backend.start_reader()
    except BackendError as exc:
        if _missing_stream(backend, exc):
            raise no_data(backend, f": {exc}") from None
        raise
    try:
        if registry:
            store = backend.registry()
            if store is None:
                raise Exit(
                    EXIT_USAGE, f"the {backend.name} backend keeps no registry ({where(backend)})"
                )
            if not await store.exists():
                # A store may say more (NATS: a bucket lost under running schedulers).
                why = getattr(store, "missing_text", None) or "no scheduler recorded itself"
                raise no_data(backend, f": {why}")
        yield backend
    finally:
        await backend.stop()
