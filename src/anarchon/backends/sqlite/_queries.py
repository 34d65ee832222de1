"""The SQLite backend's storage text: the named queries of ``queries.sql`` and the migrations."""

from __future__ import annotations

from typing import Final

from ...kit.migrations import Step
from ...kit.sql import load_queries

__all__ = ["SCHEMA_VERSION", "STEPS", "Q"]

Q: Final = load_queries(__package__ or "anarchon.backends.sqlite", "queries.sql")
SCHEMA_VERSION: Final = 6
STEPS: Final = [
    Step(n, f"migration_{n}", Q[f"migration_{n}"]) for n in range(1, SCHEMA_VERSION + 1)
]
