"""Fixtures for the PostgreSQL-specific tests: a fresh schema per test on the shared server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN, drop_schema, fresh_schema


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    """A schema name of this test's own, dropped (with everything in it) afterwards."""
    name = fresh_schema()
    try:
        yield name
    finally:
        await drop_schema(name)


@pytest.fixture
async def make(schema: str) -> AsyncIterator[Callable[..., PostgresBackend]]:
    """Make backends on the test's schema; every one made is stopped afterwards."""
    made: list[PostgresBackend] = []

    def factory(**options: Any) -> PostgresBackend:
        backend = PostgresBackend(DSN, schema=schema, **{"max_connections": 3, **options})
        made.append(backend)
        return backend

    try:
        yield factory
    finally:
        for backend in made:
            await backend.stop()
