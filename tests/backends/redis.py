"""Conformance harness: Redis on the shared 127.0.0.1:6379, one key prefix per test.

The prefix's keys are deleted afterwards with SCAN MATCH (never FLUSH: the server is shared).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from anarchon.backends.redis import RedisBackend
from tests.harness import Namespace

SERVER = "redis://127.0.0.1:6379/0"


async def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key of ``prefix`` (exactly that namespace: ``<prefix>{*``)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    deleted = 0
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}{{*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += await client.unlink(*batch)
    finally:
        await client.aclose()
    return deleted


async def reachable(url: str) -> bool:
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(url, socket_connect_timeout=2)
    try:
        return bool(await client.ping())
    except (RedisError, OSError):
        return False
    finally:
        await client.aclose()


def unique_prefix() -> str:
    return f"anarchon-test:{uuid.uuid4().hex[:12]}:"


class RedisHarness:
    name = "redis"
    lease = True
    multiprocess = True

    @asynccontextmanager
    async def namespace(self, tmp_path: Path) -> AsyncIterator[Namespace]:
        if not await reachable(SERVER):
            pytest.skip(f"no Redis at {SERVER}")
        prefix = unique_prefix()
        try:
            yield Namespace(
                make=lambda: RedisBackend(SERVER, prefix=prefix),
                url=f"{SERVER}?prefix={quote(prefix, safe='')}",
                extra={"prefix": prefix},
            )
        finally:
            await delete_prefix(SERVER, prefix)


HARNESS = RedisHarness()
