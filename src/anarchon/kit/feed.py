"""One change feed for every lease backend: the listeners of :meth:`LeaseBackend.subscribe
<anarchon.backend.LeaseBackend.subscribe>`, a dispatch that isolates a failing listener, and a
supervised loop that polls (or reconnects to) the backend's stream of changes.

A backend supplies only its stream: a coroutine that waits for the next changes and returns them
as :class:`~anarchon.backend.ChangeEvent` objects (or raises while the backend is out of reach).
The loop logs once per outage, on the logger ``anarchon.backends.<name>``, with the actions
``notifications_lost`` and ``notifications_resumed``: losing notifications is harmless (backups
still check at lease expiry), but an operator should see it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..backend import ChangeEvent, ChangeListener
from ..logs import Action
from .calls import consume

__all__ = ["ChangeFeed"]


class ChangeFeed:
    """The listeners of one backend and the task that feeds them.

    :param backend: the backend's short name, for the logger ``anarchon.backends.<backend>``.
    """

    def __init__(self, backend: str) -> None:
        self.logger = logging.getLogger(f"anarchon.backends.{backend}")
        self._listeners: list[ChangeListener] = []
        self._task: asyncio.Task[None] | None = None
        self._lost = False

    @property
    def listeners(self) -> Sequence[ChangeListener]:
        """The listeners, in the order they subscribed."""
        return tuple(self._listeners)

    @property
    def running(self) -> bool:
        """True while the supervised loop runs (see :meth:`start`)."""
        return self._task is not None

    def add(self, listener: ChangeListener) -> None:
        """Subscribe ``listener``: it is called as ``listener(job, slot_key, released)``."""
        self._listeners.append(listener)

    def dispatch(self, event: ChangeEvent) -> None:
        """Call every listener with ``event``. A listener that raises is logged and the others
        are still called: one broken listener never stops the feed."""
        for listener in tuple(self._listeners):
            try:
                listener(event.job, event.slot_key, event.released)
            except Exception:
                self.logger.exception(
                    "a change listener failed on %s/%s; the others were still told",
                    event.job,
                    event.slot_key,
                    extra={"action": Action.LISTENER_FAILED, "job": event.job},
                )

    def start(
        self,
        next_changes: Callable[[], Awaitable[Sequence[ChangeEvent]]],
        *,
        retry_s: float,
        errors: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        """Start the supervised loop (once): await ``next_changes()`` again and again and
        dispatch what it returns. One of ``errors`` marks an outage: it is logged once
        (``notifications_lost``), the call is tried again after ``retry_s`` seconds, and the
        first success after it is logged (``notifications_resumed``)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run(next_changes, retry_s, errors))
            self._task.add_done_callback(consume)

    async def stop(self) -> None:
        """Stop the loop and wait for it; the listeners stay."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def lost(self, error: BaseException) -> None:
        """Record that notifications stopped (logged once per outage)."""
        if not self._lost:
            self._lost = True
            self.logger.warning(
                "change notifications lost: %s; backups check at lease expiry until they resume",
                error,
                extra={"action": Action.NOTIFICATIONS_LOST},
            )

    def resumed(self) -> None:
        """Record that notifications flow again (logged once, after :meth:`lost`)."""
        if self._lost:
            self._lost = False
            self.logger.info(
                "change notifications resumed", extra={"action": Action.NOTIFICATIONS_RESUMED}
            )

    async def _run(
        self,
        next_changes: Callable[[], Awaitable[Sequence[ChangeEvent]]],
        retry_s: float,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        while True:
            try:
                events = await next_changes()
            except errors as exc:
                self.lost(exc)
                await asyncio.sleep(retry_s)
                continue
            self.resumed()
            for event in events:
                self.dispatch(event)
