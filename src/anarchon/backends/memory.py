"""An in-process lease backend: the reference implementation, and a tool for testing your jobs.

Everything lives in dictionaries of one process, so it gives no protection between processes.
Several :class:`~anarchon.Scheduler` objects in one event loop may share one instance, which is
how anarchon's own tests simulate many instances.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final, TypeVar, cast

from ..backend import (
    ChangeEvent,
    ChangeListener,
    ClaimListener,
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    LeaseBackend,
    SlotRecords,
    TakeoverOutcome,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from ..control import ALL_JOBS, Pause, RunRequest
from ..errors import BackendError, BackendUnavailable, InvalidOption
from ..kit import HISTORY_SIZE, Clock, Run, RunStatus, SystemClock, check_int
from ..kit import lease as rules
from ..kit.feed import ChangeFeed, won_notices
from ..kit.lease import RunRow
from ..kit.urls import int_option, split_url
from ..registry import InstanceRecord

__all__ = ["MemoryBackend", "MemoryControl", "MemoryRegistry"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
# Read once per claim, as a module constant: see anarchon._members (a backend imports only the
# contract and the kit, so it keeps its own copy).
_RUNNING: Final = RunStatus.RUNNING
URL_OPTIONS: Final = {"history_size": int_option(HISTORY_SIZE)}
"""The options a ``memory://`` URL takes."""


