"""The heartbeat: each scheduler records itself and its jobs in the backend's registry.

Every ``heartbeat_ms`` the instance writes its :class:`~anarchon.registry.InstanceRecord` (one
small document, whole, naming its jobs' definitions set by digest: the set itself is saved once,
see :func:`~anarchon.registry.record_instance`), reads the registry back, removes the records
that are not live (:func:`~anarchon.registry.is_live`: silent for longer than
:data:`~anarchon.registry.SILENT_HEARTBEATS` of *their own* heartbeats), and looks for
definition drift (every :data:`PRUNE_EVERY` beats it also removes the definitions
sets no live record names): one WARNING (action ``definition_drift``) per distinct drift,
naming the instances and the definitions.

Each heartbeat draws a random token when it starts and writes it in its record. A beat reads the
registry before it writes: a record of this instance's id that carries another token was
written since this instance's last write by another process under the same id (two processes
given one ``instance_id``). That is logged as an ERROR (action ``instance_id_shared``, naming
the id and the other process's host and pid), written in the record (``shared_with``, which
``anarchon instances`` and ``anarchon health`` show) and made a problem of
:meth:`Scheduler.health() <anarchon.Scheduler.health>`, until
:data:`~anarchon.registry.SILENT_HEARTBEATS` beats in a row find no other token. Only a write
after this instance's own counts: the record that a process killed moments ago left under the
same id (a restart) is overwritten at the first beat, and never reported.

It runs as a task of its own and nothing waits on it: the claim path never reads the registry,
so a slow or failing registry delays no slot. A failing write is logged once per outage (action
``registry_unavailable``) and retried at the next beat; recovery is logged once too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Final

from ._clock import Clock
from ._job import Job
from ._options import Bound
from .errors import AnarchonError
from .logs import Action, log_fields
from .registry import (
    SILENT_HEARTBEATS,
    ClusterView,
    InstanceRecord,
    JobDefinition,
    RegistryStore,
    build_view,
    encode_definitions,
    is_live,
    read_instances,
    record_instance,
)

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "HEARTBEAT",
    "Heartbeat",
    "definition_of",
    "read_cluster",
    "silent_cutoff",
]

logger = logging.getLogger("anarchon.scheduler")

DEFAULT_HEARTBEAT_MS: Final = 5_000
HEARTBEAT: Final = Bound(100, 3_600_000, ms=True)
"""The range of the Scheduler's ``heartbeat_ms``."""
# On stop, removing this instance's record may take this long (s) before it is left to expire.
LEAVE_TIMEOUT_S: Final = 2.0
# Every this many beats, the definitions sets no live record names are pruned (a set is kept for
# SILENT_HEARTBEATS beats after it was saved, so a starting instance's set outlives the gap
# between saving it and recording itself).
PRUNE_EVERY: Final = 12
# ... and for at least this long (ms), however short the heartbeats: saving a set of 100 000
# jobs can take a few seconds on a slow link.
PRUNE_GRACE_MS: Final = 60_000


def definition_of(job: Job) -> JobDefinition:
    """The definition of ``job`` that every instance should share: expression, zone and the
    resolved options (defaults filled in)."""
    policy, retry = job.policy, job.retry
    key = (
        policy.jitter_ms,
        policy.max_late_ms,
        policy.lease_ms,
        policy.max_attempts,
        policy.overlap,
        policy.catch_up,
        policy.catch_up_window_ms,
        policy.handover,
        policy.history_ttl_ms,
        job.timeout_ms,
        retry.retries,
        retry.backoff_ms,
        retry.backoff_max_ms,
    )
    shared = _OPTIONS.get(key)
    if shared is None:
        if len(_OPTIONS) >= 1024:
            _OPTIONS.clear()
        shared = _OPTIONS[key] = {
            "jitter_ms": policy.jitter_ms,
            "max_late_ms": policy.max_late_ms,
            "lease_ms": policy.lease_ms,
            "max_attempts": policy.max_attempts,
            "overlap": policy.overlap.value,
            "catch_up": str(policy.catch_up),
            "catch_up_window_ms": policy.catch_up_window_ms,
            "handover": policy.handover,
            "history_ttl_ms": policy.history_ttl_ms,
            "timeout_ms": job.timeout_ms,
            "retries": retry.retries,
            "retry_backoff_ms": retry.backoff_ms,
            "retry_backoff_max_ms": retry.backoff_max_ms,
        }
    return JobDefinition(
        name=job.name,
        expression=job.schedule.expression,
        zone=job.schedule.timezone,
        options=shared,
    )


