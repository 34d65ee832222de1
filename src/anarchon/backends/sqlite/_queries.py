"""The SQLite backend's storage text: the named queries of ``queries.sql`` and the migrations."""

from __future__ import annotations

from typing import Final

from ...kit.migrations import Additions, numbered_steps
from ...kit.sql import load_queries

__all__ = ["ADDITIONS", "SCHEMA_VERSION", "STEPS", "Q"]

Q: Final = load_queries(__package__ or "anarchon.backends.sqlite", "queries.sql")
SCHEMA_VERSION: Final = 7
# Migrations that only add what older anarchons ignore: recorded in anarchon_schema_additions,
# so those versions (which check anarchon_schema alone) keep opening the file.
ADDITIVE: Final = frozenset({7})
STEPS: Final = numbered_steps(Q, SCHEMA_VERSION, additive=ADDITIVE)
ADDITIONS: Final = Additions(
    create_table=Q["create_additions_table"],
    read_version=Q["schema_additions"],
    write_version=Q["set_schema_addition"],
)
