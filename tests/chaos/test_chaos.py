"""The fault suite's short form, inside ``make test``: one trial of each fault, each on one
backend (``SHORT`` in tests/chaos/run.py spreads them over all four), run together so the whole
takes about two minutes; each test waits for its trial and fails if any count misses its target
(0; on NATS duplicates and concurrent executions). Every other pair of fault and backend is
skipped here with the reason, and runs in the long form, ``make chaos``.

The trials run in one runner process (``python -m tests.chaos.run --cells ... --results DIR``),
started by the first test that needs it, at most CHAOS_PARALLEL (default 8) at a time: under
pytest-xdist the workers share it (its directory is under the run's common temporary folder, and
an exclusive file decides who starts it), so a trial never runs twice whichever worker asks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.chaos.faketime import ensure_installed
from tests.chaos.faults import FAULTS
from tests.chaos.fleet import ROOT
from tests.chaos.measure import Counts
from tests.chaos.run import SHORT, plan, result_path
from tests.chaos.targets import BACKENDS, LEASE_BACKENDS

pytestmark = pytest.mark.slow

ALL = plan(FAULTS, BACKENDS)
SHORT_ON = {fault: " and ".join(b for f, b in SHORT if f == fault) for fault in FAULTS}
WAIT_S: Final = 600  # for one trial's counts, from the test's start


def _selected(session: pytest.Session) -> list[tuple[str, str]]:
    """The short-form pairs this pytest run selected (the same list on every xdist worker)."""
    cells = []
    for item in session.items:
        params = getattr(item, "callspec", None)
        module = getattr(item, "module", None)
        if params is None or module is None or module.__name__ != __name__:
            continue
        cell = (params.params.get("fault"), params.params.get("backend"))
        if cell in SHORT:
            cells.append(cell)
    return cells


@pytest.fixture(scope="session")
def short_form(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The directory the runner writes the counts to; the first worker to get here starts it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "chaos-short"
    root.mkdir(exist_ok=True)
    try:
        os.close(os.open(root / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        yield root  # another worker runs the trials
        return
    selected = _selected(request.session)
    if any(FAULTS[f].faked for f, _ in selected):
        ensure_installed()  # here, once, rather than by trials racing for apt's lock
    cells = ",".join(f"{f}:{b}" for f, b in selected)
    with (root / "runner.log").open("wb") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.run", "--cells", cells, "--trials", "1",
             "--parallel", os.environ.get("CHAOS_PARALLEL", "8"), "--out", str(root),
             "--results", str(root)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield root
    finally:
        try:
            runner.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait(30)


def _counts(root: Path, cell: tuple[str, str]) -> Counts:
    target = result_path(root, cell)
    deadline = time.monotonic() + WAIT_S
    while not target.exists():
        if (root / "runner.done").exists() and not target.exists():
            log = (root / "runner.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"the runner ended without counts for {cell}:\n{log}")
        if time.monotonic() > deadline:
            pytest.fail(f"no counts for {cell} after {WAIT_S} s; see {root}")
        time.sleep(0.5)
    return Counts.from_json(json.loads(target.read_text()))


@pytest.mark.timeout(WAIT_S + 120)
@pytest.mark.parametrize(("fault", "backend"), ALL, ids=[f"{f}-{b}" for f, b in ALL])
def test_fault(fault: str, backend: str, short_form: Path) -> None:
    if (fault, backend) not in SHORT:
        pytest.skip(
            f"long form only (make chaos): the short form runs {fault} on {SHORT_ON[fault]}"
        )
    if FAULTS[fault].faked and (why := ensure_installed()):
        pytest.skip(f"libfaketime is needed for clock steps: {why}")
    counts = _counts(short_form, (fault, backend))
    directory = short_form / f"{fault}-{backend}-0"
    error = directory / "error.txt"
    assert counts.errors == 0, f"the trial could not run:\n{error.read_text()}"
    problems = counts.failures(broker=backend not in LEASE_BACKENDS)
    notes = ", ".join(f"{k} x{v}" for k, v in sorted(counts.notes.items()))
    assert problems == [], (
        f"{fault} on {backend}: {'; '.join(problems)} ({counts.slots} slots; {notes}); "
        f"records, timeline and logs in {directory}"
    )
    assert counts.slots >= 1, f"{fault} on {backend} measured no slot at all"
