"""Backends from URLs, for the CLI and for configuration files."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from ._redact import redact_url
from .backend import Backend
from .errors import AnarchonError, InvalidOption

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["ENTRY_POINT_GROUP", "ENV_BACKEND", "backend_from_url", "default_backend"]

ENTRY_POINT_GROUP: Final = "anarchon.backends"
"""Packages register backends for :func:`backend_from_url` in this entry-point group: the name
is the URL scheme, the value a :class:`~anarchon.backend.Backend` class with a
``from_url(url)`` class method (or any callable taking the URL and returning a backend)."""

SCHEMES: Final = {
    "sqlite": "anarchon.backends.sqlite:SQLiteBackend",
    "memory": "anarchon.backends.memory:MemoryBackend",
    "redis": "anarchon.backends.redis:RedisBackend",
    "rediss": "anarchon.backends.redis:RedisBackend",
    "unix": "anarchon.backends.redis:RedisBackend",  # redis-py's unix:///path/to/redis.sock
    "postgresql": "anarchon.backends.postgres:PostgresBackend",
    "postgres": "anarchon.backends.postgres:PostgresBackend",
    "nats": "anarchon.backends.nats:NatsBackend",
    "tls": "anarchon.backends.nats:NatsBackend",
}
"""The built-in schemes, each to its backend class written as an entry point's value
(``module:attribute``), the form a package registers an outside scheme in."""


ENV_BACKEND: Final = "ANARCHON_BACKEND"
"""The environment variable naming the default backend's URL."""


def default_backend() -> tuple[Backend, str | None]:
    """The backend of a scheduler given none, and its URL: ``$ANARCHON_BACKEND``'s, else
    SQLite (no URL)."""
    url = os.environ.get(ENV_BACKEND)
    if url:
        return backend_from_url(url), url
    from .backends.sqlite import SQLiteBackend

    return SQLiteBackend(), None


def backend_from_url(url: str) -> Backend:
    """Return the backend a URL names.

    ``sqlite:///relative.db`` and ``sqlite:////absolute/path.db`` (as SQLAlchemy spells them),
    ``memory://?history_size=500``, ``redis://host:6379/0?prefix=app:``,
    ``postgresql://host/db?schema=public&table_prefix=anarchon_``,
    ``nats://host:4222?stream=CRON&prefix=cron.``.

    Other schemes are looked up in the entry-point group ``anarchon.backends`` of the installed
    packages (:data:`ENTRY_POINT_GROUP`); the built-in schemes win over entry points.

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
    target = SCHEMES.get(scheme)
    if target is None:
        return _from_entry_point(url, shown, scheme)
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    backend = cls.from_url(url)
    assert isinstance(backend, Backend)
    return backend


def _outside_schemes() -> dict[str, EntryPoint]:
    """The schemes installed packages register (entry-point group ``anarchon.backends``);
    importlib.metadata is imported here, only when a URL names no built-in scheme."""
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _from_entry_point(url: str, shown: str, scheme: str) -> Backend:
    outside = _outside_schemes()
    found = outside.get(scheme)
    if found is None:
        known = sorted(SCHEMES) + sorted(set(outside) - set(SCHEMES))
        raise InvalidOption(
            f"backend URL {shown!r} has an unknown scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in known)
            + f" (packages add schemes through the entry-point group {ENTRY_POINT_GROUP!r})"
        )
    try:
        target = found.load()
    except Exception as exc:
        raise InvalidOption(
            f"backend URL {shown!r}: the entry point {found.name} = {found.value!r} of the "
            f"group {ENTRY_POINT_GROUP!r} cannot be loaded: {exc!r}"
        ) from exc
    make = getattr(target, "from_url", target)
    backend = make(url)
    if not isinstance(backend, Backend):
        raise InvalidOption(
            f"backend URL {shown!r}: the entry point {found.name} = {found.value!r} gave "
            f"{backend!r}, not an anarchon.backend.Backend"
        )
    return backend
