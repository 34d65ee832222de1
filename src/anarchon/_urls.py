"""Backends from URLs, for the CLI and for configuration files."""

from __future__ import annotations

import importlib
from typing import Final
from urllib.parse import urlsplit

from ._redact import redact_url
from .backend import Backend
from .errors import AnarchonError, InvalidOption

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

    A URL that is not one of these raises :class:`~anarchon.errors.InvalidOption`; no message
    ever shows its password or token (see :func:`anarchon._redact.redact_url`).
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidOption(f"backend URL {url!r} must be a URL such as sqlite:///anarchon.db")
    shown = redact_url(url)
    try:
        return _from_url(url, shown)
    except AnarchonError as exc:
        # A backend's own message may quote the URL: make sure it is quoted without secrets.
        text = redact_url(str(exc))
        if text == str(exc):
            raise
        raise type(exc)(text) from None
    except ValueError as exc:  # urllib's, a driver's parser: a malformed URL
        raise InvalidOption(f"backend URL {shown!r} is malformed: {redact_url(str(exc))}") from None


def _from_url(url: str, shown: str) -> Backend:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteBackend

        path = url[len("sqlite:///") :] if url.lower().startswith("sqlite:///") else ""
        if not path:
            raise InvalidOption(
                f"backend URL {shown!r} names no file; write sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        return SQLiteBackend(path)
    if scheme == "memory":
        from .backends.memory import MemoryBackend

        return MemoryBackend()
    target = SCHEMES.get(scheme)
    if target is None:
        raise InvalidOption(
            f"backend URL {shown!r} has an unknown scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in sorted(SCHEMES))
        )
    module = importlib.import_module(target[0])
    cls = getattr(module, target[1])
    backend = cls.from_url(url)
    assert isinstance(backend, Backend)
    return backend
