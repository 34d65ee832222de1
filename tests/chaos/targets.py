"""The backend of one trial: a fresh namespace on the shared service or on a private server,
optionally one TCP proxy per instance, and the backend's own history read back afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlsplit, urlunsplit

from anarchon import backend_from_url
from tests.chaos.proxy import LinkProxy, ProxyLoop
from tests.chaos.servers import PORTS, PrivateNats, PrivatePostgres, PrivateRedis, Restartable

LEASE_BACKENDS: Final = ("sqlite", "postgres", "redis")
BACKENDS: Final = (*LEASE_BACKENDS, "nats")
SHARED: Final = {
    "postgres": "postgresql://127.0.0.1:5432/test",
    "redis": "redis://127.0.0.1:6379/0",
    "nats": "nats://127.0.0.1:4222",
}


@dataclass
class Target:
    """Where a trial's instances meet."""

    backend: str
    url: str
    """The namespace on the server itself (history is read through it)."""
    instance_urls: list[str]
    """One per instance: through that instance's proxy when the trial has proxies."""
    proxies: list[LinkProxy] = field(default_factory=list)
    server: Restartable | None = None

    @property
    def lease(self) -> bool:
        return self.backend in LEASE_BACKENDS

    def history(self, job: str) -> list[dict[str, Any]]:
        """Every run of ``job`` the backend recorded, as plain dicts."""
        return asyncio.run(_history(self.url, job))


async def _history(url: str, job: str) -> list[dict[str, Any]]:
    backend = backend_from_url(url)
    await backend.start_reader()
    try:
        runs = await backend.history(job, limit=100_000)
    finally:
        await backend.stop()
    return [
        {
            "job": r.job,
            "slot": r.slot_ms,
            "run_id": r.run_id,
            "instance": r.instance,
            "attempt": r.attempt,
            "status": r.status.value,
            "reason": r.reason,
            "error": r.error,
            "fence": r.fence,
            "trigger": r.trigger.value,
        }
        for r in runs
    ]


def _with_port(base: str, port: int) -> str:
    parts = urlsplit(base)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _namespace_url(backend: str, base: str, name: str) -> str:
    if backend == "postgres":
        return f"{base}?schema={name}"
    if backend == "redis":
        return f"{base}?prefix={quote(name, safe='')}"
    return f"{base}?stream={name}&prefix={name.lower()}."


@contextlib.contextmanager
def open_target(
    backend: str, directory: Path, instances: int, private: bool = False, proxied: bool = False
) -> Iterator[Target]:
    """A fresh namespace for one trial; everything made for it is removed afterwards."""
    if backend == "sqlite":
        if private or proxied:
            raise ValueError("SQLite has no server to restart and no link to slow down")
        url = f"sqlite:///{directory / 'anarchon.db'}"
        yield Target(backend, url, [url] * instances)
        return
    token = uuid.uuid4().hex[:12]
    name = {"postgres": f"chaos_{token}", "redis": f"chaos:{token}:", "nats": f"CHAOS_{token}"}[
        backend
    ]
    server: Restartable | None = None
    loop: ProxyLoop | None = None
    proxies: list[LinkProxy] = []
    try:
        if private:
            server = {"postgres": PrivatePostgres, "redis": PrivateRedis, "nats": PrivateNats}[
                backend
            ](*(() if backend == "postgres" else (directory,)))
            server.start()
        base = server.url if server is not None else SHARED[backend]
        if proxied:
            loop = ProxyLoop()
            where = urlsplit(base)
            for _ in range(instances):
                port = PORTS.take_one()
                proxies.append(
                    LinkProxy(loop, port, (where.hostname or "", where.port or 0)).start()
                )
        bases = [_with_port(base, p.port) for p in proxies] or [base] * instances
        url = _namespace_url(backend, base, name)
        yield Target(
            backend, url, [_namespace_url(backend, b, name) for b in bases], proxies, server
        )
    finally:
        for proxy in proxies:
            with contextlib.suppress(Exception):
                proxy.close()
            PORTS.give_back(proxy.port)
        if loop is not None:
            loop.close()
        if server is not None:
            server.close()
        else:
            with contextlib.suppress(Exception):
                asyncio.run(_drop(backend, SHARED[backend], name))


async def _drop(backend: str, base: str, name: str) -> None:
    if backend == "postgres":
        from tests.backends.postgres import drop_schema

        await drop_schema(name, base)
    elif backend == "redis":
        from tests.backends.redis import delete_prefix

        await delete_prefix(base, name)
    else:
        from tests.nats.servers import delete_stream

        await delete_stream(base, name)
