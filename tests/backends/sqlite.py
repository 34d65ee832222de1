"""Conformance harness: SQLite, one file per test in the test's temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from anarchon import SQLiteBackend
from tests.harness import Namespace


class SQLiteHarness:
    name = "sqlite"
    lease = True
    multiprocess = True

    @asynccontextmanager
    async def namespace(self, tmp_path: Path) -> AsyncIterator[Namespace]:
        path = tmp_path / "anarchon.db"
        yield Namespace(make=lambda: SQLiteBackend(path), url=f"sqlite:///{path}")


HARNESS = SQLiteHarness()
