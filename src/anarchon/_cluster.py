"""The cluster as the registry shows it: the live instances, the jobs they carry and where
their definitions differ (:class:`ClusterView`, :class:`Drift`), each job with its next slot and
its recent runs (:class:`JobView`), and the words the commands and the dashboard say when an
action names a job that nobody carries (:func:`carrier_warning`, :func:`trigger_refusal`).

Built from the records of :mod:`anarchon._records`. :mod:`anarchon.registry` re-exports every
name here: import them from there.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from ._records import (
    _CACHE_SIZE,
    InstanceRecord,
    JobDefinition,
    RegistryStore,
    is_live,
    read_instances,
)
from .control import ALL_JOBS

if TYPE_CHECKING:
    from ._models import Run
    from .backend import Backend
    from .control import Pause


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """A job that instances define differently: each definition with the instances carrying it.

    Until every instance carries one definition, each instance fires the slots of its own
    definition: both schedules run (a slot common to both still runs once).
    """

    job: str
    """The job's name."""
    variants: tuple[tuple[JobDefinition, tuple[str, ...]], ...]
    """Each definition of the job with the ids of the live instances carrying it, most carried
    first."""

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
    """The live instances (:func:`is_live` at :attr:`now_ms`), by id."""
    definitions: Mapping[str, tuple[JobDefinition, ...]]
    """Each job name to its distinct definitions (one unless it drifts), most carried first."""
    drift: tuple[Drift, ...]
    """The jobs that live instances define differently, by job name."""
    silent: tuple[InstanceRecord, ...] = ()
    """Records still in the registry that are not live (silent for more than
    :data:`~anarchon.registry.SILENT_HEARTBEATS` of their heartbeats: a process killed, a host
    lost), by id. Their jobs count nowhere in the view; the next live instance's heartbeat
    removes them."""

    def carriers(self, job: str) -> tuple[str, ...]:
        """The ids of the instances that carry ``job``."""
        return tuple(i.id for i in self.instances if _carries(i.jobs, job))


#: What a pause or a run request of a job that no live instance carries does meanwhile.
_UNCARRIED: Final = {
    "pause": "the pause holds once one carries it",
    "trigger": "the request waits until one does",
}


def carrier_warning(view: ClusterView, job: str, action: str) -> str | None:
    """The warning for ``action`` (``pause`` or ``trigger``) on ``job`` when no live instance
    in ``view`` carries it (it works, and waits for one); None when one does, or for every job
    (:data:`~anarchon.control.ALL_JOBS`). The commands and the dashboard say these words."""
    if job == ALL_JOBS or view.carriers(job):
        return None
    return f"no live instance carries job {job!r}: {_UNCARRIED[action]}"


async def trigger_refusal(store: RegistryStore, job: str) -> str | None:
    """Why a manual run of ``job`` is refused: no instance recorded in ``store`` (live, or
    silent but not yet removed) carries it, so a request would wait for ever, and run if a job
    of that name is ever deployed; None when one does. ``anarchon trigger`` and the
    dashboard's Trigger refuse with these words unless forced (``--force``; the dashboard's
    ``force=1``, its "Trigger anyway")."""
    names = {j.name for record in await read_instances(store) for j in record.jobs}
    if job in names:
        return None
    close = difflib.get_close_matches(job, names, n=3)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return (
        f"no instance in the registry carries job {job!r}{hint}: a request is stored only for "
        "a job that a live or recently stopped instance defines (else it waits until one is "
        "deployed)"
    )


_names: dict[int, tuple[tuple[JobDefinition, ...], frozenset[str]]] = {}


def _carries(jobs: tuple[JobDefinition, ...], name: str) -> bool:
    """Whether ``jobs`` has a job named ``name``; the names are gathered once per tuple."""
    found = _names.get(id(jobs))
    if found is None or found[0] is not jobs:
        if len(_names) >= _CACHE_SIZE:
            _names.clear()
        found = _names[id(jobs)] = (jobs, frozenset(j.name for j in jobs))
    return name in found[1]


def split_live(
    instances: Iterable[InstanceRecord], now_ms: int
) -> tuple[tuple[InstanceRecord, ...], tuple[InstanceRecord, ...]]:
    """The live records (:func:`is_live` at ``now_ms``) and the silent ones, each by id."""
    ordered = sorted(instances, key=lambda i: i.id)
    live = tuple(i for i in ordered if is_live(i, now_ms))
    if len(live) == len(ordered):
        return live, ()
    return live, tuple(i for i in ordered if not is_live(i, now_ms))


def build_view(instances: Sequence[InstanceRecord], now_ms: int) -> ClusterView:
    """Group the live instances' definitions by job and find the jobs whose definitions differ;
    records that are not live at ``now_ms`` (:func:`is_live`) go to :attr:`ClusterView.silent`
    and count nowhere else."""
    ordered, silent = split_live(instances, now_ms)
    if len({id(i.jobs) for i in ordered}) == 1:
        # Every instance carries the very same definitions (records whose jobs' text is equal
        # decode to one tuple): nothing can drift, and grouping 10 000 jobs per beat is skipped.
        return ClusterView(
            now_ms=now_ms,
            instances=ordered,
            definitions=_alike(ordered[0].jobs),
            drift=(),
            silent=silent,
        )
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
        now_ms=now_ms,
        instances=ordered,
        definitions=definitions,
        drift=tuple(drift),
        silent=silent,
    )


