"""What a backend gives the conformance suite: fresh, isolated namespaces on the real service.

Each backend has a module ``tests/backends/<name>.py`` with a ``HARNESS`` object implementing
:class:`Harness`. A namespace is one isolated store (a SQLite file, a Redis key prefix, a
PostgreSQL schema, a NATS stream and subject prefix): every backend made from it shares the same
data, as instances of one application do, and nothing else does. ``url`` reaches the same
namespace from a subprocess through :func:`anarchon.backend_from_url`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from anarchon import Backend


@dataclass
class Namespace:
    """One isolated store on a real service."""

    make: Callable[[], Backend]
    """A new, unstarted backend object on this namespace (an "instance" of the app)."""
    url: str | None
    """For subprocesses; None when the backend cannot be shared across processes (memory)."""
    extra: dict[str, object] = field(default_factory=dict)


class Harness(Protocol):
    """How the suite reaches one backend."""

    name: str
    lease: bool
    """True for lease backends; brokers skip the lease parts of the suite."""
    multiprocess: bool
    """False when instances cannot be separate processes (memory)."""

    def namespace(self, tmp_path: Path) -> AbstractAsyncContextManager[Namespace]:
        """Create a fresh namespace for one test and remove it afterwards."""


NamespaceFactory = Callable[[Path], AbstractAsyncContextManager[Namespace]]
__all__ = ["AsyncIterator", "Harness", "Namespace", "NamespaceFactory"]
