"""Backends from URLs, for the CLI and for configuration files."""

from __future__ import annotations

import importlib
from typing import Final
from urllib.parse import urlsplit

from .backend import Backend
from .errors import InvalidOption

__all__ = ["backend_from_url"]

SCHEMES: Final = {
    "sqlite": ("anarchon.backends.sqlite", "SQLiteBackend"),
    "memory": ("anarchon.backends.memory", "MemoryBackend"),
    "redis": ("anarchon.backends.redis", "RedisBackend"),
    "rediss": ("anarchon.backends.redis", "RedisBackend"),
    "postgresql": ("anarchon.backends.postgres", "PostgresBackend"),
    "postgres": ("anarchon.backends.postgres", "PostgresBackend"),
    "nats": ("anarchon.backends.nats", "NatsBackend"),
    "tls": ("anarchon.backends.nats", "NatsBackend"),
}


def backend_from_url(url: str) -> Backend:
    """Return the backend a URL names.

    ``sqlite:///relative.db`` and ``sqlite:////absolute/path.db`` (as SQLAlchemy spells them),
    ``memory://``, ``redis://host:6379/0?prefix=app:``,
    ``postgresql://host/db?schema=public&table_prefix=anarchon_``,
    ``nats://host:4222?stream=CRON&prefix=cron.``.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteBackend

        path = url[len("sqlite:///") :] if url.lower().startswith("sqlite:///") else ""
        if not path:
            raise InvalidOption(
                f"backend URL {url!r} names no file; write sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        return SQLiteBackend(path)
    if scheme == "memory":
        from .backends.memory import MemoryBackend

        return MemoryBackend()
    target = SCHEMES.get(scheme)
    if target is None:
        raise InvalidOption(
            f"backend URL {url!r} has an unknown scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in sorted(SCHEMES))
        )
    module = importlib.import_module(target[0])
    cls = getattr(module, target[1])
    backend = cls.from_url(url)
    assert isinstance(backend, Backend)
    return backend
