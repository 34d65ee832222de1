"""The loop watchdog: from a thread of the scheduler's own, measure how late the main event loop
runs a callback, and name what blocks it.

A blocking call in an ``async def`` handler (``time.sleep``, a synchronous driver) stops every
other coroutine of the process: claims, results, the backups' checks. Leases survive it (they are
kept from the keeper thread), but an operator needs to know which handler did it. The watchdog
posts a probe to the loop twice a second (a callback that records how late it ran); when a probe
waits longer than :data:`BLOCK_WARN_MS`, it looks at the loop thread's stack and logs one WARNING
naming the job (and handler) whose code is on it, and when the loop runs again, how long it was
blocked. A block is noticed if it lasts longer than :data:`BLOCK_WARN_MS` + :data:`TICK_MS`.
The last block seen to end (:attr:`LoopWatchdog.last_block`) tells a backlog (:mod:`._backlog`)
that the loop was blocked, not the process frozen: a process stopped whole (SIGSTOP, a paused
VM) stops the watchdog's thread too, which then notices that it did not run itself
(:data:`STALL_MS`) and does not take the stop for a block.
Each tick costs the process a few hundred microseconds of CPU (two thread wake-ups), so the
ticks are no more frequent than that.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._active import ActiveRun
    from ._job import Job

__all__ = ["BLOCK_WARN_MS", "Block", "LoopWatchdog", "describe_blocker"]

logger = logging.getLogger("anarchon.scheduler")

#: A probe that waited this long means the loop is blocked: warn.
BLOCK_WARN_MS: Final = 1_000
#: The watchdog wakes this often: it sends a probe when none is waiting, else checks it.
TICK_MS: Final = 500
#: A tick this much later than :data:`TICK_MS` means the watchdog's own thread did not run: the
#: whole process was stopped, and a probe's wait until then is not the loop's doing.
STALL_MS: Final = 1_000

Describe = Callable[[FrameType | None], tuple[str, str | None]]
"""Given the loop thread's innermost frame, say what is running (text, job name or None)."""


class Block(NamedTuple):
    """A block of the event loop that the watchdog saw end: at ``ended_ms`` (monotonic), after
    ``blocked_ms``, by ``blocker`` (what its warning named; None if it did not warn)."""

    ended_ms: int
    blocked_ms: int
    blocker: str | None


