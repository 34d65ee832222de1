"""Keeping the stream and the key-value buckets while the backend runs.

A stream or bucket can be lost under running instances: deleted (``nats stream rm``), or gone with
the store of a server that restarted without it. ``start()`` creates what is missing, but a running
instance would never start again, so its claims would fail (closed) and its heartbeats vanish for
good. The :class:`Guard` of each started backend (never a reader's: the ``anarchon`` commands create
nothing) looks every :data:`._timings.GUARD_EVERY_S`, and soon after a call failed for good or the
client reconnected (at most every :data:`._timings.LOOK_GAP_S`), whether the stream and each bucket
this backend has used still exist (one stream info request each), and creates what is missing again
with the settings ``start()`` gives it (:func:`._stream.recreate`,
:meth:`._buckets.Buckets.open_bucket`), each with a WARNING naming it.

**Buckets** (registry, definitions, control) are created again at once (``bucket_recreated``).
What they held is gone: records and definitions are written again by the running instances;
pauses and run requests are lost (:data:`._buckets.BUCKET_LOSS`).

**The stream** is created again only once it has been missing, as this instance sees it, for
one whole duplicate window (the stream's as last read, at least ``duplicate_window_ms``):
``stream_missing`` when it is noticed, ``stream_recreated`` when it is made. Why wait: the
window is what remembers which slots were claimed, and a new stream's is empty. A slot that an
instance claimed and ran in the lost stream must not be claimed again in the new one, by an
instance that had not claimed it yet (its claim was due later, or failed while the stream was
gone). Every claim of a slot is sent within ``jitter_ms + max_late_ms`` + the claim retry margin
of the slot (less than the window: every job is checked against it when added), and a slot whose
time came after the loss was never claimed in the lost stream. So once one window has passed
since the loss (the loss came before it was noticed), every slot the lost stream may hold is too
late for every instance's claim, and nothing it recorded can run again. Claims fail closed
meanwhile (no stream answers them): the slots of that window are not run, and history shows
nothing for them.

Where that stops, as the window itself does: an instance whose clock is off by more than the
window's skew budget (``Backend.skew_budget_ms``, warned about long before); and a stream made
by anyone else during the wait: an instance that *starts* then creates it at once (``start()``
cannot tell a lost stream from a first one), as does an operator, and a slot of the last window
before the loss may then run a second time. An instance that notices later than another waits
longer, never shorter; whichever makes it first, the others find it (``stream_found``: a
WARNING when it came back too soon to be a running instance's doing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from ...kit import Action, log_fields
from . import _stream as stream_setup
from . import _timings as timings
from ._buckets import Buckets
from ._client import ReconnectWatch
from ._connection import bounded
from ._context import Context

logger = logging.getLogger("anarchon.backends.nats")


class Guard:
    """Notices a lost stream or bucket under a running backend and creates it again."""

    def __init__(self, context: Context, buckets: Buckets, wanted: stream_setup.Wanted) -> None:
        self._connection = context.connection
        self._window = context.window
        self._buckets = buckets
        self._wanted = wanted
        # Loop time when this instance found the stream missing (None: it exists), and how long
        # it then waits before making it again (the duplicate window, in s).
        self._missing_since: float | None = None
        self._wait_s = 0.0
        self._reconnect_watch = ReconnectWatch()

    @property
    def stream_missing(self) -> bool:
        """True from the look that found the stream missing until one finds it again."""
        return self._missing_since is not None

    async def run(self) -> None:
        """Look now and then, and after failures and reconnects, until cancelled; on each tick,
        drop the old connection of a reconnect stuck closing it (:class:`._client.ReconnectWatch`).
        """
        conn = self._connection
        loop = asyncio.get_running_loop()
        marks = (conn.failures, conn.reconnects())
        last = loop.time()
        while True:
            await asyncio.sleep(timings.TICK_S)
            now = loop.time()
            if conn.nc is not conn.given:  # a client the caller passed in is left as it is
                self._reconnect_watch.check(conn.nc, now)
            if now - last < timings.LOOK_GAP_S:
                continue
            seen = (conn.failures, conn.reconnects())
            if seen == marks and not self.stream_missing and now - last < timings.GUARD_EVERY_S:
                continue
            marks, last = seen, now
            try:
                await self.look()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down, a leader being elected: the next look
                logger.debug(
                    "NATS: looking for stream %s and its buckets failed: %s",
                    conn.stream,
                    conn.scrub(str(exc) or type(exc).__name__),
                    extra=log_fields(Action.UPKEEP_FAILED, stream=conn.stream),
                )

    async def look(self) -> None:
        """One look: the stream (made again once its window has passed), then each bucket this
        backend has used (made again at once)."""
        await self._look_stream()
        conn = self._connection
        for bucket in sorted(self._buckets.seen):
            if await stream_setup.find(conn.api, f"KV_{bucket}") is None:
                await self._buckets.open_bucket(
                    bucket,
                    create=True,
                    doing=f"re-creating key-value bucket {bucket!r}",
                    bounded=_bounded,
                )

    async def _look_stream(self) -> None:
        conn = self._connection
        loop = asyncio.get_running_loop()
        info = await stream_setup.find(conn.api, conn.stream)
        if info is not None:
            if self._missing_since is not None:
                self._found(info, loop.time() - self._missing_since)
            return
        now = loop.time()
        if self._missing_since is None:
            self._missing_since = now
            self._wait_s = max(self._window.ms, self._wanted.duplicate_window_ms) / 1000
            logger.warning(
                "stream %s no longer exists (deleted, or its server lost its store): claims fail "
                "closed, and this instance creates it again in %.0f s, once one duplicate window "
                "has passed, so that no slot the lost stream recorded can be claimed again",
                conn.stream,
                self._wait_s,
                extra=log_fields(Action.STREAM_MISSING, stream=conn.stream),
            )
            return
        missing_s = now - self._missing_since
        if missing_s < self._wait_s:
            return
        # The settings start() gives a new stream, with the window and replicas it had.
        wanted = replace(
            self._wanted,
            duplicate_window_ms=round(self._wait_s * 1000),
            replicas=self._wanted.replicas or conn.replicas,
        )
        info, made = await conn.recreate_stream(wanted)
        if not made:
            self._found(info, missing_s)
            return
        self._missing_since = None
        self._window.learn(info)
        logger.warning(
            "re-created stream %s (subjects %s, duplicate window %d ms, %d messages per subject, "
            "R%d): it was lost under this running instance, which found it missing %.0f s ago "
            "and waited one duplicate window; the runs and history it held are gone",
            conn.stream,
            ", ".join((info.get("config") or {}).get("subjects") or []),
            wanted.duplicate_window_ms,
            wanted.history_size,
            stream_setup.replicas(info),
            missing_s,
            extra=log_fields(Action.STREAM_RECREATED, stream=conn.stream),
        )

    def _found(self, info: dict[str, Any], missing_s: float) -> None:
        """The stream exists again, made by someone else while this instance waited: at INFO
        when a running instance's guard may have made it (they find a loss within about
        :data:`._timings.GUARD_EVERY_S` of each other; twice that is allowed), else at WARNING: an
        instance that started, or an operator, made it before one window had passed."""
        self._missing_since = None
        self._window.learn(info)
        stream = self._connection.stream
        if missing_s >= self._wait_s - 2 * timings.GUARD_EVERY_S:
            logger.info(
                "stream %s exists again (made by another instance), %.0f s after this instance "
                "found it missing",
                stream,
                missing_s,
                extra=log_fields(Action.STREAM_FOUND, stream=stream),
            )
            return
        logger.warning(
            "stream %s exists again %.0f s after this instance found it missing, before one "
            "duplicate window (%.0f s) had passed: an instance that started, or an operator, "
            "made it, and a slot claimed just before the loss may run a second time",
            stream,
            missing_s,
            self._wait_s,
            extra=log_fields(Action.STREAM_FOUND, stream=stream),
        )


async def _bounded(aw: Awaitable[Any], doing: str) -> Any:
    """A bucket call within the registry's call timeout, translated."""
    return await bounded(aw, doing, timings.CALL_TIMEOUT_S)
