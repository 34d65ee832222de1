"""The context a handler receives: which run it is, its fencing token, and lease news."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from typing import Any, Final

from ._models import Trigger
from .errors import LeaseLost

__all__ = ["RunContext", "new_context"]


class _RunLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds the run's job, slot, run id and attempt to every record."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


@dataclass(eq=False, repr=False, slots=True, kw_only=True)
class RunContext:
    """Passed to every handler: the run's identity and its lease.

    ``attempt`` counts the takeovers of one run (a backup's attempt after a crash is 2);
    ``retry`` counts the runs of a slot after its handler failed (the job's ``retries``).

    ``fence`` rises with every claim and takeover of the job. Pass it along with your writes and
    refuse a write whose fence is lower than the last one you accepted (for example
    ``UPDATE ... SET fence = :fence WHERE fence <= :fence``), so a stale runner that comes back
    after a takeover cannot overwrite the new runner's work.

    A plain (thread) handler cannot be interrupted: it should look at :attr:`should_stop` (or
    call :meth:`check_lease`) between steps and return when it is True.
    """

    job: str
    """The job's name."""
    slot: datetime | None
    """The scheduled time (aware, UTC); None for a manual run."""
    run_id: str
    """The run id of this attempt (a backup's takeover runs under a new one)."""
    attempt: int
    """1 for the first attempt; each takeover by a backup adds one."""
    fence: int | None
    """The fence this attempt runs under; it only rises per job."""
    trigger: Trigger
    """Why the run started: its slot came (``schedule``), a catch-up, a manual run or a retry."""
    instance: str
    """The id of the instance running it."""
    monotonic_ms: InitVar[Callable[[], int] | None] = None
    """The monotonic clock (ms) the lease's local deadline is measured on."""
    retry: int = 0
    """Which retry this run is (the job's ``retries``): 0 for the first run of its slot (or
    of a manual run), 1 for the first retry after it failed, and so on. Its ``trigger`` is
    then :attr:`~anarchon.Trigger.RETRY`. Not to be confused with :attr:`attempt`, which
    counts takeovers of one run."""
    # Made on first use: thousands of runs start at once when many jobs share a slot.
    _logger: logging.LoggerAdapter | None = field(default=None, init=False)  # type: ignore[type-arg]
    _lost: bool = field(default=False, init=False)
    _lost_async: asyncio.Event | None = field(default=None, init=False)
    _lost_reason: str | None = field(default=None, init=False)
    _timed_out: bool = field(default=False, init=False)
    # When the lease surely ends (monotonic ms) unless renewed; kept by the lease keeper.
    _deadline: int | None = field(default=None, init=False)
    _monotonic: Callable[[], int] | None = field(default=None, init=False)

    def __post_init__(self, monotonic_ms: Callable[[], int] | None) -> None:
        self._monotonic = monotonic_ms

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
                    "retry": self.retry,
                    "instance": self.instance,
                },
            )
        return self._logger

    @property
    def lease_lost(self) -> bool:
        """True once this run's lease is gone (taken over, expired, handed over): stop writing.

        Also True while the lease's local deadline (on the monotonic clock) has passed without
        a successful renewal, so a runner that was frozen (SIGSTOP, a long GC pause, a blocked
        event loop) learns it before its next write, even before the scheduler does. (If a late
        renewal then succeeds, nobody took the run over and it turns False again.) Safe to read
        from a plain handler's worker thread.
        """
        if self._lost:
            return True
        deadline, monotonic = self._deadline, self._monotonic
        return deadline is not None and monotonic is not None and monotonic() >= deadline

    @property
    def timed_out(self) -> bool:
        """True once the run has passed the job's ``timeout_ms``. An async handler is cancelled
        then; a plain handler's thread cannot be, so it should return soon: its run is recorded
        ``failed`` (timed out) whatever it returns, and keeps its lease until it does."""
        return self._timed_out

    @property
    def should_stop(self) -> bool:
        """True when a plain handler should return now: the lease is lost (taken over, expired,
        handed over on stop) or the run timed out. Safe to read from the handler's thread."""
        return self._timed_out or self.lease_lost

    def check_lease(self) -> None:
        """Raise :class:`~anarchon.errors.LeaseLost` if the lease is gone; call between steps
        (and before writes: see :attr:`lease_lost`)."""
        if self.lease_lost:
            raise LeaseLost(
                self._lost_reason
                or f"run {self.run_id} of job {self.job!r}: its lease ran out without a renewal"
            )

    async def wait_lease_lost(self) -> None:
        """Wait until the lease is lost (async handlers)."""
        if self.lease_lost:
            return
        if self._lost_async is None:
            self._lost_async = asyncio.Event()
        await self._lost_async.wait()

    def _flag_lost(self, reason: str) -> None:
        """Set the flags a handler reads (any thread); :meth:`_mark_lost` also wakes waiters."""
        if not self._lost:
            self._lost_reason = reason
            self._lost = True

    def _mark_lost(self, reason: str) -> None:
        """On the event loop's thread: flag the lease lost and wake :meth:`wait_lease_lost`."""
        self._flag_lost(reason)
        if self._lost_async is not None:
            self._lost_async.set()

    def __repr__(self) -> str:
        return (
            f"RunContext(job={self.job!r}, slot={self.slot}, run_id={self.run_id!r}, "
            f"attempt={self.attempt}, fence={self.fence}, retry={self.retry})"
        )


_blank: Final = object.__new__


def new_context(
    job: str,
    slot: datetime | None,
    run_id: str,
    attempt: int,
    fence: int | None,
    trigger: Trigger,
    instance: str,
    monotonic_ms: Callable[[], int] | None,
    retry: int,
) -> RunContext:
    """``RunContext(job=job, slot=slot, ...)``, the same object, built by plain stores of every
    slot: the executor makes one per run, thousands at once when many jobs share a slot, and
    the dataclass's keyword call and ``__post_init__`` took about twice as long
    (tests/unit/test_run_context.py checks every slot against the constructor's)."""
    ctx: RunContext = _blank(RunContext)
    ctx.job = job
    ctx.slot = slot
    ctx.run_id = run_id
    ctx.attempt = attempt
    ctx.fence = fence
    ctx.trigger = trigger
    ctx.instance = instance
    ctx.retry = retry
    ctx._logger = None
    ctx._lost = False
    ctx._lost_async = None
    ctx._lost_reason = None
    ctx._timed_out = False
    ctx._deadline = None
    ctx._monotonic = monotonic_ms
    return ctx
