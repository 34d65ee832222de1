"""Conformance harness: the shared NATS JetStream service on 127.0.0.1:4222 (nats-server 2.9.10).

Each namespace is a stream and subject prefix of its own, deleted afterwards with its key-value
buckets (registry, control); the service itself
is never reconfigured.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from anarchon.backends.nats import NatsBackend
from tests.harness import Namespace
from tests.nats.servers import SHARED_URL, delete_stream, unique_names


class NatsHarness:
    name = "nats"
    lease = False
    multiprocess = True

    def __init__(self, url: str = SHARED_URL) -> None:
        self._fixed_url = url

    def server_url(self) -> str:
        """The server this harness uses."""
        return self._fixed_url

    @asynccontextmanager
    async def namespace(self, tmp_path: Path) -> AsyncIterator[Namespace]:
        server = self.server_url()
        stream, prefix = unique_names()
        url = f"{server}?stream={stream}&prefix={prefix}"
        try:
            yield Namespace(
                make=lambda: NatsBackend(server, stream=stream, prefix=prefix),
                url=url,
                extra={"server": server, "stream": stream, "prefix": prefix},
            )
        finally:
            await delete_stream(server, stream)


HARNESS = NatsHarness()
