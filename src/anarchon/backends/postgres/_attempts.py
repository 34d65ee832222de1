"""Why the backend's own pool could not connect: its connection class keeps the last failure.

psycopg_pool logs each failed connection attempt and raises only its own timeout, so a call or a
start that found no connection in time could say only that. The pool's connections are made by
:class:`PoolConnection`, which notes each attempt's outcome in the :class:`ConnectAttempts` the
backend passes among the pool's connection arguments (``kwargs``): a pool timeout then says why
(a refused password, a role not permitted to log in, ``pg_hba.conf``, TLS, a server down). An
attempt the server refused for good (:func:`._errors.refusal`) is noted apart, so that a start
ends at once instead of waiting out ``timeout_ms`` for a connection that cannot come.
Imported only when the backend opens its own pool (it needs psycopg).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from psycopg import AsyncConnection

from ...kit.calls import consume, wait_unless
from ._errors import first_line, refusal

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = [
    "ATTEMPTS_ARG",
    "ConnectAttempts",
    "PoolConnection",
    "open_unless_refused",
    "quiet_while_opening",
]

#: The pool's connection argument that carries the :class:`ConnectAttempts` (never sent to libpq).
ATTEMPTS_ARG: Final = "anarchon_attempts"


class ConnectAttempts:
    """The outcome of a pool's last connection attempt."""

    __slots__ = ("failure", "refusal", "refused")

    def __init__(self) -> None:
        #: The first line of the last attempt's error; None once an attempt succeeded.
        self.failure: str | None = None
        #: The server's words and what to change when the last attempt was refused for good.
        self.refusal: str | None = None
        #: Set while :attr:`refusal` is: a start waits for it or the pool, whichever is first.
        self.refused = asyncio.Event()


class PoolConnection(AsyncConnection[Any]):
    """A connection of the backend's own pool; its :meth:`connect` notes each attempt's
    outcome in the pool's :class:`ConnectAttempts`."""

    @classmethod
    async def connect(cls, conninfo: str = "", **kwargs: Any) -> PoolConnection:
        """:meth:`psycopg.AsyncConnection.connect`, noting its outcome."""
        attempts: ConnectAttempts | None = kwargs.pop(ATTEMPTS_ARG, None)
        try:
            conn = await super().connect(conninfo, **kwargs)
        except Exception as exc:
            if attempts is not None:
                attempts.failure = first_line(exc)
                attempts.refusal = refusal(exc)
                if attempts.refusal is not None:
                    attempts.refused.set()
            raise
        if attempts is not None:
            attempts.failure = attempts.refusal = None
            attempts.refused.clear()
        return conn


async def open_unless_refused(
    pool: AsyncConnectionPool[Any], attempts: ConnectAttempts, timeout_s: float
) -> bool:
    """Open ``pool`` and wait up to ``timeout_s`` for its first connection, as
    ``pool.open(wait=True)``, unless an attempt is refused for good first: False then (the wait
    is given up, the pool is the caller's to close). True once open; the pool's error if not."""
    opening = asyncio.ensure_future(pool.open(wait=True, timeout=timeout_s))
    try:
        await wait_unless(opening, attempts.refused.wait())
    finally:
        if not opening.done():
            opening.cancel()
            # Cancelled, or ended meanwhile: its outcome is the refusal's to report (consumed
            # here if this call is cancelled while it ends: asyncio.wait does not absorb a
            # cancellation of this call, which then propagates with the opening still ending).
            opening.add_done_callback(consume)
            await asyncio.wait([opening])
    if opening.cancelled():
        return False
    opening.result()
    return True


class _QuietOpening(logging.Filter):
    """Drops psycopg_pool's ``error connecting in <pool>: <error>`` WARNING (several lines each)
    for a pool of the backend's own while its start waits for the first connection: the start
    fails with one error that gives the last attempt's reason (:class:`ConnectAttempts`), so a
    failed ``anarchon run`` is one line. Other pools, and this pool once open, log as before."""

    def __init__(self) -> None:
        super().__init__("psycopg.pool")
        self.opening: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            isinstance(args, tuple)
            and len(args) == 2
            and args[0] in self.opening
            and str(record.msg).startswith("error connecting in")
        )


_QUIET: Final = _QuietOpening()
logging.getLogger("psycopg.pool").addFilter(_QUIET)


@contextmanager
def quiet_while_opening(pool_name: str) -> Iterator[None]:
    """Leave out the pool ``pool_name``'s connection errors that psycopg_pool logs while this
    block runs (see :class:`_QuietOpening`)."""
    _QUIET.opening[pool_name] += 1
    try:
        yield
    finally:
        _QUIET.opening[pool_name] -= 1
        if _QUIET.opening[pool_name] <= 0:
            del _QUIET.opening[pool_name]
