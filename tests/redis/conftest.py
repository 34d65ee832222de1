"""Fixtures for the Redis backend's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from anarchon.backends.redis import RedisBackend
from tests.backends.redis import SERVER, delete_prefix, reachable, unique_prefix
from tests.redis.servers import RedisServer, redis_server


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A fresh prefix on the shared server, deleted afterwards (SCAN MATCH, never FLUSH)."""
    if not await reachable(SERVER):
        pytest.skip(f"no Redis at {SERVER}")
    name = unique_prefix()
    try:
        yield name
    finally:
        await delete_prefix(SERVER, name)


Make = Callable[..., Awaitable[RedisBackend]]


@pytest.fixture
async def make(prefix: str) -> AsyncIterator[Make]:
    """``make()``: a started backend on the test's prefix (another "instance" each call)."""
    made: list[RedisBackend] = []

    async def factory(**options: object) -> RedisBackend:
        backend = RedisBackend(SERVER, prefix=prefix, **options)  # type: ignore[arg-type]
        await backend.start()
        made.append(backend)
        return backend

    try:
        yield factory
    finally:
        for backend in made:
            await backend.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server in our port range, without persistence, stopped by pid."""
    with redis_server(tmp_path) as server:
        yield server
