"""Helpers shared by the core's unit tests: backends that record or break calls, a backend clock
that a host's wall-clock step does not move, and a way to wait in real time for a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from anarchon import Run, RunContext, Scheduler
from anarchon.backend import (
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from anarchon.control import RunRequest
from anarchon.errors import BackendError
from anarchon.testing import FakeClock, MemoryBackend

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000


class BackendClock:
    """The backend's own clock (another host): it follows time passing on ``clock`` but not the
    steps of ``clock``'s wall clock."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._offset = clock.now_ms() - clock.monotonic_ms()

    def now_ms(self) -> int:
        return self._clock.monotonic_ms() + self._offset

    def monotonic_ms(self) -> int:
        return self._clock.monotonic_ms()

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)

    async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
        await self._clock.sleep((wall_ms - self.now_ms()) / 1000)


B = TypeVar("B", bound=MemoryBackend)


def on_another_host(backend: B) -> B:
    """A memory backend standing for a server on another host (with a :class:`BackendClock`):
    a step of this host's clock does not move the backend's, so the core compares them."""
    backend.one_host = False
    return backend


class Recording(MemoryBackend):
    """A memory backend that records every lease call with the time it was made (backend clock)."""

    def __init__(self, clock: Any) -> None:
        super().__init__(clock=clock)
        self.calls: list[tuple[str, int, Any]] = []

    def _note(self, name: str, what: Any) -> None:
        self.calls.append((name, self._now(), what))

    def named(self, name: str) -> list[tuple[str, int, Any]]:
        return [c for c in self.calls if c[0] == name]

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        self._note("claim", list(requests))
        return await super().claim(requests)

    async def renew(self, ticket: Ticket) -> Ticket:
        self._note("renew", ticket)
        return await super().renew(ticket)

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        self._note("take_over", request)
        return await super().take_over(request)

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        self._note("finish", (ticket, status, error))
        return await super().finish(ticket, status, error, retry)

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        return await super().finish_many(items)


class View(MemoryBackend):
    """Another instance's view of the same in-memory store (shares its data and its lock)."""

    def __init__(self, shared: MemoryBackend) -> None:
        self.__dict__ = shared.__dict__


async def until(predicate: Callable[[], Any], seconds: float, what: str) -> None:
    """Wait in real time until ``predicate()`` is true."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def stopping_during_a_run(
    clock: FakeClock, needs_s: float, ended: list[int], backend: MemoryBackend | None = None
) -> tuple[Scheduler, asyncio.Future[None]]:
    """A scheduler (defaults; on a :class:`Recording` backend unless given ``backend``) whose
    run needs ``needs_s`` more, and its first stop(), begun."""

    async def work(ctx: RunContext) -> None:
        await clock.sleep(needs_s)
        ended.append(ctx.attempt)

    scheduler = Scheduler(backend or Recording(clock), clock=clock, instance_id="one")
    scheduler.add("work", "0 * * * *", work, jitter_ms=0)
    await scheduler.start()
    await clock.advance(60 * MINUTE + 2_000)
    first = asyncio.ensure_future(scheduler.stop())
    await until(lambda: not scheduler.running, 5, "the first stop to begin")
    return scheduler, first
