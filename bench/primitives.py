"""The floor: each backend's raw claim primitive, done by the same client library anarchon uses.

=========  ========================================================================  =========
backend    primitive (one "claim" of key k; won when this call created it)           client
=========  ========================================================================  =========
sqlite     ``BEGIN IMMEDIATE; INSERT OR IGNORE INTO claims VALUES (k); COMMIT`` on a   sqlite3
           file in WAL mode with ``synchronous=FULL`` (the backend's pragmas), run in
           a one-thread executor as the backend runs its statements
redis      ``SET k 1 NX``                                                              redis-py
postgres   ``INSERT INTO floor.claims VALUES (k) ON CONFLICT DO NOTHING`` (autocommit)  psycopg 3
nats       JetStream publish with ``Nats-Msg-Id: k`` to a stream made by the backend    nats-py
           (file storage, same duplicate window); won unless the ack says duplicate
=========  ========================================================================  =========

A batch (the burst's reference) is the same primitive for many keys in one go: one
transaction (SQLite), one pipeline (Redis), one statement over an array (PostgreSQL), or
publishes kept 256 in flight (NATS, as the backend does).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["Primitive", "begin_polling", "make_primitive", "prepare_sqlite"]

FLOOR_TABLE = "floor.claims"
NATS_IN_FLIGHT = 256


def begin_polling(conn: sqlite3.Connection, waits: Iterator[float], busy_s: float) -> None:
    """``BEGIN IMMEDIATE``, retried after each of ``waits`` while another process writes (for up
    to ``busy_s``), instead of SQLite's busy handler; the busy timeout is ``busy_s`` after."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + busy_s
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(next(waits))
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")


class Primitive(abc.ABC):
    """One client doing the raw claim primitive."""

    async def open(self) -> None:  # noqa: B027 - optional
        """Connect."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Disconnect."""

    @abc.abstractmethod
    async def claim(self, key: str) -> bool:
        """Do the primitive for ``key``; True if this call won it."""

    @abc.abstractmethod
    async def claim_batch(self, keys: list[str]) -> int:
        """Do the primitive for every key in one go; return how many this call won."""


def prepare_sqlite(path: str) -> None:
    """Create the floor file and table (once, before processes contend for it)."""
    conn = _sqlite_connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS claims (k TEXT PRIMARY KEY)")
    conn.close()


def _sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


class SQLitePrimitive(Primitive):
    """``lock_poll_s``: when set, a ``BEGIN IMMEDIATE`` that finds another process's write
    under way is tried again every ``lock_poll_s`` (busy timeout 0 for it) instead of through
    SQLite's busy handler, whose sleeps (1, 2, 5, 10 ... ms) would be measured instead of the
    other writers' commits (the distinct-key floor, where every process writes at once)."""

    def __init__(self, path: str, lock_poll_s: float | None = None) -> None:
        self.path = path
        self.lock_poll_s = lock_poll_s
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="floor-sqlite")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(self._thread, _sqlite_connect, self.path)

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._conn.close)
        self._thread.shutdown(wait=True)

    def _insert(self, keys: list[str]) -> int:
        assert self._conn is not None
        conn = self._conn
        if self.lock_poll_s is None:
            conn.execute("BEGIN IMMEDIATE")
        else:
            begin_polling(conn, itertools.repeat(self.lock_poll_s), busy_s=10.0)
        try:
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO claims (k) VALUES (?)", [(k,) for k in keys])
            won = conn.total_changes - before
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return won

    async def claim(self, key: str) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._insert, [key]) == 1

    async def claim_batch(self, keys: list[str]) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._insert, keys)


class RedisPrimitive(Primitive):
    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self._client: Any = None

    async def open(self) -> None:
        from redis.asyncio import Redis

        self._client = Redis.from_url(self.url)
        await self._client.ping()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def claim(self, key: str) -> bool:
        return bool(await self._client.set(self.prefix + key, b"1", nx=True))

    async def claim_batch(self, keys: list[str]) -> int:
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.set(self.prefix + key, b"1", nx=True)
        return sum(1 for answer in await pipe.execute() if answer)


class PostgresPrimitive(Primitive):
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: Any = None

    async def open(self) -> None:
        import psycopg

        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def claim(self, key: str) -> bool:
        cur = await self._conn.execute(
            f"INSERT INTO {FLOOR_TABLE} (k) VALUES (%s) ON CONFLICT DO NOTHING", (key,)
        )
        return bool(cur.rowcount == 1)

    async def claim_batch(self, keys: list[str]) -> int:
        cur = await self._conn.execute(
            f"INSERT INTO {FLOOR_TABLE} (k) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING",
            (keys,),
        )
        return int(cur.rowcount)


class NatsPrimitive(Primitive):
    def __init__(self, servers: str, subject: str) -> None:
        self.servers = servers
        self.subject = subject
        self._nc: Any = None
        self._js: Any = None

    async def open(self) -> None:
        import nats

        self._nc = await nats.connect(servers=[self.servers], connect_timeout=5)
        self._js = self._nc.jetstream(timeout=10)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def claim(self, key: str) -> bool:
        ack = await self._js.publish(self.subject, b"", headers={"Nats-Msg-Id": key})
        return not ack.duplicate

    async def claim_batch(self, keys: list[str]) -> int:
        gate = asyncio.Semaphore(NATS_IN_FLIGHT)

        async def one(key: str) -> bool:
            async with gate:
                return await self.claim(key)

        return sum(await asyncio.gather(*(one(k) for k in keys)))


def make_primitive(backend: str, params: dict[str, Any]) -> Primitive:
    """The primitive of ``backend`` ("sqlite", "redis", "postgres", "nats")."""
    if backend == "sqlite":
        return SQLitePrimitive(params["path"], params.get("lock_poll_s"))
    if backend == "redis":
        return RedisPrimitive(params["url"], params["prefix"])
    if backend == "postgres":
        return PostgresPrimitive(params["dsn"])
    if backend == "nats":
        return NatsPrimitive(params["servers"], params["subject"])
    raise ValueError(f"no primitive for backend {backend!r}")
