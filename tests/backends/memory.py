"""Conformance harness: the in-memory backend (one process; instances share one object)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from anarchon import MemoryBackend
from tests.harness import Namespace


class MemoryHarness:
    name = "memory"
    lease = True
    multiprocess = False

    @asynccontextmanager
    async def namespace(self, tmp_path: Path) -> AsyncIterator[Namespace]:
        shared = MemoryBackend()
        yield Namespace(make=lambda: shared, url=None)


HARNESS = MemoryHarness()
