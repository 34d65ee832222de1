"""One migration runner for SQL backends: ordered, numbered steps and a schema-version table.

A backend lists its steps (:class:`Step`, usually named queries ``migration_<n>`` from its
``queries.sql``) and gives the statements that keep the version. :func:`migrate` runs, inside
one write transaction that the backend opens (``BEGIN IMMEDIATE`` on SQLite, an advisory lock
on PostgreSQL), every step above the stored version, in order, then stores each new version.
Running it again does nothing (idempotent); two processes starting together serialise on the
transaction, and the second finds the work done. A store migrated by a newer anarchon is
refused with a message that says to upgrade.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BackendError

__all__ = ["Cursor", "Step", "check_steps", "migrate", "pending"]


@dataclass(frozen=True, slots=True)
class Step:
    """One migration: the schema version it brings the store to, a name, its SQL."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The step's statements, split on ``;`` (steps hold no ``;`` inside a statement)."""
        return [part.strip() for part in self.sql.split(";") if part.strip()]


class Cursor(Protocol):
    """What :func:`migrate` needs of a DB-API connection or cursor."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any:
        """Run one statement."""


def check_steps(steps: Sequence[Step]) -> None:
    """Raise ValueError unless the steps are numbered 1, 2, 3 ... in order."""
    numbers = [step.version for step in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise ValueError(f"migration steps must be numbered 1, 2, 3 ... in order, not {numbers}")


def pending(steps: Sequence[Step], stored: int, *, where: str) -> list[Step]:
    """The steps to run on a store at version ``stored``; a store newer than every step is
    refused with :class:`~anarchon.errors.BackendError` (``where`` names it)."""
    check_steps(steps)
    if stored > len(steps):
        raise BackendError(
            f"{where}: database schema version {stored} is newer than this anarchon "
            f"understands ({len(steps)}); upgrade anarchon"
        )
    return list(steps[stored:])


def migrate(
    conn: Cursor,
    steps: Sequence[Step],
    *,
    create_table: str,
    read_version: str,
    write_version: str,
    where: str,
) -> list[Step]:
    """Bring the store on ``conn`` to the last step; return the steps that ran.

    Call it inside the backend's write transaction. ``create_table`` creates the version table
    if needed, ``read_version`` answers one row whose first column is the stored version (NULL
    or 0 for a new store), ``write_version`` takes the new version as its one parameter.
    """
    conn.execute(create_table)
    found = conn.execute(read_version).fetchone()
    stored = int(found[0] or 0) if found else 0
    todo = pending(steps, stored, where=where)
    for step in todo:
        for statement in step.statements():
            conn.execute(statement)
        conn.execute(write_version, (step.version,))
    return todo
