"""Isolated namespaces on the shared services for one bench run, and their removal.

Nothing here stops, flushes or reconfigures a service. One run uses:

* PostgreSQL: a database ``anarchon_bench_<token>`` of its own (a schema per section inside),
  dropped at the end;
* Redis: a private ``redis-server`` (same binary and flags as ``scripts/services.sh``, no
  persistence) on a free loopback port in 17600-17699, started for the run and stopped by its
  pid at the end. The bench's bursts (hundreds of connections, tens of thousands of calls in
  seconds) would otherwise land on the server that timing-sensitive tests share, and theirs
  on the bench's figures; a private server also cannot be left with stray keys. With
  ``BENCH_REDIS=redis://host:port`` the bench uses that server instead, in its
  highest-numbered empty logical database, with keys ``anarchon-bench-<token>:...`` (arq's
  contain the token too) deleted at the end (SCAN + UNLINK, never FLUSHDB);
* NATS: a stream ``BENCH_<token>_<section>`` per section with subjects
  ``bench<token><section>.>``, deleted at the end;
* SQLite: files under ``bench/.work/<token>/``, removed at the end.

The service addresses can be changed with ``BENCH_POSTGRES``, ``BENCH_REDIS`` and
``BENCH_NATS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .primitives import FLOOR_TABLE, prepare_sqlite

__all__ = ["BACKENDS", "NATS", "Services", "Target"]

BACKENDS = ("sqlite", "redis", "postgres", "nats")
LEASE = {"sqlite": True, "redis": True, "postgres": True, "nats": False}
PG_ADMIN = os.environ.get("BENCH_POSTGRES", "postgresql://127.0.0.1:5432/postgres")
SHARED_REDIS = os.environ.get("BENCH_REDIS")
REDIS_PORTS = range(17600, 17700)
NATS = os.environ.get("BENCH_NATS", "nats://127.0.0.1:4222")
CHECK_TIMEOUT_S = 20.0


@dataclass
class Target:
    """One backend row: measured if its module imports and a backend on it starts."""

    name: str
    lease: bool
    available: bool = False
    reason: str | None = None
    primitive: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "available" if self.available else f"not available: {self.reason}"


class Services:
    """Creates the namespaces of one run (:meth:`url`) and removes them all (:meth:`close`)."""

    def __init__(self, work: Path) -> None:
        self.token = uuid.uuid4().hex[:10]
        self.dir = work / self.token
        self.pg_db = f"anarchon_bench_{self.token}"
        self.redis_db: int | None = None
        self.redis_server: str | None = SHARED_REDIS
        self._redis_proc: subprocess.Popen[bytes] | None = None
        self.streams: list[str] = []
        self._pg_created = False

    # -- names ------------------------------------------------------------------------------

    def pg_dsn(self) -> str:
        base = PG_ADMIN.rsplit("/", 1)[0]
        return f"{base}/{self.pg_db}"

    def redis_url(self) -> str:
        return f"{self.redis_server}/{self.redis_db if self.redis_db is not None else 0}"

    def redis_prefix(self, section: str) -> str:
        return f"anarchon-bench-{self.token}:{section}:"

    def nats_names(self, section: str) -> tuple[str, str]:
        return f"BENCH_{self.token}_{section}", f"bench{self.token}{section}."

    def url(self, backend: str, section: str) -> str:
        """The anarchon backend URL of ``section``'s namespace on ``backend``."""
        if backend == "sqlite":
            return f"sqlite:///{self.dir / section}.db"
        if backend == "redis":
            return f"{self.redis_url()}?prefix={quote(self.redis_prefix(section), safe='')}"
        if backend == "postgres":
            return f"{self.pg_dsn()}?schema={section}"
        if backend == "nats":
            stream, prefix = self.nats_names(section)
            if stream not in self.streams:
                self.streams.append(stream)
            return f"{NATS}?stream={stream}&prefix={prefix}"
        if backend == "memory":
            return "memory://"
        raise ValueError(f"unknown backend {backend!r}")

    # -- set-up -----------------------------------------------------------------------------

    async def open(self, wanted: list[str]) -> dict[str, Target]:
        """Prepare the services ``wanted`` and check each backend; never raises."""
        self.dir.mkdir(parents=True, exist_ok=True)
        targets: dict[str, Target] = {}
        for name in wanted:
            target = Target(name, LEASE[name])
            try:
                await asyncio.wait_for(self._prepare(name, target), CHECK_TIMEOUT_S)
                await asyncio.wait_for(self._check(name), CHECK_TIMEOUT_S)
                target.available = True
            except Exception as exc:
                target.reason = _describe(exc)
            targets[name] = target
        return targets

    async def _prepare(self, name: str, target: Target) -> None:
        if name == "sqlite":
            path = str(self.dir / "floor-primitive.db")
            prepare_sqlite(path)
            target.primitive = {"path": path}
        elif name == "redis":
            if self.redis_server is None:
                self.redis_server = await self._start_redis()
            self.redis_db = await _empty_redis_db(self.redis_server)
            target.primitive = {"url": self.redis_url(), "prefix": self.redis_prefix("primitive")}
        elif name == "postgres":
            await self._create_pg()
            target.primitive = {"dsn": self.pg_dsn()}
        elif name == "nats":
            stream, prefix = self.nats_names("primitive")
            self.streams.append(stream)
            target.primitive = {"servers": NATS, "subject": f"{prefix}floor.claims"}

    async def _check(self, name: str) -> None:
        """Import the backend, start it on the primitive's namespace (creating a NATS stream
        there for the primitive to publish to), stop it."""
        from anarchon import backend_from_url

        url = self.url(name, "primitive")
        backend = backend_from_url(url)
        await backend.start()
        await backend.stop()

    async def _create_pg(self) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as conn:
            await conn.execute(f'CREATE DATABASE "{self.pg_db}"')
        self._pg_created = True
        async with await psycopg.AsyncConnection.connect(self.pg_dsn(), autocommit=True) as conn:
            schema, table = FLOOR_TABLE.split(".")
            await conn.execute(f"CREATE SCHEMA {schema}")
            await conn.execute(f"CREATE TABLE {schema}.{table} (k text PRIMARY KEY)")

    async def _start_redis(self) -> str:
        """Start a private redis-server on a free port; return its URL (no database)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (set BENCH_REDIS to use a server)")
        port = _free_port(REDIS_PORTS)
        folder = self.dir / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "redis.log").open("wb") as log:
            self._redis_proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(folder),
                    "--maxclients",
                    "10000",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"redis://127.0.0.1:{port}"
        from redis.asyncio import Redis

        for _ in range(100):
            client = Redis.from_url(f"{url}/0", socket_connect_timeout=1)
            try:
                if await client.ping():
                    return url
            except Exception:
                await asyncio.sleep(0.05)
            finally:
                await client.aclose()
        raise RuntimeError(f"private redis-server on port {port} did not answer")

    # -- removal ----------------------------------------------------------------------------

    async def close(self) -> list[str]:
        """Remove everything this run created; return what could not be removed."""
        problems: list[str] = []
        for step in (self._drop_pg, self._clean_redis, self._delete_streams):
            try:
                await asyncio.wait_for(step(), 60)
            except Exception as exc:
                problems.append(f"{step.__name__}: {_describe(exc)}")
        shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    async def _drop_pg(self) -> None:
        if not self._pg_created:
            return
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')

    async def _clean_redis(self) -> None:
        if self._redis_proc is not None:
            self._redis_proc.terminate()
            try:
                await asyncio.to_thread(self._redis_proc.wait, 10)
            except subprocess.TimeoutExpired:
                self._redis_proc.kill()
                await asyncio.to_thread(self._redis_proc.wait, 10)
            return
        if self.redis_db is None:
            return
        from redis.asyncio import Redis

        client = Redis.from_url(self.redis_url())
        try:
            batch: list[bytes] = []
            async for key in client.scan_iter(match=f"*{self.token}*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.unlink(*batch)
                    batch.clear()
            if batch:
                await client.unlink(*batch)
        finally:
            await client.aclose()

    async def _delete_streams(self) -> None:
        """Each stream of the run and its key-value buckets (registry, definitions, control)."""
        if not self.streams:
            return
        import nats
        import nats.js.errors

        from anarchon.backends.nats._registry import bucket_streams

        nc = await nats.connect(servers=[NATS], connect_timeout=5)
        try:
            js = nc.jetstream()
            for stream in self.streams:
                for name in (stream, *bucket_streams(stream)):
                    with contextlib.suppress(nats.js.errors.NotFoundError):
                        await js.delete_stream(name)
        finally:
            await nc.close()


def _free_port(ports: range) -> int:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {ports.start}-{ports.stop - 1}")


async def _empty_redis_db(server: str) -> int:
    """The highest-numbered logical database that holds no key (0 if none is empty)."""
    from redis.asyncio import Redis

    client = Redis.from_url(f"{server}/0", socket_connect_timeout=3)
    try:
        try:
            databases = int(str((await client.config_get("databases")).get("databases", 16)))
        except Exception:  # CONFIG may be disabled; 16 is Redis's default
            databases = 16
        keyspace = await client.info("keyspace")
    finally:
        await client.aclose()
    for db in range(databases - 1, 0, -1):
        if f"db{db}" not in keyspace:
            return db
    return 0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {CHECK_TIMEOUT_S:.0f} s"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
