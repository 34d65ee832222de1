"""Every-second jobs at scale on NATS, three real instances: each slot runs at most once, none is
left ``running`` with no runner, and most slots run, with and without a stalled server.

At 3 processes x 5 000 every-second jobs the claim path once collapsed: a batch of up to 2 000
claims that failed threw away the answers it had decided (stored wins with nobody to run them
stayed ``running``: 34 255 in one run), every instance published every slot (the rank delays
could not hold the others back while the preferred instance was still publishing), and failed
batches piled up at the in-flight gate (17 000 to 25 000 waiters) until each claim was refused
unsent. 30 825 runs of about 225 000 due in 45 s; after a 20 s server stall at 3 x 2 000 jobs,
nothing ran for about 145 s.

``make test`` runs a small fleet (3 x 300 jobs for 10 s); ``make chaos`` (``ANARCHON_CHAOS=1``)
runs the full sizes on a private server, the stall by SIGSTOP/SIGCONT of its pid. ``pytest
-rP`` shows each run's figures. The instances are the bench's worker (``python -m
bench.worker``: the jobs of a spec, every handler start recorded), each run on a fresh stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats._records import decode_claim, decode_result
from tests.chaos.test_burst import _logs, _spawn
from tests.harness import in_chaos_only
from tests.nats.servers import (
    DEBIAN_BINARY,
    SHARED_URL,
    NatsServer,
    delete_stream,
    single_server,
    unique_names,
)

pytestmark = pytest.mark.slow

INSTANCES: Final = 3
READY_S: Final = 60.0  # three processes import, add their jobs and start
EXIT_S: Final = 60.0  # after SIGTERM, each instance has stopped by then


@dataclass
class Figures:
    """What a fleet run did over the measured seconds."""

    due: int
    ran: int
    duplicates: int
    running: int
    per_instance: list[int]
    stop_s: list[float]
    hung: list[str]

    def line(self, label: str) -> str:
        return (
            f"{label}: runs/due {self.ran}/{self.due} ({self.ran / max(1, self.due):.1%}), "
            f"duplicates {self.duplicates}, left running {self.running}, "
            f"runs per instance {self.per_instance}, "
            f"stop took {[round(s, 1) for s in self.stop_s]} s, hung at stop {self.hung}"
        )


def _json(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:  # a line being written
        return None
    return record if isinstance(record, dict) else None


def _records(tmp: Path) -> list[dict[str, Any]]:
    """Every record the instances wrote (handler starts, exits)."""
    lines = [line for path in sorted(tmp.glob("i*.jsonl")) for line in path.read_text().split("\n")]
    return [record for line in lines if line and (record := _json(line)) is not None]


def _wait_ready(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    until = time.time() + READY_S
    while True:
        late = [f"i{n}" for n in range(INSTANCES) if not (tmp / f"i{n}.ready").exists()]
        dead = [f"i{n}" for n, p in enumerate(procs) if p.poll() is not None]
        assert not dead, f"exited before it started: {dead}\n{_logs(tmp)}"
        if not late:
            return
        assert time.time() < until, f"not started in {READY_S} s: {late}\n{_logs(tmp)}"
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """SIGTERM each instance; the ones that had not exited by themselves within EXIT_S."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    hung: list[str] = []
    deadline = time.monotonic() + EXIT_S
    for n, proc in enumerate(procs):
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(f"i{n}")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return hung


async def _left_running(url: str, stream: str, prefix: str) -> int:
    """Claims stored as won (not skip records) that have no result: ``running`` in history,
    with every instance stopped (their handlers return at once), so nobody runs them."""
    reader = NatsBackend(url, stream=stream, prefix=prefix)
    await reader.start_reader()
    try:
        claims = await reader._conn.read_all(f"{prefix}*.claims", "reading the claims")
        results = await reader._conn.read_all(f"{prefix}*.results", "reading the results")
    finally:
        await reader.stop()
    finished = {r.run.run_id for m in results if (r := decode_result(m)) is not None}
    return sum(
        1
        for m in claims
        if (c := decode_claim(m)) is not None and not c.skipped and c.run_id not in finished
    )


