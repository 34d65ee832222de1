"""A toy lease backend built only on anarchon's public kit: every run in one dict.

It keeps its store in the process (like anarchon's MemoryBackend), so it protects nothing
between processes; it shows what a backend is made of. Each call runs without an ``await`` in
the middle, so on one event loop it is atomic: the lease rules decide inside that step.
"""

from __future__ import annotations

from collections.abc import Sequence

from anarchon.backend import (
    ClaimOutcome,
    ClaimRequest,
    LeaseBackend,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from anarchon.control import Pause, RunRequest
from anarchon.errors import BackendError
from anarchon.kit import HISTORY_SIZE, Run, RunStatus, SystemClock, check_int
from anarchon.kit import lease as rules
from anarchon.kit.lease import RunRow
from anarchon.kit.urls import int_option, split_url


class DictRows:
    """The rows, as the lease rules read and write them (a :class:`anarchon.kit.lease.RowStore`)."""

    def __init__(self, history_size: int) -> None:
        self.history_size = history_size
        self.runs: dict[tuple[str, str], list[RunRow]] = {}  # attempts of each (job, slot key)
        self.order: list[RunRow] = []  # every attempt, in the order it was recorded
        self.fences: dict[str, int] = {}
        self.pruned: dict[str, int] = {}

    def current(self, job: str, slot_key: str) -> RunRow | None:
        attempts = self.runs.get((job, slot_key))
        return attempts[-1] if attempts else None

    def live_holder(self, job: str, now: int) -> RunRow | None:
        live = (row for row in self.order if row.job == job and row.live(now))
        return next(live, None)

    def insert(self, row: RunRow) -> None:
        self.runs.setdefault((row.job, row.slot_key), []).append(row)
        self.order.append(row)

    def update(self, row: RunRow) -> None:
        """Rows are changed in place: nothing to write back."""

    def next_fence(self, job: str, now: int) -> int:
        self.fences[job] = rules.next_fence(self.fences.get(job), now)
        return self.fences[job]

    def pruned_through(self, job: str) -> int | None:
        return self.pruned.get(job)

    def pauses(self, job: str) -> list[Pause]:
        """The toy keeps no control store (``control()`` is None): nothing is ever paused."""
        return []

    def add_request(self, request: RunRequest) -> None:
        """The toy keeps no control store, so the core sends it no retry to store."""
        raise BackendError(f"the toy backend keeps no run requests: {request.id} not stored")

    def prune(self, job: str, keep_key: str, cutoff: int | None) -> None:
        keys = [key for (owner, key) in self.runs if owner == job]  # oldest first

        def ended(key: str) -> bool:
            return key != keep_key and self.runs[(job, key)][-1].status != RunStatus.RUNNING

        def aged(key: str) -> bool:
            latest = self.runs[(job, key)][-1]
            return cutoff is not None and (latest.finished_at or 0) < cutoff

        victims = [key for key in keys if ended(key) and aged(key)]
        extra = len(keys) - self.history_size - len(victims)
        victims += [key for key in keys if ended(key) and key not in victims][: max(0, extra)]
        for key in victims[: rules.PRUNE_BATCH]:
            attempts = self.runs.pop((job, key))
            self.order = [row for row in self.order if row not in attempts]
            slot = attempts[0].slot
            if slot is not None:
                self.pruned[job] = max(self.pruned.get(job, slot), slot)


class ToyBackend(LeaseBackend):
    """A lease backend in one dict: ``toy://?history_size=100``."""

    name = "toy"

    def __init__(self, *, history_size: int = 1000) -> None:
        size = check_int("history_size", history_size, HISTORY_SIZE, "ToyBackend")
        self.rows = DictRows(size)
        self.clock = SystemClock()

    @classmethod
    def from_url(cls, url: str) -> ToyBackend:
        """Build the backend from ``toy://?history_size=100``; other options are refused."""
        split = split_url(url, {"history_size": int_option(HISTORY_SIZE)}, backend="toy")
        return cls(**split.options)

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        now = self.clock.now_ms()
        return [rules.claim(self.rows, request, now) for request in requests]

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        return rules.finish(self.rows, ticket, status, error, self.clock.now_ms(), retry)

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        rows = sorted(
            (row for row in self.rows.order if row.job == job),
            key=lambda row: row.started_at,  # stable: one millisecond keeps the record order
        )
        return [row.to_run() for row in reversed(rows)][: max(limit, 0)]

    async def server_time_ms(self) -> int | None:
        return self.clock.now_ms()

    async def renew(self, ticket: Ticket) -> Ticket:
        return rules.renew(self.rows, ticket, self.clock.now_ms())

    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        return rules.take_over(self.rows, request, self.clock.now_ms())

    async def release(self, ticket: Ticket, reason: str) -> None:
        rules.release(self.rows, ticket, self.clock.now_ms())

    async def last_slot(self, job: str) -> int | None:
        slots = [row.slot for row in self.rows.order if row.job == job and row.slot is not None]
        pruned = self.rows.pruned_through(job)
        return max([*slots, *([pruned] if pruned is not None else [])], default=None)
