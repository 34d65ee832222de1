"""The context a handler receives: which run it is, its fencing token, and lease news."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from datetime import datetime
from typing import Any

from ._models import Trigger
from .errors import LeaseLost

__all__ = ["RunContext"]


class _RunLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds the run's job, slot, run id and attempt to every record."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


class RunContext:
    """Passed to every handler: the run's identity and its lease.

    ``fence`` rises with every claim and takeover of the job. Pass it along with your writes and
    refuse a write whose fence is lower than the last one you accepted (for example
    ``UPDATE ... SET fence = :fence WHERE fence <= :fence``), so a stale runner that comes back
    after a takeover cannot overwrite the new runner's work.
    """

    __slots__ = (
        "_logger",
        "_lost",
        "_lost_async",
        "_lost_reason",
        "attempt",
        "fence",
        "instance",
        "job",
        "run_id",
        "slot",
        "trigger",
    )

    def __init__(
        self,
        *,
        job: str,
        slot: datetime | None,
        run_id: str,
        attempt: int,
        fence: int | None,
        trigger: Trigger,
        instance: str,
    ) -> None:
        self.job = job
        self.slot = slot
        """The scheduled time (aware, UTC); None for a manual run."""
        self.run_id = run_id
        self.attempt = attempt
        self.fence = fence
        self.trigger = trigger
        self.instance = instance
        # Made on first use: thousands of runs start at once when many jobs share a slot.
        self._logger: logging.LoggerAdapter | None = None  # type: ignore[type-arg]
        self._lost = False
        self._lost_async: asyncio.Event | None = None
        self._lost_reason: str | None = None

    @property
    def logger(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """A logger (``anarchon.job.<job>``) whose records carry the run's job, slot, run id,
        attempt and fence."""
        if self._logger is None:
            self._logger = _RunLogger(
                logging.getLogger(f"anarchon.job.{self.job}"),
                {
                    "job": self.job,
                    "slot": self.slot.isoformat() if self.slot else None,
                    "run_id": self.run_id,
                    "attempt": self.attempt,
                    "fence": self.fence,
                },
            )
        return self._logger

    @property
    def lease_lost(self) -> bool:
        """True once this run's lease is gone (taken over, expired, handed over): stop writing.

        Safe to read from a plain handler's worker thread.
        """
        return self._lost

    def check_lease(self) -> None:
        """Raise :class:`~anarchon.errors.LeaseLost` if the lease is gone; call between steps."""
        if self._lost:
            raise LeaseLost(self._lost_reason or f"run {self.run_id} lost its lease")

    async def wait_lease_lost(self) -> None:
        """Wait until the lease is lost (async handlers)."""
        if self._lost:
            return
        if self._lost_async is None:
            self._lost_async = asyncio.Event()
        await self._lost_async.wait()

    def _mark_lost(self, reason: str) -> None:
        self._lost_reason = reason
        self._lost = True
        if self._lost_async is not None:
            self._lost_async.set()

    def __repr__(self) -> str:
        return (
            f"RunContext(job={self.job!r}, slot={self.slot}, run_id={self.run_id!r}, "
            f"attempt={self.attempt}, fence={self.fence})"
        )
