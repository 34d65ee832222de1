"""50 000 slots due in the same second on three real instances on NATS: every slot starts
exactly once (0 missed, 0 duplicates).

Before the core claimed a due batch in parts (``anarchon._claims.CLAIM_PART``), each instance
sent its 50 000 claims in one ``claim()`` call, which must send all its publishes within
``CLAIM_RETRY_S`` (8 s): the call failed, the whole batch was retried until too late, and none
of the 50 000 started. Minutes of work on two cores, so it runs in ``make chaos``
(``ANARCHON_CHAOS=1``), not in ``make test``; ``pytest -rP`` shows its figures (time from the
slot to the last first start, starts per instance).

The instances are the bench's worker (``python -m bench.worker``: the jobs of a spec, every
handler start recorded), on the shared NATS service, each test on a fresh stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest

from tests.chaos.fleet import ROOT
from tests.nats.servers import SHARED_URL, delete_stream, unique_names

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ANARCHON_CHAOS") != "1",
        reason="minutes of work: runs in make chaos (ANARCHON_CHAOS=1)",
    ),
    pytest.mark.timeout(600),
]

JOBS: Final = 50_000
INSTANCES: Final = 3
LEAD_S: Final = 45.0  # three processes register 50 000 jobs each and start before the slot
START_LIMIT_S: Final = 120.0  # after the slot, every slot has started by then or is missed
QUIET_S: Final = 3.0  # after the last start, wait this long for a late duplicate


def _spawn(tmp: Path, url: str, spec: list[dict[str, Any]], n: int) -> subprocess.Popen[bytes]:
    name = f"i{n}"
    args = [sys.executable, "-m", "bench.worker", "--url", url, "--spec", json.dumps(spec)]
    args += ["--instance", name, "--out", str(tmp / f"{name}.jsonl")]
    args += ["--ready", str(tmp / f"{name}.ready"), "--seconds", "600"]
    with (tmp / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _starts(tmp: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for n in range(INSTANCES):
        path = tmp / f"i{n}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line being written
                    record = json.loads(line)
                    if record.get("e") == "start":
                        found.append(record)
    return found


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def _forget(stream: str) -> None:
    await delete_stream(SHARED_URL, stream)


def _wait_ready(tmp: Path, procs: list[subprocess.Popen[bytes]], until: float) -> list[str]:
    """The instances not ready (started) by ``until``."""
    while True:
        late = [f"i{n}" for n in range(INSTANCES) if not (tmp / f"i{n}.ready").exists()]
        dead = [f"i{n}" for n, p in enumerate(procs) if p.poll() is not None]
        if not late or dead or time.time() >= until:
            return late + [f"{d} exited" for d in dead]
        time.sleep(0.2)


def _logs(tmp: Path) -> str:
    return "\n".join(
        f"--- i{n}:\n" + (tmp / f"i{n}.log").read_text(errors="replace")[-3000:]
        for n in range(INSTANCES)
        if (tmp / f"i{n}.log").exists()
    )


def test_50_000_slots_due_at_once_on_nats_start_exactly_once(tmp_path: Path) -> None:
    stream, prefix = unique_names()
    url = f"{SHARED_URL}?stream={stream}&prefix={prefix}"
    slot_s = math.ceil(time.time() + LEAD_S)
    moment = datetime.fromtimestamp(slot_s, UTC)
    spec = [
        {
            "prefix": "b",
            "count": JOBS,
            "schedule": f"{moment.second} {moment.minute} {moment.hour} * * *",
            "options": {"jitter_ms": 0},
        }
    ]
    procs = [_spawn(tmp_path, url, spec, n) for n in range(INSTANCES)]
    try:
        late = _wait_ready(tmp_path, procs, slot_s - 1)
        assert not late, f"not started before the slot: {late}; raise LEAD_S\n{_logs(tmp_path)}"
        seen, last_new = 0, time.time()
        while time.time() < slot_s + START_LIMIT_S:
            time.sleep(0.5)
            count = len(_starts(tmp_path))
            if count != seen:
                seen, last_new = count, time.time()
            elif count >= JOBS and time.time() - last_new >= QUIET_S:
                break
    finally:
        _stop(procs)
        asyncio.run(_forget(stream))
    starts = [s for s in _starts(tmp_path) if s["s"] == slot_s * 1000 and s.get("a", 1) == 1]
    per_job = Counter(s["j"] for s in starts)
    missed = JOBS - len(per_job)
    duplicates = sum(n - 1 for n in per_job.values())
    first: dict[str, dict[str, Any]] = {}
    for record in sorted(starts, key=lambda r: r["t"]):
        first.setdefault(record["j"], record)
    all_started_s = max((r["t"] for r in first.values()), default=math.nan) - slot_s
    by_pid = sorted(Counter(r["p"] for r in first.values()).values(), reverse=True)
    print(
        f"NATS burst of {JOBS} slots, {INSTANCES} instances: ran {len(per_job)}, missed "
        f"{missed}, duplicates {duplicates}, all started {all_started_s:.2f} s after the slot, "
        f"starts per instance {by_pid}"
    )
    assert (missed, duplicates) == (0, 0), (
        f"{missed} missed, {duplicates} duplicates\n{_logs(tmp_path)}"
    )
