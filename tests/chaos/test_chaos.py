"""The fault suite's short form, inside ``make test``: one trial of each fault, each on one
backend (``SHORT`` in tests/chaos/run.py spreads them over all four), run together in the
background so the whole takes about two minutes; each test waits for its trial and fails if any
count misses its target (0; on NATS duplicates and concurrent executions). Every other pair of
fault and backend is skipped here with the reason, and runs in the long form, ``make chaos``.
CHAOS_PARALLEL (default 8) bounds how many trials run at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.chaos.faketime import ensure_installed
from tests.chaos.faults import FAULTS, run_trial
from tests.chaos.measure import Counts
from tests.chaos.run import SHORT, plan
from tests.chaos.targets import BACKENDS, LEASE_BACKENDS

pytestmark = pytest.mark.slow

ALL = plan(FAULTS, BACKENDS)
SHORT_ON = {fault: " and ".join(b for f, b in SHORT if f == fault) for fault in FAULTS}


@pytest.fixture(scope="session")
def short_form(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[tuple[str, str], tuple[Path, Future[Counts]]]]:
    """Start the trials of the selected tests, all at once (at most CHAOS_PARALLEL at a time)."""
    wanted = []
    for item in request.session.items:
        params = getattr(item, "callspec", None)
        cell = (params.params.get("fault"), params.params.get("backend")) if params else None
        module = getattr(item, "module", None)
        if module is not None and module.__name__ == __name__ and cell in SHORT:
            wanted.append(cell)
    root = tmp_path_factory.mktemp("chaos")
    pool = ThreadPoolExecutor(int(os.environ.get("CHAOS_PARALLEL", "8")), "chaos-trial")
    runs = {}
    for fault, backend in wanted:
        directory = root / f"{fault}-{backend}"
        runs[(fault, backend)] = (
            directory,
            pool.submit(run_trial, FAULTS[fault], backend, directory),
        )
    try:
        yield runs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("fault", "backend"), ALL, ids=[f"{f}-{b}" for f, b in ALL])
def test_fault(
    fault: str,
    backend: str,
    short_form: dict[tuple[str, str], tuple[Path, Future[Counts]]],
) -> None:
    if (fault, backend) not in SHORT:
        pytest.skip(
            f"long form only (make chaos): the short form runs {fault} on {SHORT_ON[fault]}"
        )
    if FAULTS[fault].faked and (why := ensure_installed()):
        pytest.skip(f"libfaketime is needed for clock steps: {why}")
    directory, future = short_form[(fault, backend)]
    counts = future.result()
    error = directory / "error.txt"
    assert counts.errors == 0, f"the trial could not run:\n{error.read_text()}"
    problems = counts.failures(broker=backend not in LEASE_BACKENDS)
    notes = ", ".join(f"{k} x{v}" for k, v in sorted(counts.notes.items()))
    assert problems == [], (
        f"{fault} on {backend}: {'; '.join(problems)} ({counts.slots} slots; {notes}); "
        f"records, timeline and logs in {directory}"
    )
    assert counts.slots >= 1, f"{fault} on {backend} measured no slot at all"
