"""The counts of the fault suite, computed from the workers' records and the backend's history.

Pure functions: tests/chaos/test_measure.py feeds them made-up records to show each count can
fail. The definitions (docs/guarantees.md, "The fault suite", says the same in prose):

* **attempt**: one start of a handler for ``(job, slot)``, named by its run id. A **step** is a
  unit of work the handler begins after ``ctx.check_lease()`` passed (handlers that never check
  the lease begin steps regardless); it spans from its start until it ended, was cut short
  (cancelled) or the process died, and never longer than the step's planned length (a process
  frozen mid-step does no work while frozen). An attempt **completed** when its handler ran to
  its own end: it returned, or raised or exited on its own (not cancelled, not stopped by
  ``LeaseLost``, not killed).
* **duplicate start**: a later attempt B of a slot that duplicates an earlier attempt A: A began
  a step after B had begun (A worked on without knowing it lost), or A completed before B began
  and B completed too (the slot ran to completion twice), or (lease backends) B has A's attempt
  number (two winners of one claim). An A that only finishes a step it began before B (it was
  frozen mid-step) is not a duplicate by itself; if that step overlaps B's, it is a concurrent
  execution. On a broker every start of a slot after its first is a duplicate (no takeovers).
* **concurrent execution**: a pair of attempts of one slot with steps overlapping in time.
* **missed**: an expected slot (one every instance should have served in the trial's window) that
  no attempt completed: skipped for overlap, too late, never claimed, or only cut-short attempts.
* **stale result accepted**: a slot whose recorded outcome came from a superseded attempt: the
  backend's history keeps a handler result (``succeeded``, or ``failed`` by the handler) for an
  attempt below the slot's last, or a worker saw a result accepted for attempt n after attempt
  n + 1 had started. Brokers have no attempts: not applicable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ACCEPTED = ("run_succeeded", "run_failed")
INF = float("inf")


@dataclass
class Attempt:
    """One attempt as the records tell it."""

    job: str
    slot: int
    run_id: str
    attempt: int
    instance: str
    pid: int
    start: float
    steps: list[tuple[float, float]] = field(default_factory=list)
    completed: bool = False
    ended: float | None = None
    outcome: str | None = None

    @property
    def first_activity(self) -> float:
        return self.steps[0][0] if self.steps else self.start


@dataclass
class Counts:
    """The counts of one trial (or, summed, of many)."""

    trials: int = 0
    slots: int = 0
    duplicates: int = 0
    concurrent: int = 0
    missed: int = 0
    stale: int | None = 0
    stuck: int = 0
    errors: int = 0
    notes: Counter[str] = field(default_factory=Counter)
    sigterm_exits: list[float] = field(default_factory=list)
    """Seconds from SIGTERM to the process's exit, for each that exited in time."""

    def add(self, other: Counts) -> None:
        self.trials += other.trials
        self.slots += other.slots
        self.duplicates += other.duplicates
        self.concurrent += other.concurrent
        self.missed += other.missed
        self.stale = None if self.stale is None or other.stale is None else self.stale + other.stale
        self.stuck += other.stuck
        self.errors += other.errors
        self.notes.update(other.notes)
        self.sigterm_exits.extend(other.sigterm_exits)

    def to_json(self) -> dict[str, Any]:
        """The counts as plain JSON data (see :meth:`from_json`)."""
        return {**asdict(self), "notes": dict(self.notes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Counts:
        return cls(**{**data, "notes": Counter(data.get("notes", {}))})

    def failures(self, broker: bool) -> list[str]:
        """The counts that miss their target (0): all of them on a lease backend; on a broker
        duplicates, concurrent executions and trials that could not run."""
        wanted = {"duplicate starts": self.duplicates, "concurrent executions": self.concurrent}
        if not broker:
            wanted |= {
                "missed": self.missed,
                "stale results accepted": self.stale or 0,
                "stuck stops": self.stuck,
            }
        wanted["trials in error"] = self.errors
        return [f"{name}: {n}" for name, n in wanted.items() if n]


def attempts_of(
    records: Iterable[Mapping[str, Any]], deaths: Mapping[int, float]
) -> dict[tuple[str, int], list[Attempt]]:
    """Group the handler records into attempts per ``(job, slot)``, oldest start first.

    ``deaths``: pid to the monotonic time its process died (killed or exited), if it did.
    """
    by_run: dict[str, Attempt] = {}
    begun: dict[tuple[str, int], tuple[float, float]] = {}
    ended: dict[tuple[str, int], float] = {}
    for r in sorted(records, key=lambda r: float(r["mono"])):
        event = r.get("event")
        if event == "log" or r.get("slot") is None or "run_id" not in r:
            continue
        run_id = r["run_id"]
        if event == "start":
            by_run[run_id] = Attempt(
                job=r["job"],
                slot=int(r["slot"]),
                run_id=run_id,
                attempt=int(r["attempt"]),
                instance=r["instance"],
                pid=int(r["pid"]),
                start=float(r["mono"]),
            )
        elif event == "step":
            begun[(run_id, int(r["i"]))] = (float(r["mono"]), float(r["ms"]) / 1000)
        elif event == "step_end":
            ended[(run_id, int(r["i"]))] = float(r["mono"])
        elif event == "end" and run_id in by_run:
            by_run[run_id].completed = True
            by_run[run_id].ended = float(r["mono"])
            by_run[run_id].outcome = r.get("outcome")
    for (run_id, i), (begin, planned) in sorted(begun.items(), key=lambda kv: kv[1][0]):
        attempt = by_run.get(run_id)
        if attempt is None:
            continue
        end = min(ended.get((run_id, i), INF), begin + planned, deaths.get(attempt.pid, INF))
        attempt.steps.append((begin, max(begin, end)))
    out: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
    for attempt in by_run.values():
        out[(attempt.job, attempt.slot)].append(attempt)
    for group in out.values():
        group.sort(key=lambda a: a.start)
    return dict(out)


def duplicates(group: list[Attempt], broker: bool) -> int:
    """How many attempts of one slot duplicate an earlier one (see the module's definitions)."""
    if broker:
        return max(0, len(group) - 1)
    count = 0
    for j, later in enumerate(group):
        begun = later.first_activity
        for earlier in group[:j]:
            worked_on = any(start >= begun for start, _ in earlier.steps)
            done_twice = (
                earlier.completed
                and later.completed
                and earlier.ended is not None
                and earlier.ended <= begun
            )
            if worked_on or done_twice or earlier.attempt == later.attempt:
                count += 1
                break
    return count


def concurrent(group: list[Attempt]) -> int:
    """How many pairs of attempts of one slot have steps that overlap in time."""
    count = 0
    for j, b in enumerate(group):
        for a in group[:j]:
            if any(a0 < b1 and b0 < a1 for a0, a1 in a.steps for b0, b1 in b.steps):
                count += 1
    return count


def stale(
    group: list[Attempt],
    history: Sequence[Mapping[str, Any]],
    accepted: Sequence[Mapping[str, Any]],
) -> bool:
    """True if a superseded attempt's result became the slot's (see the definitions)."""
    if history:
        last = max(int(r["attempt"]) for r in history)
        for run in history:
            superseded = int(run["attempt"]) < last
            handler_result = run["status"] == "succeeded" or (
                run["status"] == "failed" and run.get("reason") is None
            )
            if superseded and handler_result:
                return True
    for log in accepted:
        attempt = log.get("attempt")
        if attempt is None:
            continue
        if any(a.attempt > int(attempt) and a.start < float(log["mono"]) for a in group):
            return True
    return False


def measure(
    records: Sequence[Mapping[str, Any]],
    histories: Mapping[str, Sequence[Mapping[str, Any]]],
    expected: Mapping[str, set[int]],
    deaths: Mapping[int, float],
    broker: bool,
) -> Counts:
    """The counts of one trial.

    ``expected``: per job, the slots that had to run (jobs not named there are not checked for
    missed slots: a job whose handler hangs by design, say). ``histories``: per job, the
    backend's records (plain dicts with slot, attempt, status, reason).
    """
    groups = attempts_of(records, deaths)
    counts = Counts(trials=1)
    keys = set(groups) | {(job, slot) for job, slots in expected.items() for slot in slots}
    counts.slots = len(keys)
    accepted: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("event") == "log" and r.get("action") in ACCEPTED and r.get("slot") is not None:
            accepted[(str(r["job"]), int(r["slot"]))].append(r)
    recorded: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for job, runs in histories.items():
        for run in runs:
            if run.get("slot") is not None:
                recorded[(job, int(run["slot"]))].append(run)
    counts.stale = None if broker else 0
    for key in sorted(keys):
        group = groups.get(key, [])
        counts.duplicates += duplicates(group, broker)
        counts.concurrent += concurrent(group)
        if counts.stale is not None and stale(group, recorded.get(key, []), accepted.get(key, [])):
            counts.stale += 1
    for job, slots in expected.items():
        for slot in slots:
            if not any(a.completed for a in groups.get((job, slot), [])):
                counts.missed += 1
    return counts
