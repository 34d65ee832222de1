"""A SQLite start cancelled while the file is being opened (a stop during the scheduler's start,
``start_cancelled``) closes what the opening made, once it ends on the backend's thread."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from anarchon import SQLiteBackend

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc")


def _open_on(db: Path) -> list[str]:
    """This process's file descriptors on ``db`` (its -wal and -shm files too)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(str(db)):
            found.append(target)
    return found


def _sqlite_threads(before: set[threading.Thread]) -> list[str]:
    """The backend threads alive now that were not before."""
    now = set(threading.enumerate()) - before
    return [t.name for t in now if t.name.startswith("anarchon-sqlite")]


async def test_a_start_cancelled_while_the_file_is_locked_closes_what_it_opened(
    tmp_path: Path,
) -> None:
    # Before, the open went on on its thread after the cancellation, and what it made was
    # never closed: the second connection (for data_version) kept the file open and the
    # thread stayed for the life of the process. Every option at its default.
    db = tmp_path / "anarchon.db"
    before = set(threading.enumerate())
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # the backend's switch to WAL waits for this lock
    backend = SQLiteBackend(db)
    starting = asyncio.ensure_future(backend.start())
    await asyncio.sleep(1.0)
    assert not starting.done() and _sqlite_threads(before), "the open did not wait for the lock"
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(starting, 5)  # at once, not after the busy timeout (10 s)
    locker.execute("COMMIT")
    locker.close()
    # The open ends on its thread now that the lock is free; what it made is then closed.
    for _ in range(150):
        if not _open_on(db) and not _sqlite_threads(before):
            break
        await asyncio.sleep(0.1)
    assert _open_on(db) == [], _open_on(db)
    assert _sqlite_threads(before) == []
    assert not backend._db.is_open
    await backend.start()  # a start tried again opens the file as usual
    try:
        assert await backend.history("job") == []
    finally:
        await backend.stop()
    assert _open_on(db) == []