# Jobs with equal options share one dict of them (never changed once made): 100 000 jobs on a
# few option sets keep a few dicts, not 100 000.
_OPTIONS: dict[tuple[object, ...], dict[str, str | int | bool | None]] = {}


async def read_cluster(store: RegistryStore, now_ms: int) -> ClusterView:
    """Read the registry once: the live instances, their definitions and the drift among them
    (records that are not live at ``now_ms`` in the view's ``silent``)."""
    return build_view(await read_instances(store, now_ms), now_ms)


def silent_cutoff(records: Iterable[InstanceRecord], now_ms: int, interval_ms: int) -> int:
    """The heartbeat time before which every record is silent by its own rule
    (:func:`~anarchon.registry.is_live`), for :meth:`RegistryStore.remove_silent`.

    The store removes by one cutoff, while each record is judged by its own interval: the
    cutoff goes back :data:`SILENT_HEARTBEATS` of the longest interval among the live records
    (and ``interval_ms``, this instance's), so a record that beats less often than this instance
    is never removed while it is live (a dead record of a shorter interval waits a little longer
    in the store; no view counts it meanwhile)."""
    longest = max((r.interval_ms for r in records if is_live(r, now_ms)), default=interval_ms)
    return now_ms - SILENT_HEARTBEATS * max(longest, interval_ms)


_by_name: Final = operator.attrgetter("name")


def _define(jobs: tuple[Job, ...]) -> tuple[JobDefinition, ...]:
    """The definitions of ``jobs``, sorted by name."""
    return tuple(sorted(map(definition_of, jobs), key=_by_name))


def _define_and_encode(jobs: tuple[Job, ...]) -> tuple[JobDefinition, ...]:
    """:func:`_define`, and the set encoded once (remembered by the registry for the beat)."""
    defined = _define(jobs)
    encode_definitions(defined)
    return defined


