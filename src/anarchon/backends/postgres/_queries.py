"""Where the PostgreSQL backend's tables live, and every statement it runs, composed safely.

The statements are the named queries of ``queries.sql``; table, schema and index names are
substituted as quoted identifiers (:class:`psycopg.sql.Identifier`) once the schema and the
table prefix have passed :func:`check_schema` and :func:`check_table_prefix`. Values are always
query parameters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ...errors import InvalidOption
from .._sql import load_queries

if TYPE_CHECKING:
    from psycopg import sql

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Names", "Queries", "check_schema", "check_table_prefix"]

RAW: Final = load_queries(__name__.rpartition(".")[0], "queries.sql")
SCHEMA_VERSION: Final = 2
MIGRATIONS: Final = {1: "migration_1", 2: "migration_2"}

# PostgreSQL truncates identifiers at 63 bytes; the longest name built from the prefix is
# "<prefix>runs_recorded" (13 more characters), hence 40 for the prefix.
_SCHEMA_RULE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PREFIX_RULE: Final = re.compile(r"([a-z_][a-z0-9_]{0,39})?")
_MAX_CHANNEL: Final = 63


def check_schema(schema: object) -> str:
    """Return ``schema`` if it is a plain lower-case identifier PostgreSQL will not fold."""
    if not isinstance(schema, str) or not _SCHEMA_RULE.fullmatch(schema):
        raise InvalidOption(
            f"schema={schema!r} must be 1-63 characters of lower-case letters, digits and '_', "
            "not starting with a digit (it is used as a quoted SQL identifier)"
        )
    if schema.startswith("pg_"):
        raise InvalidOption(f"schema={schema!r} may not start with 'pg_' (reserved by PostgreSQL)")
    return schema


def check_table_prefix(prefix: object) -> str:
    """Return ``prefix`` if the table and index names built from it are valid identifiers."""
    if not isinstance(prefix, str) or not _PREFIX_RULE.fullmatch(prefix):
        raise InvalidOption(
            f"table_prefix={prefix!r} must be at most 40 characters of lower-case letters, "
            "digits and '_', not starting with a digit (table names are <prefix>runs, "
            "<prefix>jobs, <prefix>schema_version)"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Names:
    """The names one (schema, table prefix) pair uses on the server."""

    schema: str
    prefix: str

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel for releases and results (at most 63 characters)."""
        plain = f"{self.schema}.{self.prefix}changes"
        if len(plain) <= _MAX_CHANNEL:
            return plain
        digest = hashlib.sha1(plain.encode(), usedforsecurity=False).hexdigest()[:16]
        return f"anarchon_changes_{digest}"

    @property
    def lock_key(self) -> str:
        """Key of the advisory lock that serialises migrations of this namespace."""
        return f"anarchon migrations {self.schema}.{self.prefix}"

    def identifiers(self) -> dict[str, sql.Composable]:
        """The identifiers ``queries.sql`` refers to, quoted, and the clock expression."""
        from psycopg import sql

        def table(name: str) -> sql.Identifier:
            return sql.Identifier(self.schema, self.prefix + name)

        return {
            "schema": sql.Identifier(self.schema),
            "versions": table("schema_version"),
            "jobs": table("jobs"),
            "runs": table("runs"),
            "pruned": table("pruned"),
            "runs_newest": sql.Identifier(self.prefix + "runs_newest"),
            "runs_recorded": sql.Identifier(self.prefix + "runs_recorded"),
            "runs_running": sql.Identifier(self.prefix + "runs_running"),
            "runs_slot": sql.Identifier(self.prefix + "runs_slot"),
            # The database clock in epoch ms, written once: clock_timestamp() plus a test-only
            # offset (the session setting anarchon.test_clock_offset_ms, never set in
            # production, where it reads NULL and adds 0).
            "now_ms": sql.SQL(
                "(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                " + coalesce(nullif(current_setting('anarchon.test_clock_offset_ms', true),"
                " '')::bigint, 0))"
            ),
        }


class Queries:
    """Every statement of ``queries.sql`` composed for one :class:`Names`."""

    def __init__(self, names: Names) -> None:
        from psycopg import sql

        self.names = names
        idents = names.identifiers()
        # Rendered once: composing a statement again for every call costs more than sending it.
        self._rendered: dict[str, bytes] = {
            name: sql.SQL(text).format(**idents).as_bytes(None)
            for name, text in RAW.items()
            if name not in MIGRATIONS.values()
        }
        self.migrations: dict[int, list[sql.Composed]] = {
            number: [
                sql.SQL(statement.strip()).format(**idents)
                for statement in RAW[name].split(";")
                if statement.strip()
            ]
            for number, name in MIGRATIONS.items()
        }

    def __getitem__(self, name: str) -> bytes:
        return self._rendered[name]
