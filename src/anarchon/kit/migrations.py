"""One migration runner for SQL backends: ordered, numbered steps and a schema-version table.

A backend lists its steps (:class:`Step`, usually the named queries ``migration_<n>`` of its
``queries.sql``: :func:`numbered_steps`) and says what only it knows, as a :class:`Store`: the
write transaction that holds its migration lock (``BEGIN IMMEDIATE`` on SQLite, an advisory
lock on PostgreSQL), how it reads and writes its version rows, and how it executes a step.
:func:`run` does the rest, the same for every backend: inside that transaction it runs every
step above the stored version, in order, and records each; once committed, it logs the
version reached (action ``migrated``). Running it again does nothing (idempotent); two processes
starting together serialise on the lock, and the second finds the work done. A store migrated
by a newer anarchon is refused with a message that says to upgrade. :func:`migrate` is the same
runner on a blocking DB-API connection (``sqlite3``), given the version table's statements.

An *additive* step (:attr:`Step.additive`: it only adds what older code ignores, such as a
nullable column none of its statements names) is recorded apart, in a table of its own
(:class:`Additions`, :attr:`Versions.added`), when the backend keeps one: older anarchons check
the version table alone, so they still open a store that only gained additions, and a rolling
deploy keeps its old instances working. Only a store whose version table is newer is refused.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from ..errors import BackendError
from ..logs import Action, log_fields

__all__ = [
    "LOGGER",
    "Additions",
    "Cursor",
    "Step",
    "Store",
    "Versions",
    "check_steps",
    "migrate",
    "numbered_steps",
    "pending",
    "run",
]

T = TypeVar("T")

LOGGER: Final = logging.getLogger("anarchon.kit.migrations")
"""Where :func:`run` and :func:`migrate` log unless given the backend's logger
(``anarchon.backends.<name>``, as anarchon's backends give)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One migration: the schema version it brings the store to, a name, its SQL."""

    version: int
    """The schema version the step brings the store to: steps are numbered 1, 2, 3 ... in order."""
    name: str
    """The step's name: the named query ``migration_<n>`` for :func:`numbered_steps`."""
    sql: str
    """The step's statements, separated by ``;``."""
    additive: bool = False
    """Whether older code can ignore what the step makes (a nullable column it never names, a
    table it never reads): then :func:`run` records it in the additions' table, which older
    versions do not check, instead of the version table."""

    def statements(self) -> list[str]:
        """The step's statements, split on ``;`` (steps hold no ``;`` inside a statement)."""
        return [part.strip() for part in self.sql.split(";") if part.strip()]


@dataclass(frozen=True, slots=True)
class Additions:
    """The statements that keep the versions of additive steps (:attr:`Step.additive`), in a
    table of their own: ``create_table`` creates it if needed, ``read_version`` answers one row
    whose first column is the highest version recorded (NULL or 0 for none), ``write_version``
    takes a version as its one parameter."""

    create_table: str
    """Creates the additions' table if it is missing."""
    read_version: str
    """Answers one row whose first column is the highest version recorded (NULL or 0 for none)."""
    write_version: str
    """Records a version, given as its one parameter."""


@dataclass(frozen=True, slots=True)
class Versions:
    """What a store's version rows hold (:meth:`Store.versions`)."""

    stored: int
    """The highest version in the version table (0 for a new store)."""
    added: int | None = None
    """The highest version recorded in the additions' table (0 for none); None when the store
    keeps no such table: its additive steps are then recorded in the version table."""


class Store(Protocol):
    """What :func:`run` needs of a backend: its lock, its version rows, a step's execution.

    Every method but :meth:`transaction` is called inside the block :meth:`transaction` opens.
    """

    def transaction(self) -> AbstractAsyncContextManager[object]:
        """The write transaction the migrations run in, holding the lock that serialises the
        migrations of one store (another process starting at once waits there, then finds the
        work done): committed when the block ends, rolled back when it raises."""
        ...

    async def versions(self) -> Versions:
        """Create the version tables if they are missing, and say what they hold."""
        ...

    async def execute(self, step: Step) -> None:
        """Run the step's statements (:meth:`Step.statements`, or the backend's own rendering
        of the step it names)."""
        ...

    async def record(self, version: int, *, addition: bool) -> None:
        """Record that the store reached ``version``: in the additions' table if
        ``addition``, else in the version table."""
        ...


class Cursor(Protocol):
    """What :func:`migrate` needs of a DB-API connection or cursor."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any:
        """Run one statement."""


def check_steps(steps: Sequence[Step]) -> None:
    """Raise ValueError unless the steps are numbered 1, 2, 3 ... in order."""
    numbers = [step.version for step in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise ValueError(f"migration steps must be numbered 1, 2, 3 ... in order, not {numbers}")


def numbered_steps(
    queries: Mapping[str, str], last: int, *, additive: Collection[int] = ()
) -> list[Step]:
    """Steps 1 to ``last``: the named queries ``migration_1`` ... ``migration_<last>`` of a
    ``queries.sql`` (:func:`anarchon.kit.sql.load_queries`); those numbered in ``additive``
    are additive (:attr:`Step.additive`)."""
    missing = [f"migration_{n}" for n in range(1, last + 1) if f"migration_{n}" not in queries]
    if missing:
        raise ValueError(f"no named queries {missing} for migration steps 1 to {last}")
    return [
        Step(n, f"migration_{n}", queries[f"migration_{n}"], additive=n in additive)
        for n in range(1, last + 1)
    ]


def pending(steps: Sequence[Step], stored: int, *, where: str, added: int = 0) -> list[Step]:
    """The steps to run on a store at version ``stored`` whose additive steps reached
    ``added``; a store whose ``stored`` version is newer than every step is refused with
    :class:`~anarchon.errors.BackendError` (``where`` names it). Additions newer than every
    step are not: this code ignores them, as they were made to be."""
    check_steps(steps)
    if stored > len(steps):
        raise BackendError(
            f"{where}: database schema version {stored}, newer than this anarchon "
            f"understands ({len(steps)}); upgrade anarchon"
        )
    return list(steps[max(stored, added) :])


async def run(
    store: Store, steps: Sequence[Step], *, where: str, logger: logging.Logger = LOGGER
) -> list[Step]:
    """Bring ``store`` to the last of ``steps``; return the steps that ran.

    In one :meth:`Store.transaction`: the versions are read, and every step above them runs in
    order, each recorded as it ends (an additive one in the additions' table, when the store
    keeps one). Once the transaction is committed, one line at INFO on ``logger`` (action
    ``migrated``; pass the backend's, ``anarchon.backends.<name>``) says from which version to
    which the store went (from 0: a new store). ``where`` names the store in that line and in
    the refusal of a newer store.
    """
    check_steps(steps)
    async with store.transaction():
        found = await store.versions()
        todo = pending(steps, found.stored, where=where, added=found.added or 0)
        for step in todo:
            await store.execute(step)
            await store.record(step.version, addition=step.additive and found.added is not None)
    if todo:
        logger.info(
            "migrated %s from schema version %d to %d",
            where,
            todo[0].version - 1,
            todo[-1].version,
            extra=log_fields(Action.MIGRATED),
        )
    return todo


def migrate(
    conn: Cursor,
    steps: Sequence[Step],
    *,
    create_table: str,
    read_version: str,
    write_version: str,
    where: str,
    additions: Additions | None = None,
    transaction: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    logger: logging.Logger = LOGGER,
) -> list[Step]:
    """:func:`run` on a blocking DB-API connection ``conn``; return the steps that ran.

    ``create_table`` creates the version table if needed, ``read_version`` answers one row
    whose first column is the stored version (NULL or 0 for a new store), ``write_version``
    takes the new version as its one parameter. ``additions``: where additive steps are
    recorded; without it they are recorded in the version table like the others.
    ``transaction`` opens the write transaction that holds the migration lock (SQLite:
    ``BEGIN IMMEDIATE``); by default it opens none: call :func:`migrate` inside the backend's
    own. ``where`` and ``logger``: as for :func:`run`.
    """
    store = _Statements(conn, create_table, read_version, write_version, additions, transaction)
    return _at_once(run(store, steps, where=where, logger=logger))


@dataclass(frozen=True, slots=True)
class _Statements:
    """The :class:`Store` of :func:`migrate`: statements on a blocking connection. Its methods
    block instead of waiting, so :func:`run` on it ends without an event loop."""

    conn: Cursor
    create_table: str
    read_version: str
    write_version: str
    additions: Additions | None
    begin: Callable[[], AbstractContextManager[object]]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.begin():
            yield

    async def versions(self) -> Versions:
        self.conn.execute(self.create_table)
        stored = _version(self.conn, self.read_version)
        if self.additions is None:
            return Versions(stored)
        self.conn.execute(self.additions.create_table)
        return Versions(stored, _version(self.conn, self.additions.read_version))

    async def execute(self, step: Step) -> None:
        for statement in step.statements():
            self.conn.execute(statement)

    async def record(self, version: int, *, addition: bool) -> None:
        query = self.write_version
        if addition and self.additions is not None:
            query = self.additions.write_version
        self.conn.execute(query, (version,))


def _at_once(coro: Coroutine[Any, Any, T]) -> T:
    """The result of ``coro``, which never suspends (its store blocks instead of waiting)."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("a blocking migration store waited for an event loop")


def _version(conn: Cursor, query: str) -> int:
    """The version ``query`` answers (0 for none)."""
    found = conn.execute(query).fetchone()
    return int(found[0] or 0) if found else 0