@dataclass(eq=False)
class LoopWatchdog:
    """Watches one event loop from another thread (see the module's docstring).

    ``lag_ms`` is the last measured delay of a probe, ``max_lag_ms`` the largest since start, and
    ``blocked_ms`` how long the loop has been blocked right now (0 when it runs).
    ``last_block`` is the last block seen to end: a probe that waited at least one tick while
    this thread ran (None before any).
    """

    loop: asyncio.AbstractEventLoop
    loop_thread: int
    monotonic_ms: Callable[[], int]
    describe: Describe
    threshold_ms: int = BLOCK_WARN_MS
    lag_ms: int = field(default=0, init=False)
    max_lag_ms: int = field(default=0, init=False)
    blocks: int = field(default=0, init=False)
    last_block: Block | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # The probe outstanding: when it was sent (also its token), and since when its wait counts
    # as the loop's (later after a stall of this thread); whether a tick saw it wait.
    _sent: int | None = field(default=None, init=False)
    _since: int = field(default=0, init=False)
    _waited: bool = field(default=False, init=False)
    _ticked: int | None = field(default=None, init=False)
    _blocker: tuple[str, str | None] | None = field(default=None, init=False)

    @property
    def blocked_ms(self) -> int:
        """How long the current probe has waited (0 when none is outstanding)."""
        if self._sent is None:
            return 0
        return max(0, self.monotonic_ms() - self._since)

    @property
    def blocker(self) -> str | None:
        """What blocks the loop now, as the warning named it (None when it runs, or before the
        warning)."""
        blocker = self._blocker
        return None if blocker is None else blocker[0]

    async def run(self) -> None:
        """Probe and check until cancelled (on the watchdog's own loop)."""
        while True:
            self._tick()
            await asyncio.sleep(TICK_MS / 1000)

    def _tick(self) -> None:
        now = self.monotonic_ms()
        ticked, self._ticked = self._ticked, now
        stalled = ticked is not None and now - ticked > TICK_MS + STALL_MS
        with self._lock:
            sent, warned = self._sent, self._blocker is not None
            if sent is None:
                self._sent = self._since = now
                self._waited = False
                try:
                    self.loop.call_soon_threadsafe(self._pong, now)
                except RuntimeError:  # the loop is closed
                    self._sent = None
                return
            if stalled and not warned:
                # This thread did not run either: the process was stopped whole, and the
                # probe's wait until now is no block of the loop.
                self._since, self._waited = now, False
                return
            self._waited = True
            since = self._since
        if warned or now - since < self.threshold_ms:
            return
        frame = sys._current_frames().get(self.loop_thread)
        try:
            text, job = self.describe(frame)
        except Exception as exc:  # describing must never kill the watchdog
            text, job = f"(could not tell: {exc!r})", None
        finally:
            del frame
        with self._lock:
            if self._sent != sent:  # it answered meanwhile
                return
            self._blocker = (text, job)
            self.blocks += 1
        logger.warning(
            "the event loop has been blocked for %d ms by %s; a blocking call in an async "
            "handler stops claims, results and backups in this process (leases are kept from "
            "the scheduler's own thread). Use await, or a plain def handler (runs in a thread)",
            now - since,
            text,
            extra=log_fields(Action.LOOP_BLOCKED, job, blocked_ms=now - since),
        )

    def _pong(self, sent: int) -> None:
        """Runs on the watched loop."""
        now = self.monotonic_ms()
        with self._lock:
            if self._sent != sent:
                return
            lag = max(0, now - self._since)
            self._sent = None
            blocker, self._blocker = self._blocker, None
            self.lag_ms = lag
            self.max_lag_ms = max(self.max_lag_ms, lag)
            if self._waited:  # a tick saw it wait, this thread running: the loop was blocked
                self.last_block = Block(now, lag, blocker[0] if blocker is not None else None)
        if blocker is not None:
            text, job = blocker
            logger.warning(
                "the event loop ran again after being blocked for %d ms by %s",
                lag,
                text,
                extra=log_fields(Action.LOOP_UNBLOCKED, job, blocked_ms=lag),
            )


def _code_of(handler: Callable[..., Any]) -> CodeType | None:
    """The code object a handler's frames run, to recognise it on a stack."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(target)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        call = getattr(type(target), "__call__", None)  # noqa: B004 - a callable object
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code if isinstance(code, CodeType) else None


def describe_blocker(
    frame: FrameType | None, jobs: list[Job], active: ActiveRun | None
) -> tuple[str, str | None]:
    """On the watchdog's thread: name the job (and handler, file and line) whose code is on
    the blocked loop's stack, else the innermost function."""
    codes: dict[CodeType, Job] = {}
    for registered in jobs:
        code = _code_of(registered.handler)
        if code is not None:
            codes.setdefault(code, registered)
    innermost = frame
    found: FrameType | None = None
    while frame is not None:
        if frame.f_code in codes:
            found = frame
            break
        frame = frame.f_back
    job: Job | None = active.job if active is not None else None
    if job is None and found is not None:
        job = codes[found.f_code]
    where = found or innermost
    place = (
        f"{where.f_code.co_qualname} at {where.f_code.co_filename}:{where.f_lineno}"
        if where is not None
        else "unknown code"
    )
    if job is None:
        return f"code that is not a job's handler ({place})", None
    qualname = getattr(job.handler, "__qualname__", None)
    module = getattr(job.handler, "__module__", None)
    handler = f"{module}.{qualname}" if qualname and module else repr(job.handler)
    run = f", run {active.ticket.run_id[:8]}" if active is not None else ""
    return f"job {job.name!r} (handler {handler}{run}; in {place})", job.name
