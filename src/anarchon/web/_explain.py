"""One slot's fate for the dashboard's explanation panel, behind one function (:func:`explain`).

It asks :func:`anarchon.explain.explain` (as ``anarchon explain`` does), and reads the history
itself only for a job no live instance carries any more (no definition to judge the slot by).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Final

from .._models import Run, RunStatus
from .._readable import iso_exact, iso_local
from .._redact import redact_url
from .._schedule import CronSchedule
from ..backend import Backend
from ..errors import JobNotFound
from ..explain import Fate, SlotFate, nearest_slots
from ..explain import explain as official_explain
from ..registry import JobDefinition
from ._data import Snapshot, fate_of, run_dict, skip_fate

__all__ = ["EXPLAIN_RUNS", "SlotStory", "explain", "unknown_job"]

#: Runs of the job read to find one slot's attempts.
EXPLAIN_RUNS: Final = 10_000


@dataclass(frozen=True, slots=True)
class SlotStory:
    """What became of one slot: a ``kind``, one sentence, the attempts (oldest first) and
    what else helps (the nearest slots, the instances that carry the job)."""

    job: str
    slot_ms: int
    kind: str
    """``not-a-slot``, ``future``, ``succeeded``, ``failed``, ``running``, ``skipped``,
    ``paused``, ``late``, ``missed``, ``no-record`` or ``unread``."""
    summary: str
    attempts: list[Run] = field(default_factory=list)
    previous_ms: int | None = None
    next_ms: int | None = None
    carriers: tuple[str, ...] = ()
    definition: JobDefinition | None = None

    @property
    def local(self) -> str | None:
        """The slot in the job's zone with its offset (``2026-03-29T04:30:00+03:00``), as
        `anarchon explain` shows it and a slot address reads it back; None when the zone is
        UTC or unknown."""
        return None if self.definition is None else iso_local(self.slot_ms, self.definition.zone)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``/jobs/<name>/slots/<ms>?format=json``."""
        return {
            "job": self.job,
            "slot_ms": self.slot_ms,
            "slot": iso_exact(self.slot_ms),
            "slot_local": self.local,
            "kind": self.kind,
            "summary": redact_url(self.summary),
            "attempts": [run_dict(r) for r in self.attempts],
            "previous_slot_ms": self.previous_ms,
            "next_slot_ms": self.next_ms,
            "carriers": list(self.carriers),
        }

    def describe(self) -> str:
        """The summary and one line per attempt."""
        lines = [self.summary]
        for run in self.attempts:
            took = "" if run.duration is None else f" in {run.duration:.3f} s"
            tail = run.error or run.reason or ""
            lines.append(
                f"  attempt {run.attempt} on {run.instance} (fence {run.fence}): "
                f"{run.status.value}{took}" + (f": {tail.splitlines()[-1]}" if tail else "")
            )
        return redact_url("\n".join(lines))


def unknown_job(job: str) -> JobNotFound:
    """The error of every page about a job the dashboard knows nothing of (404): no live
    instance carries it and it has no history."""
    return JobNotFound(f"no live instance carries a job named {job!r} and it has no history")


def _summary(job: str, when: str, attempts: list[Run]) -> tuple[str, str]:
    """The :attr:`SlotStory.kind` and the sentence of ``job``'s slot at ``when``, told from
    its records alone: ``attempts``, oldest first (the last tells how it ended)."""
    last = attempts[-1]
    kind = fate_of(last)
    where = f"on {last.instance}"
    tries = f" after {len(attempts)} attempts" if len(attempts) > 1 else ""
    if last.status is RunStatus.SUCCEEDED:
        took = "" if last.duration is None else f", took {last.duration:.3f} s"
        return kind, f"{job} at {when} ran {where} and succeeded{tries}{took}."
    if last.status is RunStatus.FAILED:
        cause = (last.error or last.reason or "no error recorded").strip().splitlines()[-1]
        return kind, f"{job} at {when} ran {where} and failed{tries}: {cause}"
    if last.status is RunStatus.RUNNING:
        return kind, f"{job} at {when} is running {where} (attempt {last.attempt})."
    if last.status is RunStatus.MISSED:
        return kind, f"{job} at {when} was missed: {last.reason or 'no instance ran it'}."
    return kind, f"{job} at {when} was skipped: {last.reason or 'no reason recorded'}."


def _kind(fate: SlotFate) -> str:
    """The :attr:`SlotStory.kind` of ``fate``: its outcome for a slot that ran, the fate of
    its skip (:func:`skip_fate`) for one skipped, else the fate's own name."""
    if fate.fate is Fate.RAN:
        return fate.outcome.value if fate.outcome is not None else "succeeded"
    if fate.fate is Fate.SKIPPED:
        return skip_fate(fate.skip_cause)
    return fate.fate.value


async def explain(backend: Backend, snapshot: Snapshot, job: str, slot_ms: int) -> SlotStory:
    """What became of ``job``'s slot ``slot_ms``: :func:`anarchon.explain.explain`'s answer.
    :func:`unknown_job` when no live instance carries the job and it has no history."""
    try:
        fate = await official_explain(
            backend, job, slot_ms, view=snapshot.view, now_ms=snapshot.now_ms, limit=EXPLAIN_RUNS
        )
    except JobNotFound:
        return await _from_history(backend, snapshot, job, slot_ms)
    before, after = fate.previous_slot_ms, fate.next_slot_ms
    if before is None and after is None:
        with contextlib.suppress(ValueError, LookupError):
            schedule = CronSchedule(fate.definition.expression, fate.definition.zone)
            before, after = nearest_slots(schedule, slot_ms)
    summary = " ".join(
        [fate.headline() + "."]
        + ([f"Reason: {fate.reason}."] if fate.reason else [])
        + [f"Note: {note}" for note in fate.notes]
    )
    return SlotStory(
        job=job,
        slot_ms=slot_ms,
        kind=_kind(fate),
        summary=summary,
        attempts=[a.record for a in fate.attempts],
        previous_ms=before,
        next_ms=after,
        carriers=snapshot.view.carriers(job),
        definition=fate.definition,
    )


async def _from_history(backend: Backend, snapshot: Snapshot, job: str, slot_ms: int) -> SlotStory:
    """The slot's records alone, for a job no live instance carries: with no definition (the
    registry holds none when no instance carries the job), no schedule tells slots apart."""
    when = iso_exact(slot_ms)
    runs = await backend.history(job, EXPLAIN_RUNS)
    if not runs:
        raise unknown_job(job)
    attempts = sorted(
        (r for r in runs if r.slot_ms == slot_ms), key=lambda r: (r.attempt, r.started_at)
    )
    if attempts:
        kind, text = _summary(job, when, attempts)
        return SlotStory(job, slot_ms, kind, text, attempts)
    if slot_ms > snapshot.now_ms:
        text = f"{job} at {when} is in the future; carried by: no instance carries it now."
        return SlotStory(job, slot_ms, "future", text)
    oldest = min((r.slot_ms for r in runs if r.slot_ms is not None), default=None)
    if len(runs) >= EXPLAIN_RUNS and oldest is not None and slot_ms < oldest:
        text = (
            f"{job} at {when} is older than the {EXPLAIN_RUNS} newest records read "
            f"(oldest slot read: {iso_exact(oldest)})."
        )
        return SlotStory(job, slot_ms, "unread", text)
    text = (
        f"{job} at {when}: no record. No instance claimed it (none carried the job then, or "
        "it came after the job's history was pruned); slots nobody ran are recorded 'missed' "
        "when instances come back."
    )
    return SlotStory(job, slot_ms, "no-record", text)