_views: dict[int, tuple[tuple[JobDefinition, ...], Mapping[str, tuple[JobDefinition, ...]]]] = {}


class _Alike(Mapping[str, tuple[JobDefinition, ...]]):
    """Each job of one definitions set to its one definition, by name (read-only), built on
    first use: a scheduler's heartbeat reads its views for their instances, and the mapping of
    100 000 jobs took 0.2 s of its event loop at every new set."""

    __slots__ = ("_built", "_jobs")

    def __init__(self, jobs: tuple[JobDefinition, ...]) -> None:
        self._jobs = jobs
        self._built: MappingProxyType[str, tuple[JobDefinition, ...]] | None = None

    def _mapping(self) -> Mapping[str, tuple[JobDefinition, ...]]:
        """The mapping itself, built on the first call."""
        if self._built is None:
            ordered = sorted(self._jobs, key=lambda d: d.name)
            self._built = MappingProxyType({d.name: (d,) for d in ordered})
        return self._built

    def __getitem__(self, name: str) -> tuple[JobDefinition, ...]:
        return self._mapping()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())

    def __repr__(self) -> str:
        return repr(dict(self._mapping()))


def _alike(jobs: tuple[JobDefinition, ...]) -> Mapping[str, tuple[JobDefinition, ...]]:
    """Each job of ``jobs`` to its one definition, by name: built once per tuple (read-only)."""
    found = _views.get(id(jobs))
    if found is not None and found[0] is jobs:
        return found[1]
    alike = _Alike(jobs)
    if len(_views) >= 8:
        _views.clear()
    _views[id(jobs)] = (jobs, alike)  # the tuple is kept, so its id is not reused
    return alike


@dataclass(frozen=True, slots=True, kw_only=True)
class JobView:
    """One job as ``anarchon jobs`` shows it: its definition, where it runs and how it went.

    Built from a :class:`ClusterView` and the backend's history by :func:`describe_jobs`.
    """

    name: str
    """The job's name."""
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
    """How the instances' definitions differ, when they do; None when they agree."""
    paused: bool | None = None
    """True while a pause holds the job (its own or the whole cluster's), False if none does;
    None when the backend keeps no pauses (its ``control()`` is None)."""
    pause: Pause | None = None
    """The pause that holds the job: its own, else the whole cluster's (``job == "*"``)."""


#: History reads in flight at once in the default ``Backend.histories`` (one job a call, for a
#: backend that has no batch read of its own): enough that the reads' round trips
#: overlap (one after another, 3 000 jobs waited for 3 000 in turn), few enough that a backend's
#: connection pool is not handed thousands of calls at once.
DESCRIBE_READS: Final = 32

#: Jobs per :meth:`~anarchon.backend.Backend.histories` call of :func:`describe_jobs`: a whole
#: cluster of thousands of jobs in one call (a statement, a pipeline, a read of the stream), and
#: no call's answer growing without bound with the cluster.
DESCRIBE_BATCH: Final = 10_000


#: How many of a job's newest records ``anarchon jobs`` and the dashboard's jobs page read its
#: last run and the attempts running now from (:func:`latest_runs`): an attempt recorded
#: ``running`` further back (one a stopped instance left, until its lease is taken over) shows in
#: neither.
RECENT_RUNS: Final = 20


def latest_runs(
    history: Sequence[Run], window: int = RECENT_RUNS
) -> tuple[Run | None, tuple[Run, ...]]:
    """The newest finished attempt (None if none) and the attempts running now, newest first,
    among the ``window`` newest of ``history`` (newest first, as
    :meth:`~anarchon.backend.Backend.history` gives it)."""
    recent = history[:window]
    last = next((r for r in recent if r.status.finished), None)
    return last, tuple(r for r in recent if not r.status.finished)


async def _histories(backend: Backend, names: Sequence[str], runs: int) -> list[list[Run]]:
    """Up to ``runs`` recent attempts of each of ``names``, in their order: one
    :meth:`~anarchon.backend.Backend.histories` call per :data:`DESCRIBE_BATCH` jobs; its
    error is raised."""
    found: dict[str, list[Run]] = {}
    for at in range(0, len(names), DESCRIBE_BATCH):
        found.update(await backend.histories(names[at : at + DESCRIBE_BATCH], runs))
    return [found.get(name, []) for name in names]


async def describe_jobs(
    backend: Backend, view: ClusterView, runs: int = RECENT_RUNS
) -> list[JobView]:
    """One :class:`JobView` per job the view's instances carry, reading up to ``runs`` recent
    attempts of each from ``backend`` (started; :meth:`~anarchon.backend.Backend.histories`,
    :data:`DESCRIBE_BATCH` jobs a call), and the pauses once."""
    from ._models import Trigger
    from ._schedule import CronSchedule
    from .control import active_pause

    drifts = {d.job: d for d in view.drift}
    control = backend.control()
    pauses = None if control is None else await control.pauses()
    histories = await _histories(backend, list(view.definitions), runs)
    out = []
    for (name, definitions), history in zip(view.definitions.items(), histories, strict=True):
        definition = definitions[0]
        try:
            next_slot: int | None = CronSchedule(definition.expression, definition.zone).next_slot(
                view.now_ms
            )
        except (ValueError, LookupError):  # a definition this version cannot read
            next_slot = None
        last, running = latest_runs(history, runs)
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
