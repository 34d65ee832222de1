"""``make chaos``: every fault on every backend it applies to, several trials each, and the table.

    python -m tests.chaos.run                         # the long form (CHAOS_TRIALS, default 5)
    python -m tests.chaos.run --faults sigterm,kill-9 --backends redis --trials 2
    python -m tests.chaos.run --short                 # what the short form in make test runs
    python -m tests.chaos.run --write-docs docs/guarantees.md

Trials run ``--parallel`` at a time (CHAOS_PARALLEL, default 4): each is three worker processes
that mostly sleep. The exit status is 1 if any count misses its target (0; on NATS only
duplicates and concurrent executions), so the command can gate a merge. Each trial's records,
the harness's timeline and the workers' logs stay under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import anarchon
from tests.chaos.faults import FAULTS, run_trial
from tests.chaos.measure import Counts
from tests.chaos.targets import BACKENDS, LEASE_BACKENDS

# The short form: each fault once, spread over the backends, within about three minutes when run
# all at once. What is left out, and why, is in tests/chaos/test_chaos.py.
SHORT: Final = (
    ("sigterm", "sqlite"),
    ("kill-9", "redis"),
    ("sigstop", "postgres"),
    ("clock-back", "redis"),
    ("clock-forward", "sqlite"),
    ("restart", "postgres"),
    ("link-hold", "redis"),
    ("link-delay", "postgres"),
    ("handler-exit", "sqlite"),
    ("handler-hang", "redis"),
    ("ignore-cancel", "postgres"),
    ("block-loop", "redis"),
    ("32-hung", "sqlite"),
    ("every-second", "postgres"),
    ("kill-9", "nats"),
    ("restart", "nats"),
)
BEGIN: Final = "<!-- chaos-table:begin -->"
END: Final = "<!-- chaos-table:end -->"
COLUMNS: Final = (
    "fault",
    "backend",
    "trials",
    "slots",
    "duplicate starts",
    "concurrent executions",
    "missed",
    "stale results accepted",
    "stuck stops",
    "notes",
)


def plan(faults: Iterable[str], backends: Iterable[str]) -> list[tuple[str, str]]:
    """Every (fault, backend) pair asked for that the fault applies to."""
    wanted = list(backends)
    return [(f, b) for f in faults for b in FAULTS[f].backends if b in wanted]


def run_all(
    cells: list[tuple[str, str]],
    trials: int,
    parallel: int,
    out: Path,
    quiet: bool = False,
    results_dir: Path | None = None,
) -> dict[tuple[str, str], Counts]:
    """Run ``trials`` trials of each cell, ``parallel`` at a time; the summed counts per cell.

    With ``results_dir``, each cell's counts are written there as ``<fault>-<backend>.json``
    once its last trial has ended (the short form's tests wait for these files).
    """
    results = {cell: Counts() for cell in cells}
    left = dict.fromkeys(cells, trials)
    jobs = [(cell, n) for n in range(trials) for cell in cells]
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures: dict[Future[tuple[Counts, float]], tuple[tuple[str, str], int]] = {}
        for (fault, backend), n in jobs:
            directory = out / f"{fault}-{backend}-{n}"
            future = pool.submit(_timed, fault, backend, directory)
            futures[future] = ((fault, backend), n)
        for done, future in enumerate(as_completed(futures), 1):
            cell, n = futures[future]
            counts, took = future.result()
            results[cell].add(counts)
            left[cell] -= 1
            if results_dir is not None and not left[cell]:
                _write_result(results_dir, cell, results[cell])
            if not quiet:
                print(
                    f"[{done}/{len(jobs)} {time.monotonic() - began:5.0f}s] {cell[0]} on "
                    f"{cell[1]} #{n + 1} ({took:.0f}s): {_brief(counts)}",
                    flush=True,
                )
    return results


def result_path(directory: Path, cell: tuple[str, str]) -> Path:
    """Where ``--results`` puts the counts of one fault and backend."""
    return directory / f"{cell[0]}-{cell[1]}.json"


def _write_result(directory: Path, cell: tuple[str, str], counts: Counts) -> None:
    target = result_path(directory, cell)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(counts.to_json()))
    tmp.replace(target)


def _timed(fault: str, backend: str, directory: Path) -> tuple[Counts, float]:
    began = time.monotonic()
    counts = run_trial(FAULTS[fault], backend, directory)
    return counts, time.monotonic() - began


def _brief(c: Counts) -> str:
    failures = c.failures(broker=False)
    state = "error" if c.errors else ("ok" if not failures else "NOT OK")
    return (
        f"{state}: slots {c.slots}, duplicates {c.duplicates}, concurrent {c.concurrent}, "
        f"missed {c.missed}, stale {c.stale if c.stale is not None else '-'}, stuck {c.stuck}"
    )


def table(results: dict[tuple[str, str], Counts]) -> str:
    """The results as a Markdown table, one row per fault and backend."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (fault, backend), c in results.items():
        broker = backend not in LEASE_BACKENDS
        notes = ", ".join(f"{k} x{v}" for k, v in sorted(c.notes.items()))
        if c.sigterm_exits:
            low, high = min(c.sigterm_exits), max(c.sigterm_exits)
            span = f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"
            notes = f"exit {span} after SIGTERM" + (f", {notes}" if notes else "")
        cells = [
            fault,
            backend,
            str(c.trials - c.errors) + (f" (+{c.errors} in error)" if c.errors else ""),
            str(c.slots),
            _mark(c.duplicates),
            _mark(c.concurrent),
            f"({c.missed})" if broker else _mark(c.missed),
            "n/a" if c.stale is None else _mark(c.stale),
            f"({c.stuck})" if broker else _mark(c.stuck),
            notes,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mark(n: int) -> str:
    return f"**{n}**" if n else "0"


def failed(results: dict[tuple[str, str], Counts]) -> list[str]:
    out = []
    for (fault, backend), c in results.items():
        for failure in c.failures(broker=backend not in LEASE_BACKENDS):
            out.append(f"{fault} on {backend}: {failure}")
    return out


def write_docs(path: Path, text: str) -> None:
    """Replace what stands between the table markers of ``path`` with ``text``."""
    doc = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} section to rewrite")
    path.write_text(pattern.sub(lambda _m: f"{BEGIN}\n{text}\n{END}", doc))


def _code() -> str:
    """The commit the suite ran on, and whether the tree had changes (src/ matters)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "an unknown commit"
    where = Path(anarchon.__file__).resolve().parents[1]
    elsewhere = f" (anarchon imported from {where})" if where != root / "src" else ""
    state = " with changes in src/" if dirty else ""
    return (f"commit {head}{state}" if head else "an unknown commit") + elsewhere


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--trials", type=int, default=int(os.environ.get("CHAOS_TRIALS", "5")))
    p.add_argument("--parallel", type=int, default=int(os.environ.get("CHAOS_PARALLEL", "4")))
    p.add_argument("--short", action="store_true", help="the short form: each fault once")
    p.add_argument("--cells", help="fault:backend,... to run instead of --faults x --backends")
    p.add_argument("--results", type=Path, help="write each pair's counts here as JSON")
    p.add_argument("--out", type=Path)
    p.add_argument("--write-docs", type=Path, help="rewrite the table section of this file")
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    backends = [b for b in args.backends.split(",") if b]
    if bad := [b for b in backends if b not in BACKENDS]:
        p.error(f"unknown backend(s) {bad}; known: {', '.join(BACKENDS)}")
    cells = list(SHORT) if args.short else plan(faults, backends)
    if args.cells:
        cells = [(c.partition(":")[0], c.partition(":")[2]) for c in args.cells.split(",") if c]
        if bad_cells := [c for c in cells if c not in plan(FAULTS, BACKENDS)]:
            p.error(f"unknown fault:backend pair(s) {bad_cells}")
    trials = 1 if args.short else args.trials
    out = args.out or Path(tempfile.mkdtemp(prefix="anarchon-chaos-"))
    print(
        f"{len(cells)} fault/backend pairs x {trials} trial(s), {args.parallel} at a time; "
        f"records in {out}",
        flush=True,
    )
    if args.results is not None:
        args.results.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        results = run_all(cells, trials, args.parallel, out, results_dir=args.results)
    finally:
        if args.results is not None:
            (args.results / "runner.done").touch()
    took = time.monotonic() - began
    text = table(results)
    print()
    print(text)
    problems = failed(results)
    print(
        f"\n{len(cells)} pairs, {sum(c.trials for c in results.values())} trials in "
        f"{took / 60:.1f} min; "
        + ("all counts 0" if not problems else f"{len(problems)} count(s) not 0:")
    )
    for problem in problems:
        print(f"  {problem}")
    if args.write_docs:
        shown = [f"--trials {trials}", f"--parallel {args.parallel}"]
        shown += ["--short"] if args.short else []
        shown += [f"--faults {args.faults}"] if args.faults != ",".join(FAULTS) else []
        shown += [f"--backends {args.backends}"] if args.backends != ",".join(BACKENDS) else []
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        header = (
            f"Run {stamp} on {_code()}: `python -m tests.chaos.run {' '.join(shown)}`, "
            f"{sum(c.trials for c in results.values())} trials in {took / 60:.0f} min on "
            f"{os.cpu_count()} cores. Bold: not 0. In brackets: not a target on a broker.\n"
        )
        write_docs(args.write_docs, header + "\n" + text)
        print(f"table written to {args.write_docs}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
