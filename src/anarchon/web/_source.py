"""The backend the dashboard reads: a running scheduler's, or one of the dashboard's own, which
it starts (``start_reader``: it creates nothing) on its first request and stops when the
application shuts down.
"""

from __future__ import annotations

import asyncio

from .._redact import redact_url
from .._scheduler import Scheduler
from ..backend import Backend
from ..errors import AnarchonError

__all__ = ["Source"]


class Source:
    """The backend the dashboard reads: a scheduler's (started by it), or one of its own,
    started on the first request with ``start_reader`` and stopped by :meth:`close`."""

    def __init__(self, target: Scheduler | Backend) -> None:
        """Read ``target``: a scheduler (its backend) or a backend; TypeError for anything
        else."""
        if isinstance(target, Scheduler):
            self.scheduler: Scheduler | None = target
            self.backend = target.backend
        elif isinstance(target, Backend):
            self.scheduler = None
            self.backend = target
        else:
            raise TypeError(f"dashboard({target!r}): pass an anarchon Scheduler or Backend")
        self._started = False
        self._lock = asyncio.Lock()

    @property
    def label(self) -> str:
        """The backend, as pages name it (no secret)."""
        return redact_url(repr(self.backend))

    async def get(self) -> Backend:
        """The started backend."""
        if self.scheduler is not None:
            if not self.scheduler.running:
                raise AnarchonError("the scheduler is not running: start it before the dashboard")
            return self.backend
        async with self._lock:
            if not self._started:
                await self.backend.start_reader()
                self._started = True
        return self.backend

    async def close(self) -> None:
        """Stop the backend if the dashboard started it."""
        async with self._lock:
            if self._started:
                self._started = False
                await self.backend.stop()
