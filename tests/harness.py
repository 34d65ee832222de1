"""What a backend gives the conformance suite: fresh, isolated namespaces on the real service.

Each backend has a module ``tests/backends/<name>.py`` with a ``HARNESS`` object implementing
:class:`Harness`. A namespace is one isolated store (a SQLite file, a Redis key prefix, a
PostgreSQL schema, a NATS stream and subject prefix): every backend made from it shares the same
data, as instances of one application do, and nothing else does. ``url`` reaches the same
namespace from a subprocess through :func:`anarchon.backend_from_url`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import pytest

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


CHAOS: Final = os.environ.get("ANARCHON_CHAOS") == "1"
"""``make chaos`` (``ANARCHON_CHAOS=1``): the long fault runs of every case, not only the one
``make test`` keeps."""


def in_chaos_only(case: str) -> None:
    """Skip ``case`` outside ``make chaos``: a long fault run whose every variant would push
    ``make test`` past its time; ``make test`` runs one variant of the same test."""
    if not CHAOS:
        pytest.skip(f"{case}: a long fault run, in `make chaos` (ANARCHON_CHAOS=1)")


CHAOS_ONLY: Final = pytest.mark.skipif(
    not CHAOS, reason="a long fault run, in `make chaos` (ANARCHON_CHAOS=1)"
)
"""The mark of a parametrized case that only ``make chaos`` runs (see :func:`in_chaos_only`)."""