class Heartbeat:
    """Records one instance in a :class:`~anarchon.registry.RegistryStore`, on a task of its
    own, from :meth:`start` until :meth:`stop` (which removes the record)."""

    instances_seen: int | None = None
    """Live instances in the registry at the last beat that read it (None before one)."""
    on_view: Callable[[ClusterView], None] | None = None
    """Called with each view a beat reads (the scheduler ranks its claims by it)."""

    def __init__(
        self,
        store: RegistryStore,
        clock: Clock,
        interval_ms: int,
        instance_id: str,
        jobs: Callable[[], Iterable[Job]],
        clock_offset_ms: Callable[[], int | None],
        jobs_version: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.interval_ms = interval_ms
        self._clock = clock
        self._id = instance_id
        self._jobs = jobs
        self._jobs_seen: tuple[Job, ...] = ()
        # Changes whenever the jobs do (the scheduler counts adds and removals): a beat of
        # 100 000 jobs then does not walk them to find out. None: compare the jobs one by one.
        self._jobs_version = jobs_version
        self._version_seen: int | None = None
        self._defined: tuple[JobDefinition, ...] = ()
        self._offset = clock_offset_ms
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._failing = False
        self._warned: set[tuple[str, frozenset[str]]] = set()
        self._saved: dict[str, float] = {}  # the set this instance saved: see record_instance
        self._beats = 0
        self._wrote = False  # whether a record of this heartbeat is in the store
        self._alone = 0  # beats in a row that found no other process under this id
        self.shared_with: str | None = None
        """Another process recording itself under this instance's id, as ``host pid N``, while
        one is found (see the module's docstring); None otherwise."""
        self.last_beat_ms: int | None = None
        """When this instance last recorded itself (monotonic ms)."""
        from . import __version__  # the package imports this module while it loads

        started_ms = self.backend_now_ms()
        self._first = InstanceRecord(
            id=instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            started_ms=started_ms,
            heartbeat_ms=started_ms,
            interval_ms=interval_ms,
            clock_offset_ms=None,
            token=uuid.uuid4().hex[:16],
        )
        """What this instance records as it starts, before any beat: :meth:`record` is it with
        the fields that move replaced."""

    def backend_now_ms(self) -> int:
        """Now on the backend's clock, as this instance last measured its offset."""
        return self._clock.now_ms() + (self._offset() or 0)

    def record(self) -> InstanceRecord:
        """This instance as it records itself now."""
        return replace(
            self._first,
            heartbeat_ms=self.backend_now_ms(),
            clock_offset_ms=self._offset(),
            jobs=self._definitions(),
            shared_with=self.shared_with,
        )

    def _definitions(self) -> tuple[JobDefinition, ...]:
        """The carried jobs' definitions, sorted by name: built again only when the set of jobs
        changed, so a beat of 10 000 jobs does not rebuild (and re-encode) them all."""
        version = None if self._jobs_version is None else self._jobs_version()
        if version is not None and version == self._version_seen:
            return self._defined
        jobs = tuple(self._jobs())
        seen = self._jobs_seen
        if len(jobs) != len(seen) or any(a is not b for a, b in zip(jobs, seen, strict=True)):
            self._jobs_seen = jobs
            self._defined = _define(jobs)
        self._version_seen = version
        return self._defined

    async def _refresh(self) -> None:
        """Build the definitions again in a thread when the jobs changed (by the counter): with
        100 000 jobs, building and encoding them takes a second or more, which the event loop
        that claims slots must not wait on. Without a counter, :meth:`record` builds them."""
        if self._jobs_version is None:
            return
        version = self._jobs_version()
        if version == self._version_seen:
            return
        jobs = tuple(self._jobs())  # on the loop: the scheduler changes its table there
        defined = await asyncio.to_thread(_define_and_encode, jobs)
        # Jobs changed meanwhile: the counter moved on, and the next beat builds them again.
        self._jobs_seen, self._defined, self._version_seen = jobs, defined, version

    def start(
        self, spawn: Callable[[str, Callable[[], Awaitable[None]]], asyncio.Task[None]]
    ) -> None:
        """Begin beating in the task ``spawn(name, loop)`` starts (the scheduler's
        :meth:`Loops.start <._loops.Loops.start>`)."""
        self._task = spawn("heartbeat", self._run)

    async def stop(self) -> None:
        """Stop beating and remove this instance's record (bounded: on failure the record is
        left for the others to remove after the silent window)."""
        task, self._task = self._task, None
        if task is not None:
            # A driver may turn the cancellation of a call in flight into its own error (nats-py
            # does), which a beat logs and survives: the flag ends the loop, the wait is bounded.
            self._stopping = True
            task.cancel()
            await asyncio.wait([task], timeout=LEAVE_TIMEOUT_S)
            if not task.done():
                task.cancel()
        with contextlib.suppress(AnarchonError, TimeoutError):
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await self.store.remove(self._id)

    async def _run(self) -> None:
        while not self._stopping:
            await self.beat()
            await self._clock.sleep(self.interval_ms / 1000)

    async def beat(self) -> ClusterView | None:
        """Record, clean up, look for drift; None when the registry could not be reached."""
        try:
            await self._refresh()
            now = self.backend_now_ms()
            # Read before writing: a record of this id written since this instance's last
            # write is another process's (see the module's docstring). Then remove: the cutoff
            # depends on the live records' intervals.
            read = await read_instances(self.store, now)
            self._check_shared(read)
            # As stored: with its definitions digest, so the prune below keeps this
            # instance's own set and the view's ranking reads its jobs by digest.
            mine = await record_instance(self.store, self.record(), self._saved)
            self._wrote = True
            records = [r for r in read if r.id != self._id] + [mine]
            cutoff = silent_cutoff(records, now, self.interval_ms)
            removed = await self.store.remove_silent(cutoff)
            dropped = frozenset(removed)
            kept = [r for r in records if r.id not in dropped]
            view = build_view(kept, now)
            self._beats += 1
            if removed or self._beats % PRUNE_EVERY == 1:
                # The sets of every record still stored, live or not yet removed, are kept.
                await self.store.prune_definitions(
                    {r.definitions for r in kept if r.definitions},
                    min(cutoff, now - PRUNE_GRACE_MS),
                )
        except AnarchonError as exc:
            if not self._failing:
                self._failing = True
                logger.warning(
                    "instance %s cannot record itself in the registry (retrying every %d ms): %s",
                    self._id,
                    self.interval_ms,
                    exc,
                    extra=log_fields(Action.REGISTRY_UNAVAILABLE),
                )
            return None
        self.last_beat_ms = self._clock.monotonic_ms()
        if self._failing:
            self._failing = False
            logger.info(
                "instance %s records itself in the registry again",
                self._id,
                extra=log_fields(Action.REGISTRY_RECOVERED),
            )
        for gone in removed:
            logger.info(
                "removed instance %s from the registry: silent for over %d of its heartbeats",
                gone,
                SILENT_HEARTBEATS,
                extra=log_fields(Action.INSTANCE_REMOVED, instance=gone),
            )
        self._warn_drift(view)
        self.instances_seen = len(view.instances)
        if self.on_view is not None:
            self.on_view(view)
        return view

    def _check_shared(self, records: Iterable[InstanceRecord]) -> None:
        """Look for another process's write under this instance's id since its own last one."""
        found = next((r for r in records if r.id == self._id), None)
        other = (
            found
            if self._wrote
            and found is not None
            and found.token is not None
            and found.token != self._first.token
            else None
        )
        if other is None:
            self._alone += 1
            if self.shared_with is not None and self._alone >= SILENT_HEARTBEATS:
                logger.info(
                    "instance %s: no other process records itself under this id any more",
                    self._id,
                    extra=log_fields(Action.INSTANCE_ID_SHARED_ENDED, instance=self._id),
                )
                self.shared_with = None
            return
        self._alone = 0
        process = f"{other.host} pid {other.pid}"
        if process != self.shared_with:
            logger.error(
                "instance id %r is used by two processes: this one (%s pid %d) and %s; they "
                "mix the ownership of their runs: give each process its own instance_id (or "
                "leave it unset: <host>-<pid>-<random>)",
                self._id,
                self._first.host,
                self._first.pid,
                process,
                extra=log_fields(
                    Action.INSTANCE_ID_SHARED,
                    instance=self._id,
                    other_host=other.host,
                    other_pid=other.pid,
                ),
            )
        self.shared_with = process

    def _warn_drift(self, view: ClusterView) -> None:
        for drift in view.drift:
            key = (drift.job, frozenset(d.fingerprint for d, _ in drift.variants))
            if key in self._warned:
                continue
            self._warned.add(key)
            logger.warning(
                "%s; until every instance carries one definition, each instance fires the slots "
                "of its own (both schedules run)",
                drift.describe(),
                extra=log_fields(
                    Action.DEFINITION_DRIFT,
                    drift.job,
                    instances=[list(ids) for _, ids in drift.variants],
                ),
            )
