"""Where the PostgreSQL backend's tables live, and every statement it runs, composed safely.

The statements are the named queries of ``queries.sql``; table, schema and index names are
substituted as quoted identifiers (:class:`psycopg.sql.Identifier`) once the schema and the
table prefix have passed the checks of :mod:`._options`. Values are always query parameters.
The sections named in :data:`PARTS` are pieces of other statements, substituted where those
write ``{run_columns}``, ``{current_attempt}`` ...

The claim runs in a function on the server (``claim_function``, made by a migration): the
statements named in :data:`IN_FUNCTION` are substituted into its body with their parameters
written as the function's arguments (``%(job)s`` as ``a_job``, see :func:`as_variables`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from anarchon.kit.sql import load_queries

if TYPE_CHECKING:
    from psycopg import sql

__all__ = ["IN_FUNCTION", "PARTS", "RAW", "Names", "Queries", "as_variables"]

RAW: Final = load_queries(__name__.rpartition(".")[0], "queries.sql")
# In order: a part may use the parts before it.
PARTS: Final = (
    "run_columns",
    "current_attempt",
    "held_by_ticket",
    "slot_recorded",
    "kept_notices",
    "claim_notices",
    "claim_columns",
)
# Statements (and keep_notice, a PL/pgSQL fragment) substituted into claim_function's body as
# {fn_<name>}; then the function itself, a part of migration_5. Neither is sent on its own.
IN_FUNCTION: Final = (
    "keep_notice",
    "claim_recorded",
    "claim_recorded_one",
    "take_fence",
    "take_fences",
    "lock_jobs",
    "claim_alone",
    "claim_plain",
    "plain_notices",
    "plain_notices_chunked",
    "claim_decide",
)
_FUNCTION_ONLY: Final = (
    "keep_notice",
    "claim_recorded",
    "claim_recorded_one",
    "take_fence",
    "take_fences",
    "claim_alone",
    "claim_plain",
    "plain_notices",
    "plain_notices_chunked",
    "claim_function",
)
# The statements of the additive migrations' table: the version table's, on {additions}.
_ADDITIONS: Final = {
    "create_additions_table": "create_version_table",
    "schema_additions": "schema_version",
    "set_schema_addition": "set_schema_version",
}
_MAX_CHANNEL: Final = 63
# A named parameter, or a percent sign written twice (queries.sql's conventions).
_PLACEHOLDER: Final = re.compile(rb"%\((\w+)\)s|%%")


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
        """The identifiers ``queries.sql`` refers to, quoted, the clock expression and the
        prefix of the claim's advisory lock keys."""
        from psycopg import sql

        def table(name: str) -> sql.Identifier:
            return sql.Identifier(self.schema, self.prefix + name)

        return {
            "schema": sql.Identifier(self.schema),
            "versions": table("schema_version"),
            "additions": table("schema_additions"),
            "jobs": table("jobs"),
            "runs": table("runs"),
            "pruned": table("pruned"),
            "pauses": table("pauses"),
            "requests": table("requests"),
            "registry": table("registry"),
            "definitions": table("definitions"),
            "requests_due": sql.Identifier(self.prefix + "requests_due"),
            # The name PostgreSQL gave migration 1's check of the status column.
            "runs_status_check": sql.Identifier(self.prefix + "runs_status_check"),
            "runs_newest": sql.Identifier(self.prefix + "runs_newest"),
            "runs_recorded": sql.Identifier(self.prefix + "runs_recorded"),
            "runs_running": sql.Identifier(self.prefix + "runs_running"),
            "runs_slot": sql.Identifier(self.prefix + "runs_slot"),
            "claim_fn": table("claim"),
            "claim_answer": table("claim_answer"),
            # Prefix of the claim function's advisory lock keys (one per job).
            "claim_lock": sql.Literal(f"anarchon claims {self.schema}.{self.prefix} "),
            # Key of the advisory lock under which the registry's tables are created.
            "registry_lock": sql.Literal(f"anarchon registry {self.schema}.{self.prefix}"),
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
        self._values = names.identifiers()
        # In claim_function's body the parts' parameters are the function's arguments too.
        in_function = dict(self._values)
        for part in PARTS:
            text = _without_comments(RAW[part])
            self._values[part] = sql.SQL(text).format(**self._values)
            in_function[part] = sql.SQL(as_variables(text)).format(**in_function)
        for name in IN_FUNCTION:
            body = as_variables(_without_comments(RAW[name]))
            self._values["fn_" + name] = sql.SQL(body).format(**in_function)
        function = _without_comments(RAW["claim_function"])
        self._values["claim_function"] = sql.SQL(function).format(**self._values)
        # Rendered once: composing a statement again for every call costs more than sending it.
        self._rendered: dict[str, bytes] = {
            name: self.compose(text).as_bytes(None)
            for name, text in RAW.items()
            if name not in PARTS and name not in _FUNCTION_ONLY
        }
        for name, versions in _ADDITIONS.items():
            text = RAW[versions].replace("{versions}", "{additions}")
            self._rendered[name] = self.compose(text).as_bytes(None)
        self._positional = {text: positional(text) for text in self._rendered.values()}

    def __getitem__(self, name: str) -> bytes:
        """The statement ``name``, ready to send."""
        return self._rendered[name]

    def positional(self, query: bytes) -> tuple[bytes, tuple[str, ...]]:
        """``query`` (a statement of this object, or any) as :func:`positional` writes it."""
        found = self._positional.get(query)
        return found if found is not None else positional(query)

    def compose(self, text: str) -> sql.Composed:
        """``text`` (SQL in the style of ``queries.sql``) with its names and parts filled in."""
        from psycopg import sql

        return sql.SQL(text).format(**self._values)

    def script(self, name: str) -> list[bytes]:
        """The statements of the section ``name`` (a migration), one by one."""
        return [
            self.compose(statement.strip()).as_bytes(None)
            for statement in _statements(RAW[name])
            if statement.strip()
        ]


def _statements(text: str) -> list[str]:
    """``text`` split at each semicolon outside a function body (``$fn$ ... $fn$``)."""
    statements = [""]
    for n, piece in enumerate(text.split("$fn$")):
        if n % 2:
            statements[-1] += "$fn$" + piece + "$fn$"
            continue
        first, *rest = piece.split(";")
        statements[-1] += first
        statements += rest
    return statements


def as_variables(text: str) -> str:
    """``text`` (a statement of ``queries.sql``) for a PL/pgSQL body: each ``%(name)s``
    written as the variable ``a_name``, and ``%%`` as ``%``."""
    return _PLACEHOLDER.sub(
        lambda m: b"%" if m.group(1) is None else b"a_" + m.group(1), text.encode()
    ).decode()


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


def positional(query: bytes) -> tuple[bytes, tuple[str, ...]]:
    """``query`` with its ``%(name)s`` parameters written ``$1``, ``$2`` ... (one number per
    name) and ``%%`` as ``%``, and the names in the order of their numbers.

    Statements are sent in this form (psycopg's raw cursor) so the driver does not parse them
    again at every call: it caches what it parsed only for statements under 4 kB, and the
    claim (8.6 kB) and finish (4.9 kB) statements took 0.11 and 0.14 ms of CPU each to parse.
    """
    names: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        if match.group(1) is None:
            return b"%"
        name = match.group(1).decode()
        if name not in names:
            names.append(name)
        return b"$%d" % (names.index(name) + 1)

    return _PLACEHOLDER.sub(number, query), tuple(names)
