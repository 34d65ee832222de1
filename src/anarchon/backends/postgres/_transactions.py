"""The PostgreSQL backend's transactions: one, or many sent in one round trip.

A transaction is READ COMMITTED: statements to run first (a lock), then the query whose rows
are its answer, then COMMIT; a statement may follow once it committed (the notices), whose
failure fails nothing committed. On an autocommit connection (the backend's own pool) it is
sent in pipeline mode, BEGIN to COMMIT in one round trip, and so is a batch of them
(:meth:`Transactions.each`; several items to a transaction: :meth:`Transactions.groups`). A
statement that fails makes the server skip the rest of the round trip: the items committed
before it keep their rows and the others are sent again one to a transaction, so one failing
item fails alone. A transient error (connection lost, deadlock) fails the call, which the
caller retries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from anarchon.errors import BackendError, BackendUnavailable

from ._connection import Connections
from ._errors import translate
from ._statements import Rows, Statement, atomic

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Group", "Transactions", "Work"]

# One item of work: statements to run first, then the query whose rows are the item's answer,
# all in one transaction.
Work = tuple[Sequence[Statement], bytes, dict[str, Any]]
# Items of work sharing one transaction: statements to run first, then one query run once per
# set of parameters; the answer is the rows of each run.
Group = tuple[Sequence[Statement], bytes, Sequence[dict[str, Any]]]


class Transactions(Connections):
    """The backend's connections (:class:`._connection.Connections`), running transactions."""

    async def transaction(
        self,
        conn: AsyncConnection[Any],
        before: Sequence[Statement],
        query: bytes,
        params: dict[str, Any],
        after: Statement | None = None,
    ) -> Rows:
        """Run ``before`` then ``query`` in one READ COMMITTED transaction; return the rows of
        ``query``. ``after`` runs once it committed (its failure fails nothing committed).

        On an autocommit connection (the backend's own pool) the whole transaction, BEGIN to
        COMMIT, and ``after`` are sent in pipeline mode: one round trip to the server instead
        of one per statement.
        """
        try:
            [rows] = await self._transactions(conn, [(before, query, params)], after)
        except _Aborted as aborted:
            [committed] = aborted.done
            if committed is not None:
                return cast("Rows", committed)  # only ``after`` failed
            raise aborted.error from aborted
        if isinstance(rows, BaseException):
            raise rows
        return rows

    async def each(
        self, work: Sequence[Work], after: Statement | None = None
    ) -> list[Rows | BackendError]:
        """Each item of ``work`` as its own transaction, all in one call and one round trip;
        the rows of each item's query, or the permanent error of that item. ``after`` runs
        after each item's COMMIT.

        After a failed item, the items it did not commit are sent again one at a time, each on
        its own. A transient error (connection lost, deadlock) fails the call: the caller
        retries the whole batch, which is safe since every item is idempotent per token.
        """
        try:
            return await self.call(lambda conn: self._transactions(conn, work, after))
        except _Aborted as aborted:
            if len(work) == 1:
                return [aborted.error]
            out: list[Rows | BackendError] = []
            for item, done in zip(work, cast("list[Rows | None]", aborted.done), strict=True):
                if done is not None:
                    out.append(done)
                    continue
                try:
                    rows = await self.call(
                        lambda conn, item=item: self._one_transaction(conn, item, after)  # type: ignore[misc]
                    )
                except _Aborted as again:
                    rows = again.error
                out.append(rows)
            return out

    async def groups(
        self, groups: Sequence[Group], after: Statement | None = None
    ) -> list[Rows | BackendError]:
        """Each group of ``groups`` as one transaction, all in one call and one round trip
        (pipeline mode); one answer per item (each run of a group's query), in order: its rows
        or its permanent error. ``after`` runs after each group's COMMIT.

        Fewer transactions cost fewer commits (each waits for the server's log flush) when
        thousands of items come at once. A group that fails is sent again item by item, each
        its own transaction (:meth:`each`), so one failing item fails alone. A transient
        error fails the call, as in :meth:`each`.
        """
        done: list[list[Rows] | None]
        try:
            done = await self.call(lambda conn: self._grouped(conn, groups, after))
        except _Aborted as aborted:
            done = cast("list[list[Rows] | None]", aborted.done)
        out: list[Rows | BackendError] = []
        for (before, query, runs), rows in zip(groups, done, strict=True):
            if rows is None:
                out += await self.each([(before, query, params) for params in runs], after)
            else:
                out += rows
        return out

    async def _grouped(
        self, conn: AsyncConnection[Any], groups: Sequence[Group], after: Statement | None
    ) -> list[list[Rows] | None]:
        """Run each group as one READ COMMITTED transaction (then ``after``), all in one round
        trip: the rows of each run of each group. Like :meth:`_transactions`, a failure raises
        :class:`_Aborted` holding the groups committed before it (None for the others); on a
        connection without pipeline mode nothing is sent and every group is None."""
        from psycopg import AsyncPipeline
        from psycopg.pq import ExecStatus

        if not conn.autocommit or not AsyncPipeline.is_supported():
            return [None] * len(groups)
        q = self._queries
        prepare, at_once = self.options.prepare, self.options.prepare_at_once
        cursors: list[list[Any]] = []
        try:
            async with conn.pipeline():
                for before, query, runs in groups:
                    await conn.execute(q["begin"], prepare=prepare)
                    for statement, values in before:
                        await conn.execute(statement, values, prepare=prepare)
                    group: list[Any] = []
                    for params in runs:
                        group.append(await self._run(conn, query, params, prepare=at_once))
                    await conn.execute(q["commit"], prepare=prepare)
                    cursors.append(group)
                    if after is not None:
                        await conn.execute(after[0], after[1], prepare=prepare)
        except Exception as exc:
            error = self._item_error(exc)
            done: list[list[Rows] | None] = []
            for n in range(len(groups)):
                group = cursors[n] if n < len(cursors) else []
                committed = bool(group) and all(
                    c.pgresult is not None and c.pgresult.status == ExecStatus.TUPLES_OK
                    for c in group
                )
                done.append([await c.fetchall() for c in group] if committed else None)
            await self._after_abort(conn)
            raise _Aborted(done, error) from exc
        return [[await cur.fetchall() for cur in group] for group in cursors]

    async def _transactions(
        self, conn: AsyncConnection[Any], work: Sequence[Work], after: Statement | None
    ) -> list[Rows | BackendError]:
        """Run each item of ``work`` as its own READ COMMITTED transaction, all in one round
        trip: :meth:`_grouped` with groups of one. A statement that fails makes the server
        skip the rest of the round trip: :class:`_Aborted` then carries what was committed
        before it."""
        from psycopg import AsyncPipeline

        if not conn.autocommit or not AsyncPipeline.is_supported():
            return [await self._one_transaction(conn, item, after) for item in work]
        groups = [(before, query, [params]) for before, query, params in work]
        try:
            done = await self._grouped(conn, groups, after)
        except _Aborted as aborted:
            grouped = cast("list[list[Rows] | None]", aborted.done)
            firsts: list[Rows | None] = [None if rows is None else rows[0] for rows in grouped]
            raise _Aborted(firsts, aborted.error) from aborted.__cause__
        return [rows[0] for rows in cast("list[list[Rows]]", done)]

    async def _one_transaction(
        self, conn: AsyncConnection[Any], item: Work, after: Statement | None
    ) -> Rows | BackendError:
        """One item of work without pipeline mode or prepared statements: on a connection
        psycopg keeps in transactions (a caller's), and for items sent again after a failure.
        ``after`` runs once it committed; its failure fails nothing committed."""

        before, query, params = item
        try:
            async with conn.transaction():
                await conn.execute(self._queries["read_committed"], prepare=False)
                for statement, values in before:
                    await conn.execute(statement, values, prepare=False)
                cur = await self._run(conn, query, params, prepare=False)
                rows = await cur.fetchall()
        except Exception as exc:
            return self._item_error(exc)
        if after is not None:
            with contextlib.suppress(Exception):
                async with atomic(conn):
                    await conn.execute(after[0], after[1], prepare=False)
        return rows

    def _item_error(self, exc: Exception) -> BackendError:
        """The error of one item: a permanent one is returned for that item alone; anything
        transient, or a failure that is not the driver's, is raised for the call."""
        error = exc if isinstance(exc, BackendError) else translate(exc, self.where)
        if error is None or isinstance(error, BackendUnavailable):
            raise exc
        return error

    async def _after_abort(self, conn: AsyncConnection[Any]) -> None:
        """After a pipeline that failed part-way: the server skipped statements psycopg may
        have counted as prepared, and the connection may be inside a failed transaction.
        Close a connection of the backend's pool (the pool opens a fresh one); on a
        connection the caller passed in, roll back and forget every prepared statement."""
        from psycopg import AsyncConnection

        if conn.broken:
            return
        if not isinstance(self._given, AsyncConnection):
            await conn.close()
            return
        q = self._queries
        with contextlib.suppress(Exception):
            await conn.execute(q["rollback"], prepare=False)
        with contextlib.suppress(Exception):
            await conn.execute(q["deallocate_all"], prepare=False)


class _Aborted(Exception):
    """A pipeline of transactions failed at ``error``; ``done`` holds the rows of the items
    committed before it (None for the others)."""

    def __init__(
        self, done: list[Rows | None] | list[list[Rows] | None], error: BackendError
    ) -> None:
        super().__init__(str(error))
        self.done = done
        self.error = error