def run_fleet(
    tmp: Path,
    url: str,
    jobs: int,
    seconds: int,
    stall: tuple[NatsServer, float, float] | None = None,
) -> Figures:
    """``INSTANCES`` workers with ``jobs`` every-second jobs each (every option at its
    default), measured over ``seconds`` whole seconds from the first after all started;
    ``stall``: (server, after s, for s) SIGSTOP the server's pid ``after`` seconds into the
    measured time, SIGCONT it ``for`` seconds later."""
    stream, prefix = unique_names()
    full = f"{url}?stream={stream}&prefix={prefix}"
    spec = [{"prefix": "e", "count": jobs, "schedule": "* * * * * *"}]
    procs = [_spawn(tmp, full, spec, n) for n in range(INSTANCES)]
    hung: list[str] = []
    try:
        _wait_ready(tmp, procs)
        first = math.ceil(time.time()) + 1
        end = first + seconds
        if stall is not None:
            server, after, length = stall
            time.sleep(max(0.0, first + after - time.time()))
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)
            try:
                time.sleep(length)
            finally:
                os.kill(server.pid, signal.SIGCONT)
        # A slot may run up to max_late_ms (60 s) late; the last ones get a few seconds.
        time.sleep(max(0.0, end + 3 - time.time()))
    finally:
        hung = _stop(procs)
        try:
            running = asyncio.run(_left_running(url, stream, prefix))
        finally:
            asyncio.run(delete_stream(url, stream))
    records = _records(tmp)
    starts = [r for r in records if r.get("e") == "start" and r.get("a", 1) == 1]
    per_slot = Counter((r["j"], r["s"]) for r in starts)
    window = range(first * 1000, end * 1000)
    ran = [key for key in per_slot if key[1] in window]
    per_pid = Counter(r["p"] for r in starts if r["s"] in window)
    figures = Figures(
        due=jobs * seconds,
        ran=len(ran),
        duplicates=sum(n - 1 for n in per_slot.values()),
        running=running,
        per_instance=sorted(per_pid.values(), reverse=True),
        stop_s=[r["stop_s"] for r in records if r.get("e") == "exit"],
        hung=hung,
    )
    if hung:
        print(_logs(tmp))
    return figures


def check(figures: Figures, label: str, floor: float) -> None:
    print(figures.line(label))
    assert not figures.hung, figures.line(label)
    assert figures.duplicates == 0, figures.line(label)
    assert figures.running == 0, figures.line(label)
    assert figures.ran >= floor * figures.due, figures.line(label)


def test_a_small_fleet_of_every_second_jobs_runs_each_slot_once(tmp_path: Path) -> None:
    """3 x 300 every-second jobs for 10 s on the shared server, every option at its default."""
    figures = run_fleet(tmp_path, SHARED_URL, jobs=300, seconds=10)
    check(figures, "3 x 300 every-second jobs, 10 s", floor=0.9)


@pytest.fixture
def private(tmp_path: Path) -> Any:
    server = single_server(tmp_path / "nats", DEBIAN_BINARY).start()
    try:
        yield server
    finally:
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)
        server.stop()


@pytest.mark.timeout(900)
def test_3_x_5000_every_second_jobs_for_45_s(tmp_path: Path, private: NatsServer) -> None:
    in_chaos_only("3 x 5 000 every-second jobs for 45 s")
    figures = run_fleet(tmp_path, private.url, jobs=5_000, seconds=45)
    check(figures, "3 x 5 000 every-second jobs, 45 s", floor=0.5)


@pytest.mark.timeout(900)
def test_3_x_2000_every_second_jobs_through_a_20_s_server_stall(
    tmp_path: Path, private: NatsServer
) -> None:
    in_chaos_only("3 x 2 000 every-second jobs through a 20 s stall")
    figures = run_fleet(tmp_path, private.url, jobs=2_000, seconds=90, stall=(private, 20, 20))
    check(figures, "3 x 2 000 every-second jobs, 90 s, server stalled 20 s from 20 s", floor=0.8)
