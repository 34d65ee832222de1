"""The registry's records and how they are stored: a job's definition (:class:`JobDefinition`),
an instance's record (:class:`InstanceRecord`) and the rule that tells a live one
(:func:`is_live`), the definitions sets saved once per digest (:func:`encode_definitions`,
:func:`record_instance`, :func:`read_instances`), and the store a backend offers
(:class:`RegistryStore`).

:mod:`anarchon.registry` re-exports every name here, with the cluster's views built from these
records (:mod:`anarchon._cluster`): import them from there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from .logs import Action, log_fields

logger = logging.getLogger("anarchon.scheduler")

#: A record not refreshed for this many of its own heartbeat intervals is not live
#: (:func:`is_live`), and is removed from the registry by the next live instance's heartbeat.
SILENT_HEARTBEATS: Final = 6
#: Version of the stored document; a reader skips documents of a newer version it cannot read.
RECORD_VERSION: Final = 2
#: The versions this one reads: 1 kept the definitions inline, 2 names them by digest.
READABLE_VERSIONS: Final = (1, 2)

OptionValue: TypeAlias = str | int | bool | None
"""The value of one resolved job option (:attr:`JobDefinition.options`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDefinition:
    """One job as one instance defines it: what must agree across instances.

    ``options`` are the resolved options (defaults filled in), so two instances that spell the
    same default differently still agree.
    """

    name: str
    """The job's name."""
    expression: str
    """The job's cron expression, as given."""
    zone: str
    """The IANA name of the time zone the schedule is read in."""
    options: Mapping[str, OptionValue] = field(default_factory=dict)
    """The job's resolved options by name, defaults filled in."""
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
    """The instance's id (``instance_id``)."""
    host: str
    """The host name it runs on."""
    pid: int
    """Its process id on that host."""
    version: str
    """The anarchon version it runs."""
    started_ms: int
    """When it started, on the backend's clock as it measured it (epoch ms)."""
    heartbeat_ms: int
    """When it last recorded itself (backend clock, epoch ms)."""
    interval_ms: int
    """Its ``heartbeat_ms`` option: how often it records itself."""
    clock_offset_ms: int | None
    """The backend's clock minus this instance's, as last measured; None before a measure."""
    jobs: tuple[JobDefinition, ...] = ()
    """The definitions of the jobs it carries, sorted by name. Empty in a record read from a
    store until :func:`read_instances` resolves its :attr:`definitions` (and when nobody saved
    them: then :attr:`job_count` still says how many it carries)."""
    definitions: str | None = None
    """The sha256 digest of its definitions set as stored (None in a version 1 record, or one
    built in memory; :meth:`to_json` computes it from :attr:`jobs`)."""
    job_count: int | None = None
    """How many jobs it carries, as recorded (None in a record built in memory: ``len(jobs)``)."""
    token: str | None = None
    """A random token drawn by the scheduler's heartbeat when it starts (None in a record of an
    older anarchon): a record that comes back with another token than the one its instance
    wrote was written by another process under the same id."""
    shared_with: str | None = None
    """Set while the instance finds another process recording itself under its id: that
    process, as ``host pid N``. Two processes with one ``instance_id`` mix their runs'
    ownership (see ``docs/operations.md``); ``anarchon instances`` and ``anarchon health``
    show it."""

    @property
    def carried(self) -> int:
        """How many jobs it carries: :attr:`job_count` if recorded, else ``len(jobs)``."""
        return len(self.jobs) if self.job_count is None else self.job_count

    def _head(self) -> dict[str, Any]:
        """The stored record's members: the instance's fields, its digest and job count."""
        digest = self.definitions
        if digest is None or self.jobs:
            digest = encode_definitions(self.jobs)[0]
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
            "definitions": digest,
            "job_count": len(self.jobs) if self.jobs else self.carried,
            "token": self.token,
            "shared_with": self.shared_with,
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``anarchon instances --json``: the stored record
        (:meth:`to_json`) with its resolved ``jobs``."""
        return {**self._head(), "jobs": [job.to_dict() for job in self.jobs]}

    def to_json(self) -> str:
        """The document a store keeps per instance (version 2): compact JSON of the instance's
        fields, its ``job_count`` and its ``definitions`` digest, without the definitions."""
        return json.dumps(self._head(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> InstanceRecord | None:
        """Read a stored document; None if it is not one this version can read (a newer
        anarchon's, or damaged): readers skip it rather than fail. A version 2 record comes
        back with its digest and no ``jobs``: :func:`read_instances` resolves them."""
        try:
            data, jobs = _decoded(text.decode() if isinstance(text, bytes) else text)
            if not isinstance(data, dict) or data.get("record_version") not in READABLE_VERSIONS:
                return None
            offset = data.get("clock_offset_ms")
            digest, count = data.get("definitions"), data.get("job_count")
            token, shared = data.get("token"), data.get("shared_with")
            if data["record_version"] == 2 and not isinstance(digest, str):
                return None
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
                definitions=None if digest is None else str(digest),
                job_count=None if count is None else int(count),
                token=None if token is None else str(token),
                shared_with=None if shared is None else str(shared),
            )
        except (ValueError, KeyError, TypeError):
            return None


def is_live(record: InstanceRecord, now_ms: int) -> bool:
    """True if ``record`` was refreshed within :data:`SILENT_HEARTBEATS` of its own heartbeat
    intervals before ``now_ms`` (backend clock, epoch ms): the one rule by which every view,
    command and page tells a live instance from one that died without removing its record.

    A record at exactly the limit is live: a heartbeat removes only records older than it."""
    return now_ms - record.heartbeat_ms <= SILENT_HEARTBEATS * record.interval_ms


# -- definition sets: encoded, saved and decoded once per digest ----------------------------------
# A heartbeat writes its instance's record and reads every other's every few seconds; with
# 100 000 jobs the definitions are tens of megabytes that rarely change. A record names them by
# digest; the set itself is encoded once per tuple of definitions (a heartbeat keeps its tuple
# while the jobs do not change), uploaded once per digest and store (each caller's first record
# of a digest only moves the saved time of a set the store has), and decoded once per digest.

_JOBS_KEY: Final = '"jobs":'
_CACHE_SIZE: Final = 64
#: How often (s) a store is asked again whether a set this process saved is still there (a
#: pruned or wiped set is saved again within this time).
RECHECK_S: Final = 60.0
_encodings: dict[int, tuple[tuple[JobDefinition, ...], str, bytes]] = {}
_decodings: dict[str, tuple[JobDefinition, ...]] = {}
_missing_logged: set[tuple[str, str]] = set()


def encode_definitions(jobs: tuple[JobDefinition, ...]) -> tuple[str, bytes]:
    """The digest and the stored bytes of the definitions set ``jobs``: zlib-compressed JSON,
    ``{"options": [each distinct options object], "jobs": [[name, expression, zone, index of
    its options], ...]}`` (100 000 jobs on a few option sets take about 250 kB).

    The digest is the sha256 of the uncompressed JSON, so equal sets give equal digests on
    every host. Remembered for this very tuple; the set is also remembered as decoded."""
    found = _encodings.get(id(jobs))
    if found is not None and found[0] is jobs:
        return found[1], found[2]
    options: dict[tuple[tuple[str, OptionValue], ...], int] = {}
    # Jobs with equal options usually share one dict of them (definition_of): sorted once.
    indexes: dict[int, int] = {}
    rows = []
    for job in jobs:
        index = indexes.get(id(job.options))
        if index is None:
            key = tuple(sorted(job.options.items()))
            index = indexes[id(job.options)] = options.setdefault(key, len(options))
        rows.append((job.name, job.expression, job.zone, index))
    document = {"options": [dict(key) for key in options], "jobs": rows}
    text = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    digest = hashlib.sha256(text).hexdigest()
    data = zlib.compress(text, 6)
    if len(_encodings) >= _CACHE_SIZE:
        _encodings.clear()
    _encodings[id(jobs)] = (jobs, digest, data)  # the tuple is kept, so its id is not reused
    _remember(digest, jobs)
    return digest, data


def decode_definitions(data: bytes) -> tuple[JobDefinition, ...]:
    """Read back what :func:`encode_definitions` stored; ValueError if it is damaged. Jobs
    with equal options share one dict of them."""
    try:
        document = json.loads(zlib.decompress(data))
    except zlib.error as exc:
        raise ValueError(f"a definitions set is damaged: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("a definitions set must be a JSON object")
    shared: list[dict[str, OptionValue]] = [dict(o) for o in document["options"]]
    return tuple(
        JobDefinition(
            name=str(name), expression=str(expression), zone=str(zone), options=shared[index]
        )
        for name, expression, zone, index in document["jobs"]
    )


async def _encoded(jobs: tuple[JobDefinition, ...]) -> tuple[str, bytes]:
    """:func:`encode_definitions`, in a thread unless this tuple was encoded already (the
    event loop that claims slots must not wait a second on 100 000 definitions)."""
    found = _encodings.get(id(jobs))
    if found is not None and found[0] is jobs:
        return found[1], found[2]
    return await asyncio.to_thread(encode_definitions, jobs)


def _remember(digest: str, jobs: tuple[JobDefinition, ...]) -> None:
    """Keep ``jobs`` as the decoded set of ``digest`` (a bounded cache: cleared when full)."""
    if len(_decodings) >= _CACHE_SIZE:
        _decodings.clear()
    _decodings[digest] = jobs


async def record_instance(
    store: RegistryStore, instance: InstanceRecord, saved: dict[str, float] | None = None
) -> InstanceRecord:
    """Record ``instance`` in ``store``: its definitions set first, then the record naming it,
    so a reader never finds a digest before its set. Returns the record as stored: ``instance``
    with its ``definitions`` digest and ``job_count`` stamped (its ``jobs`` kept), which is what
    a reader of the store sees, its definitions resolved.

    ``saved`` remembers, digest to :func:`time.monotonic`, when this caller last saved or found
    its set in the store: a heartbeat passes the same dict each beat. The first record of a
    digest touches the set (:meth:`RegistryStore.touch_definitions`: its saved time moves,
    its bytes are not sent again) and saves it only if the store does not have it; later the
    set is looked for once per :data:`RECHECK_S` and uploaded only when it is missing.

    Why the first record must move the saved time: a set that is kept but old and named by no
    live record (a rollback to earlier jobs, say) may be pruned by another instance's beat
    whose records were read just before this record, so that read does not name the set. The
    prune decides each set in one atomic step, by its saved time against a cutoff at least a
    minute back (:meth:`RegistryStore.prune_definitions`), and the touch is one atomic step
    too, so one comes first. If the touch does, the set's saved time is now and the prune
    keeps it; if the prune does, the touch finds no set, and the set is saved (as new, saved
    now) before the record. Either way the record never names a set removed under it: exactly
    what saving the set first gave, without uploading tens of megabytes (100 000 jobs) at
    every instance's start. A store without ``touch_definitions`` (written for an earlier
    :class:`RegistryStore`) has its set saved, as before."""
    digest, data = await _encoded(instance.jobs)
    now = time.monotonic()
    known = saved if saved is not None else {}
    checked = known.get(digest)
    if checked is None or now - checked >= RECHECK_S:
        if checked is None:
            # getattr: a store written for an earlier RegistryStore may lack it (then: save).
            touch = getattr(store, "touch_definitions", None)
            found = touch is not None and await touch(digest, instance.heartbeat_ms)
        else:
            found = await store.has_definitions(digest)
        if not found:
            await store.save_definitions(digest, data, instance.heartbeat_ms)
        known.clear()
        known[digest] = now
    if instance.definitions != digest or instance.job_count != len(instance.jobs):
        instance = replace(instance, definitions=digest, job_count=len(instance.jobs))
    await store.record(instance)
    return instance


async def read_instances(store: RegistryStore, now_ms: int | None = None) -> list[InstanceRecord]:
    """Every recorded instance, each with its ``jobs`` resolved from its definitions set.

    With ``now_ms`` (backend clock), only the live records (:func:`is_live`) have their sets
    resolved: the others come back as stored (no ``jobs`` in a version 2 record), since views
    leave them out, and a dead instance's set is neither read nor missed.

    A set is read from the store once per digest and process. A record naming a set nobody
    saved (or a damaged one) comes back with no ``jobs`` (its ``job_count`` still tells how many
    it carries), and a WARNING (action ``definitions_missing``) is logged once per instance and
    digest."""
    out: list[InstanceRecord] = []
    for record in await store.instances():
        digest = record.definitions
        if digest is None or record.jobs or (now_ms is not None and not is_live(record, now_ms)):
            out.append(record)  # version 1: the definitions inline
            continue
        jobs = _decodings.get(digest)
        if jobs is None:
            data = await store.definitions(digest)
            try:
                # In a thread: 100 000 definitions take a second or more to decode, and the
                # event loop that claims slots must not wait on them.
                jobs = None if data is None else await asyncio.to_thread(decode_definitions, data)
            except (ValueError, KeyError, TypeError, AttributeError, IndexError):
                jobs = None
            if jobs is not None:
                _remember(digest, jobs)
        if jobs is None:
            if (record.id, digest) not in _missing_logged:
                if len(_missing_logged) >= 1024:
                    _missing_logged.clear()
                _missing_logged.add((record.id, digest))
                logger.warning(
                    "instance %s names the definitions set %s of its %d jobs, which is not in "
                    "the registry (not saved yet, or pruned); its jobs are left out of the "
                    "cluster view until it saves them again (within %g s)",
                    record.id,
                    digest[:16],
                    record.carried,
                    RECHECK_S,
                    extra=log_fields(Action.DEFINITIONS_MISSING, instance=record.id),
                )
            out.append(record)
            continue
        out.append(replace(record, jobs=jobs))
    return out


def _decoded(text: str) -> tuple[Any, tuple[JobDefinition, ...]]:
    """The record's other members and its jobs (a version 1 record's); each distinct jobs text
    is decoded once."""
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
                _remember(tail, jobs)
            return data, jobs
    data = json.loads(text)
    jobs_data = data.get("jobs", ()) if isinstance(data, dict) else ()
    return data, tuple(JobDefinition.from_dict(job) for job in jobs_data)


@runtime_checkable
class RegistryStore(Protocol):
    """Where a backend keeps the registry: one document per instance, and definitions sets as
    opaque bytes under their digest (:func:`record_instance` and :func:`read_instances` do the
    rest).

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

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """Keep ``data`` (one definitions set) under ``digest``, and ``saved_ms`` (backend clock,
        epoch ms) as when it was last saved. Saving a digest that is already kept only moves
        its saved time (the data of a digest never changes). A reader never sees part of a set:
        :meth:`definitions` gives the whole of it or None."""

    async def definitions(self, digest: str) -> bytes | None:
        """The set saved under ``digest``, or None if there is none."""

    async def has_definitions(self, digest: str) -> bool:
        """True if a set is saved under ``digest`` (without reading it)."""

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """If a set is saved under ``digest``, move its saved time to ``saved_ms`` (unless it
        is later already) and answer True; else change nothing and answer False. One atomic
        step against :meth:`prune_definitions` (it must never answer True for a set that a
        prune removes at the same time), and without sending the set's bytes: an instance's
        first record of a digest touches the set and saves it only when this answers False
        (:func:`record_instance` says why the saved time must move).

        This default answers False, so the set is saved, as before this method existed: a
        store that subclasses :class:`RegistryStore` without implementing it still works,
        and so does one written for the earlier protocol (:func:`record_instance` saves when
        the store has no ``touch_definitions``)."""
        return False

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """Remove the sets saved before ``cutoff_ms`` whose digest is not in ``keep`` (the
        digests the live records name); return their digests. A set saved at or after the
        cutoff is kept: an instance saves (or touches) its set before the record that names
        it. Each set is decided in one atomic step, by its saved time then (a set touched or
        saved again since ``keep`` was read is kept)."""
