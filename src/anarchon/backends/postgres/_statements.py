"""How the PostgreSQL backend sends one statement on a connection it holds, and reads its rows.

A statement goes out with positional parameters (:func:`._queries.positional`; psycopg does
not parse them), prepared on the server as ``Options.prepare`` or ``Options.prepare_at_once``
says, on a raw cursor whose rows are dicts named by :class:`_NamedRows`, which reads a
statement's column names once. Which connection, within what time, is :mod:`._connection`'s;
transactions are :mod:`._transactions`'.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor, AsyncRawCursor
    from psycopg.rows import AsyncRowFactory, RowMaker

    from ._options import Options
    from ._queries import Queries

__all__ = ["Rows", "Statement", "Statements", "atomic"]

# A statement and its parameters; the rows of a statement.
Statement = tuple[bytes, dict[str, Any] | None]
Rows = list[dict[str, Any]]


class Statements:
    """One statement at a time, on a connection the caller holds."""

    def __init__(self, options: Options, queries: Queries) -> None:
        from psycopg import AsyncRawCursor

        # Looked up once: an import statement in a function costs a call into importlib every
        # time it runs, once per statement on the claim path.
        self._cursor_class = AsyncRawCursor
        self.options = options
        self._queries = queries
        # Each statement's column names, read from its first result (see _row_factory).
        self._row_factories: dict[bytes, AsyncRowFactory[dict[str, Any]]] = {}

    async def select(
        self, conn: AsyncConnection[Any], query: bytes, params: dict[str, Any] | None = None
    ) -> Rows:
        """The rows of one statement on ``conn``; its isolation level changes nothing."""
        async with atomic(conn):
            cur = await self._run(
                conn, query, params, prepare=self.options.prepare_at_once, binary=False
            )
            return await cur.fetchall()

    async def statement(
        self, conn: AsyncConnection[Any], query: bytes, params: dict[str, Any]
    ) -> Rows:
        """The rows of one statement sent alone, on an autocommit connection a transaction of
        its own: one round trip, without pipeline mode."""
        cur = await self._run(conn, query, params, prepare=self.options.prepare_at_once)
        return await cur.fetchall()

    async def after_commit(self, conn: AsyncConnection[Any], after: Statement) -> None:
        """Run ``after`` once a statement committed; its failure fails nothing committed."""
        with contextlib.suppress(Exception):
            await self._run(conn, after[0], after[1], prepare=self.options.prepare)

    async def _run(
        self,
        conn: AsyncConnection[Any],
        query: bytes,
        params: dict[str, Any] | None,
        *,
        prepare: bool | None,
        binary: bool = True,
    ) -> AsyncRawCursor[dict[str, Any]]:
        """Execute ``query`` with ``params`` on a new cursor whose rows are dicts: sent with
        positional parameters (:func:`._queries.positional`), which psycopg does not parse."""
        text, names = self._queries.positional(query)
        values = [params[name] for name in names] if params is not None and names else None
        cur = self._cursor_class(conn, row_factory=self._row_factory(text))
        await cur.execute(text, values, binary=binary, prepare=prepare)
        return cur

    def _row_factory(self, text: bytes) -> AsyncRowFactory[dict[str, Any]]:
        """psycopg's ``dict_row`` for the statement ``text``, reading the column names of
        its result once rather than at every execution (a claim's twenty names took a tenth
        of the driver's time for the statement)."""
        factory = self._row_factories.get(text)
        if factory is None:
            factory = self._row_factories[text] = _NamedRows()
        return factory


class _NamedRows:
    """A row factory making dicts, like psycopg's ``dict_row``, for one statement: the column
    names are read from the first result that has rows and kept while results have as many
    columns (a statement's columns do not change; a result without columns is ``dict_row``'s)."""

    __slots__ = ("_names",)

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()

    def __call__(self, cursor: AsyncCursor[Any]) -> RowMaker[dict[str, Any]]:
        from psycopg.rows import dict_row

        result = cursor.pgresult
        if result is None or not result.nfields or result.nfields != len(self._names):
            maker = dict_row(cursor)
            if result is not None and result.nfields:
                encoding = cursor.connection.info.encoding
                self._names = tuple(
                    (result.fname(n) or b"").decode(encoding) for n in range(result.nfields)
                )
            return maker
        names = self._names
        return lambda values: dict(zip(names, values, strict=True))


@contextlib.asynccontextmanager
async def atomic(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A transaction for one statement on a connection that is not in autocommit mode (a
    caller's); none on an autocommit connection."""
    if conn.autocommit:
        yield
    else:
        async with conn.transaction():
            yield
