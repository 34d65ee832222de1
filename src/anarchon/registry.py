"""The registry: which instances run, which jobs they carry, and where their definitions differ.

Every running :class:`~anarchon.Scheduler` records itself in its backend (an
:class:`InstanceRecord` with the :class:`JobDefinition` of each job it carries) every
``heartbeat_ms``, and removes records silent for longer than six heartbeats. Anyone with the
backend's URL can read the picture back as a :class:`ClusterView` (``await
scheduler.cluster()``, ``anarchon instances``, ``anarchon jobs``).

A backend offers the registry through :meth:`anarchon.backend.Backend.registry`, which returns a
:class:`RegistryStore`: one record per instance, written whole, so a reader never sees half of an
instance's jobs. Nothing in the claim path reads or waits on the registry.

Times in the records are epoch milliseconds on the backend's clock as the writing instance
measured it (its wall clock plus its measured clock offset).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._models import Run
    from .backend import Backend
    from .control import Pause

__all__ = [
    "ClusterView",
    "Drift",
    "InstanceRecord",
    "JobDefinition",
    "JobView",
    "RegistryStore",
    "build_view",
    "describe_jobs",
]

#: Instances silent for this many of their heartbeats are removed from the registry.
SILENT_HEARTBEATS: Final = 6
#: Version of the stored document; a reader skips documents of a newer version it cannot read.
RECORD_VERSION: Final = 1

OptionValue = str | int | bool | None
"""The value of one resolved job option."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDefinition:
    """One job as one instance defines it: what must agree across instances.

    ``options`` are the resolved options (defaults filled in), so two instances that spell the
    same default differently still agree.
    """

    name: str
    expression: str
    zone: str
    options: Mapping[str, OptionValue] = field(default_factory=dict)
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        """A stable hash (16 hex digits) of the normalised definition; equal definitions give
        equal fingerprints on every host and Python version. Computed once per object."""
        if self._fingerprint is None:
            text = json.dumps(
                [self.name, " ".join(self.expression.split()), self.zone, dict(self.options)],
                sort_keys=True,
                separators=(",", ":"),
            )
            object.__setattr__(self, "_fingerprint", hashlib.sha256(text.encode()).hexdigest()[:16])
        assert self._fingerprint is not None
        return self._fingerprint

    def describe(self, options: Iterable[str] = ()) -> str:
        """``'*/2 * * * *' in UTC (lease_ms=15000)``, naming only ``options``: for logs and the
        CLI."""
        shown = ", ".join(f"{k}={self.options.get(k)}" for k in sorted(options))
        return f"{self.expression!r} in {self.zone}" + (f" ({shown})" if shown else "")

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape stored in the backend and printed by ``anarchon jobs --json``."""
        return {
            "name": self.name,
            "expression": self.expression,
            "zone": self.zone,
            "options": dict(sorted(self.options.items())),
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobDefinition:
        """Read back what :meth:`to_dict` wrote."""
        return cls(
            name=str(data["name"]),
            expression=str(data["expression"]),
            zone=str(data["zone"]),
            options=dict(data.get("options") or {}),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRecord:
    """One running scheduler as it last recorded itself."""

    id: str
    host: str
    pid: int
    version: str
    started_ms: int
    heartbeat_ms: int
    """When it last recorded itself (backend clock, epoch ms)."""
    interval_ms: int
    """Its ``heartbeat_ms`` option: how often it records itself."""
    clock_offset_ms: int | None
    """The backend's clock minus this instance's, as last measured; None before a measure."""
    jobs: tuple[JobDefinition, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape stored in the backend and printed by ``anarchon instances --json``."""
        return {
            "record_version": RECORD_VERSION,
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_ms": self.started_ms,
            "heartbeat_ms": self.heartbeat_ms,
            "interval_ms": self.interval_ms,
            "clock_offset_ms": self.clock_offset_ms,
            "jobs": [job.to_dict() for job in self.jobs],
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON: the document a store keeps per instance. ``jobs``
        comes last, encoded once per tuple of definitions (a heartbeat keeps its tuple while
        the jobs do not change), so a beat of 10 000 jobs does not encode them again."""
        head = self.to_dict()
        del head["jobs"]
        text = json.dumps(head, separators=(",", ":"), sort_keys=True)
        return f"{text[:-1]},{_JOBS_KEY}{_encoded_jobs(self.jobs)}}}"

    @classmethod
    def from_json(cls, text: str | bytes) -> InstanceRecord | None:
        """Read a stored document; None if it is not one this version can read (a newer
        anarchon's, or damaged): readers skip it rather than fail."""
        try:
            data, jobs = _decoded(text.decode() if isinstance(text, bytes) else text)
            if not isinstance(data, dict) or data.get("record_version") != RECORD_VERSION:
                return None
            offset = data.get("clock_offset_ms")
            return cls(
                id=str(data["id"]),
                host=str(data["host"]),
                pid=int(data["pid"]),
                version=str(data["version"]),
                started_ms=int(data["started_ms"]),
                heartbeat_ms=int(data["heartbeat_ms"]),
                interval_ms=int(data["interval_ms"]),
                clock_offset_ms=None if offset is None else int(offset),
                jobs=jobs,
            )
        except (ValueError, KeyError, TypeError):
            return None


# -- encoding and decoding the jobs of a record once ---------------------------------------------
# A heartbeat writes its instance's record and reads every other's every few seconds; with
# thousands of jobs the definitions are megabytes that rarely change. The jobs' JSON is the last
# member of a record, so a reader splits it off and decodes each distinct text once.

_JOBS_KEY: Final = '"jobs":'
_CACHE_SIZE: Final = 64
_encodings: dict[int, tuple[tuple[JobDefinition, ...], str]] = {}
_decodings: dict[str, tuple[JobDefinition, ...]] = {}


def _encoded_jobs(jobs: tuple[JobDefinition, ...]) -> str:
    """The JSON of ``jobs``, remembered for this very tuple."""
    found = _encodings.get(id(jobs))
    if found is not None and found[0] is jobs:
        return found[1]
    text = json.dumps([job.to_dict() for job in jobs], separators=(",", ":"), sort_keys=True)
    if len(_encodings) >= _CACHE_SIZE:
        _encodings.clear()
    _encodings[id(jobs)] = (jobs, text)  # the tuple is kept, so its id is not reused
    return text


def _decoded(text: str) -> tuple[Any, tuple[JobDefinition, ...]]:
    """The record's other members and its jobs; each distinct jobs text is decoded once."""
    cut = text.rfind("," + _JOBS_KEY)
    if cut > 0 and text.endswith("]}"):
        head, tail = text[:cut] + "}", text[cut + 1 + len(_JOBS_KEY) : -1]
        try:
            data = json.loads(head)
        except ValueError:
            data = None  # the marker stood inside a string: decode the whole text
        if isinstance(data, dict) and "jobs" not in data:
            jobs = _decodings.get(tail)
            if jobs is None:
                jobs = tuple(JobDefinition.from_dict(job) for job in json.loads(tail))
                if len(_decodings) >= _CACHE_SIZE:
                    _decodings.clear()
                _decodings[tail] = jobs
            return data, jobs
    data = json.loads(text)
    jobs_data = data.get("jobs", ()) if isinstance(data, dict) else ()
    return data, tuple(JobDefinition.from_dict(job) for job in jobs_data)


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """A job that instances define differently: each definition with the instances carrying it.

    Until every instance carries one definition, each instance fires the slots of its own
    definition: both schedules run (a slot common to both still runs once).
    """

    job: str
    variants: tuple[tuple[JobDefinition, tuple[str, ...]], ...]

    def describe(self) -> str:
        """One line naming every definition (with the options that differ) and its
        instances."""
        differ = self.differing_options()
        parts = [f"{d.describe(differ)} on {', '.join(ids)}" for d, ids in self.variants]
        return f"job {self.job!r} is defined differently: " + "; ".join(parts)

    def differing_options(self) -> list[str]:
        """The names of the options whose values differ between the definitions."""
        names = {name for d, _ in self.variants for name in d.options}
        return sorted(
            n for n in names if len({repr(d.options.get(n)) for d, _ in self.variants}) > 1
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``anarchon jobs --json``."""
        return {
            "job": self.job,
            "variants": [
                {"definition": d.to_dict(), "instances": list(ids)} for d, ids in self.variants
            ],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """The registry read at one moment: instances, job definitions and drift."""

    now_ms: int
    """When it was read (backend clock as the reader measured it)."""
    instances: tuple[InstanceRecord, ...]
    definitions: Mapping[str, tuple[JobDefinition, ...]]
    """Each job name to its distinct definitions (one unless it drifts), most carried first."""
    drift: tuple[Drift, ...]

    def carriers(self, job: str) -> tuple[str, ...]:
        """The ids of the instances that carry ``job``."""
        return tuple(i.id for i in self.instances if any(j.name == job for j in i.jobs))


def build_view(instances: Sequence[InstanceRecord], now_ms: int) -> ClusterView:
    """Group the instances' definitions by job and find the jobs whose definitions differ."""
    ordered = tuple(sorted(instances, key=lambda i: i.id))
    if len({id(i.jobs) for i in ordered}) == 1:
        # Every instance carries the very same definitions (records whose jobs' text is equal
        # decode to one tuple): nothing can drift, and grouping 10 000 jobs per beat is skipped.
        alike: dict[str, tuple[JobDefinition, ...]] = {
            d.name: (d,) for d in sorted(ordered[0].jobs, key=lambda d: d.name)
        }
        return ClusterView(now_ms=now_ms, instances=ordered, definitions=alike, drift=())
    carried: dict[str, dict[str, tuple[JobDefinition, list[str]]]] = {}
    for instance in ordered:
        for job in instance.jobs:
            variants = carried.setdefault(job.name, {})
            variants.setdefault(job.fingerprint, (job, []))[1].append(instance.id)
    definitions: dict[str, tuple[JobDefinition, ...]] = {}
    drift: list[Drift] = []
    for name in sorted(carried):
        ranked = sorted(carried[name].values(), key=lambda v: (-len(v[1]), v[1]))
        definitions[name] = tuple(d for d, _ in ranked)
        if len(ranked) > 1:
            drift.append(Drift(job=name, variants=tuple((d, tuple(i)) for d, i in ranked)))
    return ClusterView(
        now_ms=now_ms, instances=ordered, definitions=definitions, drift=tuple(drift)
    )


@runtime_checkable
class RegistryStore(Protocol):
    """Where a backend keeps the registry: one document per instance.

    Implementations run on their backend's connection (started by the backend's ``start`` or
    ``start_reader``), create their storage idempotently on the first write, and never create
    anything on a read. They raise :class:`~anarchon.errors.BackendUnavailable` for transient
    faults, like the backend.
    """

    async def record(self, instance: InstanceRecord) -> None:
        """Insert or replace ``instance``'s record, whole (readers never see half of it)."""

    async def instances(self) -> list[InstanceRecord]:
        """Every recorded instance (any order); [] when nothing was ever recorded."""

    async def exists(self) -> bool:
        """True if the registry's storage exists (some instance has recorded itself)."""

    async def remove(self, instance_id: str) -> None:
        """Remove one instance's record (its scheduler stopped); no error if it is absent."""

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """Remove the records whose heartbeat is older than ``cutoff_ms``; return their ids.

        A record refreshed at or after the cutoff is never removed (the check and the removal
        are one step, or the store's documentation says where they are not)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobView:
    """One job as ``anarchon jobs`` shows it: its definition, where it runs and how it went.

    Built from a :class:`ClusterView` and the backend's history by :func:`describe_jobs`.
    """

    name: str
    definition: JobDefinition
    """The definition most instances carry (see :attr:`drift` for the others)."""
    instances: tuple[str, ...]
    """The instances that carry the job."""
    next_slot_ms: int | None
    """The next slot of :attr:`definition` after the view's ``now_ms``."""
    last_run: Run | None
    """The newest finished attempt (succeeded, failed or skipped), if any is recorded."""
    running: tuple[Run, ...]
    """Attempts running now, newest first."""
    drift: Drift | None = None
    paused: bool | None = None
    """True while a pause holds the job (its own or the whole cluster's), False if none does;
    None when the backend keeps no pauses (its ``control()`` is None)."""
    pause: Pause | None = None
    """The pause that holds the job: its own, else the whole cluster's (``job == "*"``)."""


async def describe_jobs(backend: Backend, view: ClusterView, runs: int = 20) -> list[JobView]:
    """One :class:`JobView` per job the view's instances carry, reading up to ``runs`` recent
    attempts of each from ``backend`` (started), and the pauses once."""
    from ._models import Trigger
    from ._schedule import CronSchedule
    from .control import active_pause

    drifts = {d.job: d for d in view.drift}
    control = backend.control()
    pauses = None if control is None else await control.pauses()
    out = []
    for name, definitions in view.definitions.items():
        definition = definitions[0]
        try:
            next_slot: int | None = CronSchedule(definition.expression, definition.zone).next_slot(
                view.now_ms
            )
        except (ValueError, LookupError):  # a definition this version cannot read
            next_slot = None
        history = await backend.history(name, limit=runs)
        running = tuple(r for r in history if not r.status.finished)
        last = next((r for r in history if r.status.finished), None)
        pause = (
            None if pauses is None else active_pause(pauses, name, Trigger.SCHEDULE, view.now_ms)
        )
        out.append(
            JobView(
                name=name,
                definition=definition,
                instances=view.carriers(name),
                next_slot_ms=next_slot,
                last_run=last,
                running=running,
                drift=drifts.get(name),
                paused=None if pauses is None else pause is not None,
                pause=pause,
            )
        )
    return out
