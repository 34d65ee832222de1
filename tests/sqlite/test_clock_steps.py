"""The host's wall clock steps under every process of a SQLite fleet (libfaketime, one offset
file: one host, one clock), the monotonic and boot clocks untouched, every option at its
default: +2 h, back 90 s (more than max_late_ms), +60 s.

Each time: each process's timer sees the step once and one write takes it for the fleet, no
slot's handler starts twice, no lease is lost, firing resumes when the wall clock next reaches
an unrun slot (within seconds of the step going forward, 90 s later going back), no slot is
recorded as an overlap, no run is recorded as started before its slot, none is left running.
Before the fix the backend's clock slewed toward the wall clock at 1 % (back 90 s: no slot ran
for about 50 hours; +60 s: 19 slots skipped as overlaps and runs recorded 60 s before their
slot) or took a step over an hour while the processes measured the anchor they last read (+2 h:
runs of old slots, leases lost, handlers started twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.faketime import LIBRARY, FakeClockFile
from tests.harness import in_chaos_only

WORKER = Path(__file__).resolve().parent / "step_worker.py"
INSTANCES = 3
PERIOD_S = 3
COLUMNS = ("run_id", "slot", "attempt", "status", "reason", "trigger", "started_at", "finished_at")

pytestmark = [
    pytest.mark.skipif(not LIBRARY.exists(), reason="Debian package faketime is not installed"),
    pytest.mark.timeout(600),
]


def _read(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _wait(out: Path, test: Any, timeout_s: float, what: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = _read(out)
        if test(events):
            return events
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}: {_read(out)[-20:]}")


def _fleet_through_a_step(
    tmp_path: Path, step_s: int, after_s: float, enough: Any = None
) -> dict[str, Any]:
    """Start the fleet, let it fire, step every process's wall clock by ``step_s``, watch for
    ``after_s`` seconds (with ``enough``, a test of the events and the step's monotonic time:
    until it holds, and one period more), stop it; the handler starts, the warnings and the
    history."""
    db, out = tmp_path / "steps.db", tmp_path / "events.jsonl"
    clock = FakeClockFile(tmp_path / "faketime")
    env = {**os.environ, **clock.env()}
    logs = [open(tmp_path / f"i{n}.stderr", "w") for n in range(INSTANCES)]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(db), f"i{n}", str(out)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=logs[n],
        )
        for n in range(INSTANCES)
    ]
    try:
        _wait(
            out,
            lambda ev: (
                {e["inst"] for e in ev if e.get("action") == "started"}
                >= {f"i{n}" for n in range(INSTANCES)}
            ),
            180,
            "every instance to start",
        )
        _wait(out, lambda ev: sum(e["kind"] == "start" for e in ev) >= 3, 60, "three runs")
        time.sleep(PERIOD_S)
        clock.set(step_s)
        step_mono = time.monotonic()
        if enough is None:
            time.sleep(after_s)
        else:
            with contextlib.suppress(AssertionError):  # the checks say what did not happen
                _wait(out, lambda ev: enough(ev, step_mono), after_s, "the fleet past the step")
            time.sleep(PERIOD_S)  # what the last slot set going lands
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:  # a read: no clock of its own
        query = f"SELECT {', '.join(COLUMNS)} FROM anarchon_runs"
        history = [dict(zip(COLUMNS, row, strict=True)) for row in conn.execute(query)]
    events = _read(out)
    return {
        "step_mono": step_mono,
        "starts": [e for e in events if e["kind"] == "start"],
        "warnings": [e for e in events if e["kind"] == "log" and e["level"] != "INFO"],
        "history": history,
        "stderr": "".join((tmp_path / f"i{n}.stderr").read_text() for n in range(INSTANCES)),
    }


def _steps(seen: dict[str, Any], action: str) -> list[tuple[str, int]]:
    """The steps of a second or more logged with ``action``: (instance, ms)."""
    found = [(w["inst"], w["step_ms"]) for w in seen["warnings"] if w["action"] == action]
    return sorted((inst, ms) for inst, ms in found if abs(ms) >= 1000)


def _check_common(seen: dict[str, Any], step_s: int) -> None:
    starts, history = seen["starts"], seen["history"]
    # Each instance's timer sees the step once, and one write transaction takes it for the
    # whole fleet (the anchor is in the file). A step back and forth is a clock read off the
    # step: libfaketime's plain build gave the real time back to one reading in about 10 000
    # from threads (tests/chaos/faketime.py), once recorded as a run started 2 h early.
    for action, count in (("clock_step", INSTANCES), ("clock_stepped", 1)):
        taken = _steps(seen, action)
        assert len(taken) == count, f"{action}: {taken}"
        assert all(abs(ms - step_s * 1000) < 5000 for _, ms in taken), f"{action}: {taken}"
    slots = [s["slot"] for s in starts]
    twice = sorted({s for s in slots if slots.count(s) > 1})
    assert not twice, f"slots whose handler started twice: {twice}"
    lost = [w for w in seen["warnings"] if w["action"] == "lease_lost" or "lease lost" in w["msg"]]
    assert not lost, f"leases lost: {lost}"
    # A slot is recorded as an overlap only while another run of the job really held its
    # lease: a slot jumped over by less than max_late_ms is due at once with the ones after it
    # (the core claims them in turn; the first runs, late), never because of a stale lease.
    runs = {r["run_id"]: r for r in history}
    for skip in (r for r in history if "overlap" in (r["reason"] or "")):
        holder = runs.get(skip["reason"].split()[2])
        assert holder is not None, f"an overlap names no recorded run: {skip}"
        assert holder["slot"] < skip["slot"], (skip, holder)
        assert holder["started_at"] <= skip["started_at"] <= holder["finished_at"], (skip, holder)
    early = [
        r
        for r in history
        if r["trigger"] == "schedule" and r["status"] != "skipped" and r["started_at"] < r["slot"]
    ]
    assert not early, f"runs recorded as started before their slot: {early[:5]}"
    running = [r for r in history if r["status"] == "running"]
    assert not running, f"records left running: {running}"
    assert "Traceback" not in seen["stderr"], seen["stderr"][-3000:]


@pytest.mark.parametrize("step_s", [7200, 60], ids=["plus_2h", "plus_60s"])
def test_a_step_forward_on_every_process(tmp_path: Path, step_s: int) -> None:
    if step_s != 7200:
        in_chaos_only(f"a step of {step_s} s")
    seen = _fleet_through_a_step(tmp_path, step_s, after_s=30, enough=_past_the_step)
    _check_common(seen, step_s)
    after = [s for s in seen["starts"] if s["mono"] > seen["step_mono"]]
    assert after, "nothing ran after the step"
    first = min(s["mono"] for s in after) - seen["step_mono"]
    assert first < 15, f"firing resumed {first:.1f} s after the step"
    assert len(after) >= 5, f"only {len(after)} runs in the 30 s after the step"
    # Only the slot due as the clock stepped may run later than max_late_ms (60 s) by the new
    # time: it was reached just before the step.
    late = [s for s in after if s["slot"] is not None and s["wall"] - s["slot"] > 60]
    assert len(late) <= 1, f"slots older than max_late_ms ran: {late[:5]}"


def _past_the_step(events: list[dict[str, Any]], step_mono: float) -> bool:
    """Every instance has logged the step, one has taken it for the fleet, and six slots have
    started since (the test asks for five in the 30 s after a step forward)."""
    logged = {
        (e["inst"], e["action"])
        for e in events
        if e["kind"] == "log" and e["mono"] > step_mono and abs(e["step_ms"] or 0) >= 1000
    }
    return (
        {(f"i{n}", "clock_step") for n in range(INSTANCES)} <= logged
        and any(action == "clock_stepped" for _, action in logged)
        and sum(e["kind"] == "start" and e["mono"] > step_mono for e in events) >= 6
    )


def test_a_step_back_beyond_max_late_on_every_process(tmp_path: Path) -> None:
    in_chaos_only("a step back of 90 s")  # two minutes of watching; make test keeps +2 h
    seen = _fleet_through_a_step(tmp_path, -90, after_s=90 + 30)
    _check_common(seen, -90)
    before = [s for s in seen["starts"] if s["mono"] < seen["step_mono"]]
    last = max(s["slot"] for s in before)
    new = [s for s in seen["starts"] if s["slot"] > last]
    assert len(new) >= 4, f"firing did not resume once the clock reached new slots: {new}"
    slow = [s for s in new if s["wall"] - s["slot"] > 10]
    assert not slow, f"new slots that started more than 10 s after their time: {slow[:5]}"
    relived = [s for s in seen["starts"] if s["mono"] > seen["step_mono"] and s["slot"] <= last]
    assert not relived, f"slots run again after the step back: {relived}"
