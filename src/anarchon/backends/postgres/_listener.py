"""LISTEN on a dedicated connection: the stream of changes the backend's
:class:`~anarchon.kit.feed.ChangeFeed` reads to wake backups, and of the claim notices the claim
statement sends on the same channel (JSON lists, told apart by their first character).

The connection is the stream's own (never one of the pool's, never the caller's): it is opened
in the first call (and again in the first call after a failure), kept open, and checked with a
round trip whenever it has been quiet for a while (a network that drops packets silently would
otherwise leave it waiting forever). Notifications sent while it was away are lost, which is
harmless: backups still check a watched run when its lease expires. The feed logs a loss once
(``notifications_lost``) and the LISTEN that ends it once (``notifications_resumed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from anarchon.backend import ChangeEvent, ClaimNotice
from anarchon.errors import BackendUnavailable
from anarchon.kit import Action, log_fields
from anarchon.kit.feed import decode_notices

from ._errors import first_line

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Notify

__all__ = ["Listener"]

logger = logging.getLogger("anarchon.backends.postgres")

# A quiet connection is checked this often; the check must answer within PING_TIMEOUT_S.
PING_EVERY_S: Final = 10.0
PING_TIMEOUT_S: Final = 5.0


class Listener:
    """``LISTEN <channel>`` as a stream of changes: :meth:`next_changes` for the change feed."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[AsyncConnection[Any]]],
        channel: str,
        where: str,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._where = where
        self._conn: AsyncConnection[Any] | None = None

    async def next_changes(self) -> list[ChangeEvent | ClaimNotice]:
        """Connect and LISTEN if not listening (then only the notifications that came with the
        LISTEN's answer, usually none), else wait for the next notifications (at most
        :data:`PING_EVERY_S`, then check the connection). Raises
        :class:`~anarchon.errors.BackendUnavailable` when the connection fails, after closing
        it."""
        try:
            if self._conn is None:
                return await self._listen()
            return await self._next(self._conn)
        except BaseException as exc:
            await self._close()
            if isinstance(exc, Exception):
                raise BackendUnavailable(
                    f"PostgreSQL {self._where}: LISTEN connection failed ({first_line(exc)})"
                ) from exc
            raise

    async def _listen(self) -> list[ChangeEvent | ClaimNotice]:
        from psycopg import sql

        self._conn = conn = await self._connect()
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        logger.debug(
            "listening on %s at %s",
            self._channel,
            self._where,
            extra=log_fields(Action.LISTEN, channel=self._channel),
        )
        return await self._kept(conn)

    async def _next(self, conn: AsyncConnection[Any]) -> list[ChangeEvent | ClaimNotice]:
        # Wait for the socket ourselves: psycopg's notifies(timeout=...) polls the loop every
        # 0.1 s while it waits (ten wake-ups a second of an idle instance, each an fd
        # register/unregister), whereas readiness wakes it once, when a notification comes.
        if await _readable(conn.fileno(), PING_EVERY_S):
            notes = [note async for note in conn.notifies(timeout=PING_EVERY_S, stop_after=1)]
        else:  # quiet for a while: make sure the connection still works
            await asyncio.wait_for(conn.execute("SELECT 1"), PING_TIMEOUT_S)
            return await self._kept(conn)
        return _decode(notes)

    async def _kept(self, conn: AsyncConnection[Any]) -> list[ChangeEvent | ClaimNotice]:
        """The notifications that came with a statement's answer, which psycopg keeps aside
        (the socket has nothing more to read for them)."""
        return _decode([note async for note in conn.notifies(timeout=0)])

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def _decode(notes: list[Notify]) -> list[ChangeEvent | ClaimNotice]:
    out: list[ChangeEvent | ClaimNotice] = []
    for note in notes:
        if note.payload.startswith("["):  # claim notices (a job name never starts so)
            out.extend(decode_notices(note.payload, logger))
        else:
            out.append(_event(note))
    return out


def _event(note: Notify) -> ChangeEvent:
    # "<job> <slot_key> released|finished"; neither name contains a space.
    job, _, rest = note.payload.partition(" ")
    slot_key, _, kind = rest.partition(" ")
    return ChangeEvent(job, slot_key, kind != "finished")


async def _readable(fd: int, timeout_s: float) -> bool:
    """Wait until ``fd`` has data to read (True) or ``timeout_s`` passed (False)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()

    loop.add_reader(fd, _settle, ready, True)
    timer = loop.call_later(timeout_s, _settle, ready, False)
    try:
        return bool(await ready)
    finally:
        timer.cancel()
        loop.remove_reader(fd)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
