"""LISTEN on a dedicated connection and pass each release or result to the scheduler.

The connection is the listener's own (never one of the pool's, never the caller's): it is
opened here, kept open, checked with a round trip whenever it has been quiet for a while (a
network that drops packets silently would otherwise leave it waiting forever), and reopened
with backoff when it fails. Notifications sent while it was away are lost, which is harmless:
backups still check a watched run when its lease expires. A loss is logged once
(``notifications_lost``), and the LISTEN that ends it once (``notifications_resumed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from anarchon.kit import backoff

from ._errors import first_line

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Listener"]

logger = logging.getLogger("anarchon.backends.postgres")

# A quiet connection is checked this often; the check must answer within PING_TIMEOUT_S.
PING_EVERY_S: Final = 10.0
PING_TIMEOUT_S: Final = 5.0


class Listener:
    """One task that keeps ``LISTEN <channel>`` alive and calls back for each notification."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[AsyncConnection[Any]]],
        channel: str,
        where: str,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._where = where
        self._callbacks: list[Callable[[str, str, bool], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @property
    def listening(self) -> bool:
        """True while LISTEN is in effect on a live connection."""
        return self._listening.is_set()

    def add(self, on_change: Callable[[str, str, bool], None]) -> None:
        """Call ``on_change(job, slot_key, released)`` for every notification from now on."""
        self._callbacks.append(on_change)

    async def start(self, wait_s: float) -> None:
        """Start listening; wait up to ``wait_s`` for the first LISTEN, then go on regardless."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), wait_s)

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listening.clear()

    async def _run(self) -> None:
        from psycopg import sql

        delays = backoff(first=0.2, cap=5.0)
        lost = False
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._listening.set()
                    delays = backoff(first=0.2, cap=5.0)
                    if lost:
                        lost = False
                        logger.warning(
                            "PostgreSQL %s: listening on %s again",
                            self._where,
                            self._channel,
                            extra={"action": "notifications_resumed"},
                        )
                    else:
                        logger.debug("listening on %s at %s", self._channel, self._where)
                    await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._listening.clear()
                delay = next(delays)
                if not lost:
                    lost = True
                    logger.warning(
                        "PostgreSQL %s: LISTEN connection failed (%s); reconnecting with "
                        "backoff, backups poll at lease expiry meanwhile",
                        self._where,
                        first_line(exc),
                        extra={"action": "notifications_lost"},
                    )
                else:
                    logger.debug("LISTEN again in %.1f s: %s", delay, first_line(exc))
                await asyncio.sleep(delay)

    async def _serve(self, conn: AsyncConnection[Any]) -> None:
        while True:
            async for note in conn.notifies(timeout=PING_EVERY_S):
                # "<job> <slot_key> released|finished"; neither name contains a space.
                job, _, rest = note.payload.partition(" ")
                slot_key, _, kind = rest.partition(" ")
                for callback in self._callbacks:
                    try:
                        callback(job, slot_key, kind != "finished")
                    except Exception:
                        logger.exception(
                            "notification callback failed", extra={"action": "listen_callback"}
                        )
            await asyncio.wait_for(conn.execute("SELECT 1"), PING_TIMEOUT_S)