def _serialised(method: F) -> F:
    """Run the operation under the backend's lock: the scheduler's lease keeper may renew from
    its own thread (see :meth:`MemoryBackend.clone`)."""

    @functools.wraps(method)
    async def call(self: MemoryBackend, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return await method(self, *args, **kwargs)

    return cast(F, call)


class _MemoryRows:
    """The :class:`~anarchon.kit.lease.RowStore` over dictionaries."""

    def __init__(self, history_size: int) -> None:
        self.history_size = history_size
        # The latest attempt of each slot, and the earlier ones of slots taken over (oldest
        # first): no list per slot for the usual single attempt (one object fewer per record
        # for the garbage collector to walk).
        self.runs: dict[tuple[str, str], RunRow] = {}
        self.earlier: dict[tuple[str, str], list[RunRow]] = {}
        # Slot keys of each job in the order their first attempt was recorded: oldest first.
        self.by_job: dict[str, dict[str, None]] = {}
        # The attempts recorded ``running`` (their ``seq`` keys), and how many each job has:
        # live_holder looks through a job's slots only while one of its attempts runs, not at
        # every claim (a job's slots reach history_size: with 100 recorded, a claim took 65 us
        # instead of 12). Ints and the ``seq`` keys: no object made per run.
        self.running: set[tuple[str, str, int]] = set()
        self.running_by_job: dict[str, int] = {}
        self.fences: dict[str, int] = {}
        self.pruned: dict[str, int] = {}
        self.order = itertools.count()
        self.seq: dict[tuple[str, str, int], int] = {}
        self.control = MemoryControl()

    def current(self, job: str, slot_key: str) -> RunRow | None:
        return self.runs.get((job, slot_key))

    def _attempts(self, job: str, key: str) -> list[RunRow]:
        """Every attempt of the slot ``key``, oldest first."""
        return [*self.earlier.get((job, key), ()), self.runs[(job, key)]]

    def live_holder(self, job: str, now: int) -> RunRow | None:
        keys = self.by_job.get(job)
        if not keys or not self.running_by_job.get(job):  # the usual case: none runs
            return None
        live = [row for key in keys if (row := self.runs[(job, key)]).live(now)]
        return min(live, key=self._seq_of, default=None)

    def _seq_of(self, row: RunRow) -> int:
        return self.seq[(row.job, row.slot_key, row.attempt)]

    def insert(self, row: RunRow) -> None:
        before = self.runs.get((row.job, row.slot_key))
        if before is not None:
            self.earlier.setdefault((row.job, row.slot_key), []).append(before)
        self.runs[(row.job, row.slot_key)] = row
        self.by_job.setdefault(row.job, {})[row.slot_key] = None
        attempt = (row.job, row.slot_key, row.attempt)
        self.seq[attempt] = next(self.order)
        if row.status == _RUNNING:
            self.running.add(attempt)
            self.running_by_job[row.job] = self.running_by_job.get(row.job, 0) + 1

    def update(self, row: RunRow) -> None:
        """Rows are mutated in place: only the count of running attempts is kept up."""
        attempt = (row.job, row.slot_key, row.attempt)
        if row.status != _RUNNING and attempt in self.running:
            self.running.remove(attempt)
            self.running_by_job[row.job] -= 1

    def next_fence(self, job: str, now: int) -> int:
        self.fences[job] = rules.next_fence(self.fences.get(job), now)
        return self.fences[job]

    def pruned_through(self, job: str) -> int | None:
        return self.pruned.get(job)

    def pauses(self, job: str) -> list[Pause]:
        held = self.control.paused
        if not held:  # the usual case, asked once per claim
            return []
        return [held[name] for name in (job, ALL_JOBS) if name in held]

    def add_request(self, request: RunRequest) -> None:
        self.control.add(request)

    def rows(self, job: str) -> list[RunRow]:
        out = [row for key in self.by_job.get(job, {}) for row in self._attempts(job, key)]
        out.sort(key=lambda r: (r.started_at, self._seq_of(r)))
        return out

    def prune(self, job: str, keep_key: str, cutoff: int | None) -> None:
        """The reference pruning (see :meth:`~anarchon.kit.lease.RowStore.prune`)."""
        keys = self.by_job.get(job, {})
        if len(keys) <= self.history_size and (
            cutoff is None or all(self._first_start(job, k)[0] >= cutoff for k in keys)
        ):
            return  # the usual case, once per result: nothing to prune, no sort
        slots = sorted(keys, key=lambda k: self._first_start(job, k))

        def prunable(key: str) -> bool:
            return key != keep_key and self.runs[(job, key)].status != _RUNNING

        victims: list[str] = []
        if cutoff is not None:
            for key in slots:
                latest = self.runs[(job, key)]
                if len(victims) >= rules.PRUNE_BATCH or self._first_start(job, key)[0] >= cutoff:
                    break
                if prunable(key) and latest.finished_at is not None and latest.finished_at < cutoff:
                    victims.append(key)
        room = min(rules.PRUNE_BATCH, len(keys) - self.history_size) - len(victims)
        chosen = set(victims)
        for key in slots:
            if room <= 0:
                break
            if key not in chosen and prunable(key):
                victims.append(key)
                room -= 1
        for key in victims:
            attempts = self._attempts(job, key)
            del self.runs[(job, key)]
            self.earlier.pop((job, key), None)
            del keys[key]
            for row in attempts:
                del self.seq[(job, key, row.attempt)]
            slot = attempts[0].slot
            if slot is not None:
                self.pruned[job] = max(self.pruned.get(job, slot), slot)

    def _first_start(self, job: str, key: str) -> tuple[int, int]:
        earlier = self.earlier.get((job, key))
        first = earlier[0] if earlier else self.runs[(job, key)]
        return first.started_at, self._seq_of(first)

    def last_slot(self, job: str) -> int | None:
        slots = [row.slot for row in self.rows(job) if row.slot is not None]
        pruned = self.pruned.get(job)
        if pruned is not None:
            slots.append(pruned)
        return max(slots, default=None)


class MemoryBackend(LeaseBackend):
    """Keeps claims, leases and history in this process's memory; every lease feature.

    :param clock: where "now" comes from; pass :class:`anarchon.testing.FakeClock` to test jobs
        with a controllable clock.
    :param history_size: at most this many slots (a slot's attempts count as one) are kept per
        job, pruned when results are recorded.
    """

    name = "memory"
    one_host = True

    def __init__(self, *, clock: Clock | None = None, history_size: int = 1000) -> None:
        self._clock: Clock = clock or SystemClock()
        self._history_size = check_int("history_size", history_size, HISTORY_SIZE, "MemoryBackend")
        self._rows = _MemoryRows(self._history_size)
        self._feed = ChangeFeed(self.name)
        self._lock = threading.RLock()

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        """Build the backend from ``memory://`` or ``memory://?history_size=500``; any other
        option, or a host or path, raises :class:`~anarchon.errors.InvalidOption`."""
        split = split_url(url, URL_OPTIONS, backend="memory")
        if split.url.lower() not in ("memory://", "memory:"):
            raise InvalidOption(
                f"the memory URL {split.shown!r} names a place; memory has none: write "
                "memory:// (options: ?history_size=)"
            )
        return cls(**split.options)

    def __repr__(self) -> str:
        return f"MemoryBackend(history_size={self._history_size})"

    @_serialised
    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`."""
        now = self._now()
        outcomes = [rules.claim(self._rows, req, now) for req in requests]
        self._feed.dispatch_claims(won_notices(outcomes))
        return outcomes

    @_serialised
    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        """See :meth:`anarchon.backend.Backend.finish`."""
        run = rules.finish(self._rows, ticket, status, error, self._now(), retry)
        self._notify(ticket.job, ticket.slot_key, False)
        return run

    @_serialised
    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: every item under one hold of the
        lock, as :meth:`finish` would decide it (the default made two coroutines and took the
        lock once per item; ten thousand results of one slot arrive together)."""
        out: list[Run | BackendError] = []
        for ticket, status, error, retry in items:
            try:
                run = rules.finish(self._rows, ticket, status, error, self._now(), retry)
            except BackendUnavailable:
                raise
            except BackendError as exc:
                out.append(exc)
                continue
            self._notify(ticket.job, ticket.slot_key, False)
            out.append(run)
        return out

    @_serialised
    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`."""
        return self._newest(job, limit)

    def _newest(self, job: str, limit: int) -> list[Run]:
        """Up to ``limit`` runs of ``job``, newest first (under the lock)."""
        rows = self._rows.rows(job)
        return [row.to_run() for row in reversed(rows[-limit:])] if limit > 0 else []

    @_serialised
    async def slot_records(self, job: str, slot: int) -> SlotRecords:
        """See :meth:`anarchon.backend.Backend.slot_records` (a pass over the job's records,
        as :meth:`history` makes)."""
        rows = self._rows.rows(job)
        starts = [row.started_at for row in rows] + [r.slot for r in rows if r.slot is not None]
        return SlotRecords(
            [row.to_run() for row in rows if row.slot == slot], min(starts, default=None)
        )

    @_serialised
    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """See :meth:`anarchon.backend.Backend.histories`: every job's under one hold of the
        lock."""
        return {job: self._newest(job, limit) for job in dict.fromkeys(jobs)}

    async def server_time_ms(self) -> int | None:
        """The clock this backend uses."""
        return self._now()

    async def subscribe_claims(self, on_claims: ClaimListener) -> bool:
        """Call ``on_claims`` synchronously with the notices of every claim call that won
        slots (before the call answers); True: this backend announces claims."""
        self._feed.add_claims(on_claims)
        return True

    def _notify(self, job: str, slot_key: str, released: bool) -> None:
        self._feed.dispatch(ChangeEvent(job, slot_key, released))

    def registry(self) -> MemoryRegistry:
        """The registry, in this object (shared by the schedulers that share the object)."""
        self._registry: MemoryRegistry = getattr(self, "_registry", None) or MemoryRegistry()
        return self._registry

    def control(self) -> MemoryControl:
        """Pauses and run requests, in this object; its claims read the same pauses."""
        return self._rows.control

    def _now(self) -> int:
        return self._clock.now_ms()

    @_serialised
    async def renew(self, ticket: Ticket) -> Ticket:
        """See :meth:`anarchon.backend.LeaseBackend.renew`."""
        return rules.renew(self._rows, ticket, self._now())

    @_serialised
    async def take_over(self, request: TakeoverRequest) -> TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`."""
        outcome = rules.take_over(self._rows, request, self._now())
        if outcome.status is TakeoverStatus.EXHAUSTED:
            self._notify(request.job, request.slot_key, False)
        return outcome

    @_serialised
    async def release(self, ticket: Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`."""
        rules.release(self._rows, ticket, self._now())
        self._notify(ticket.job, ticket.slot_key, True)

    @_serialised
    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`."""
        return self._rows.last_slot(job)

    @_serialised
    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        """See :meth:`anarchon.backend.LeaseBackend.open_runs` (a pass over each job's
        records)."""
        return [
            row.to_run()
            for job in dict.fromkeys(jobs)
            for row in self._rows.rows(job)
            if row.status == RunStatus.RUNNING and row.started_at >= since_ms
        ]

    async def subscribe(self, on_change: ChangeListener) -> None:
        """Call ``on_change`` synchronously on every release and finish; a listener that raises
        is logged and the others are still called."""
        self._feed.add(on_change)

    def clone(self) -> MemoryBackend:
        """This backend itself: its operations take a lock, so the scheduler's lease keeper can
        renew from its own thread (there is no connection to open)."""
        return self


class MemoryRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in a dict; every step is atomic (one event
    loop, no await inside a step)."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[int, str]] = {}  # id -> heartbeat_ms, document
        self._recorded = False
        self._sets: dict[str, tuple[int, bytes]] = {}

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        self._records[instance.id] = (instance.heartbeat_ms, instance.to_json())
        self._recorded = True

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`: each record as a store that
        keeps bytes gives it back (definitions named by digest, not resolved)."""
        found = (InstanceRecord.from_json(text) for _, text in self._records.values())
        return [record for record in found if record is not None]

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions`."""
        kept = self._sets.get(digest)
        self._sets[digest] = (saved_ms, data if kept is None else kept[1])

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""
        kept = self._sets.get(digest)
        return None if kept is None else kept[1]

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""
        return digest in self._sets

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.touch_definitions`."""
        kept = self._sets.get(digest)
        if kept is None:
            return False
        self._sets[digest] = (max(kept[0], saved_ms), kept[1])
        return True

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions`."""
        gone = [d for d, (saved, _) in self._sets.items() if saved < cutoff_ms and d not in keep]
        for digest in gone:
            del self._sets[digest]
        return gone

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        return self._recorded

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        self._records.pop(instance_id, None)

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""
        silent = [i for i, (beat, _) in self._records.items() if beat < cutoff_ms]
        for instance_id in silent:
            del self._records[instance_id]
        return silent


class MemoryControl:
    """A :class:`~anarchon.control.ControlStore` in dicts; every step is atomic (no await inside
    a step), and :class:`MemoryBackend`'s claims read its pauses."""

    def __init__(self) -> None:
        self.paused: dict[str, Pause] = {}
        self._requests: dict[str, RunRequest] = {}

    async def pause(self, pause: Pause) -> None:
        """See :meth:`anarchon.control.ControlStore.pause`."""
        self.paused[pause.job] = pause

    async def resume(self, job: str) -> Pause | None:
        """See :meth:`anarchon.control.ControlStore.resume`."""
        return self.paused.pop(job, None)

    async def pauses(self) -> list[Pause]:
        """See :meth:`anarchon.control.ControlStore.pauses`."""
        return list(self.paused.values())

    async def request(self, request: RunRequest) -> bool:
        """See :meth:`anarchon.control.ControlStore.request`."""
        return self.add(request)

    def add(self, request: RunRequest) -> bool:
        """:meth:`request` as one synchronous step (a retry stored with its failed result)."""
        if request.id in self._requests:
            return False
        self._requests[request.id] = request
        return True

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """See :meth:`anarchon.control.ControlStore.requests`."""
        wanted = None if jobs is None else set(jobs)
        found = [r for r in self._requests.values() if wanted is None or r.job in wanted]
        return sorted(found, key=lambda r: (r.due_ms, r.requested_at_ms, r.id))

    async def done(self, request_id: str) -> None:
        """See :meth:`anarchon.control.ControlStore.done`."""
        self._requests.pop(request_id, None)
