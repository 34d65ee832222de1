"""The core with real processes on SQLite (the default backend), every option at its default
unless the test is about it: a deploy's SIGTERM during a run longer than the lease, a run whose
only instance is killed and started again, and an instance whose handler threads all hang."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from anarchon import RunStatus, Scheduler, SQLiteBackend
from tests.conformance.procs import ROOT, Fleet, stop_processes
from tests.conformance.test_failover import one_slot, runner_of, wait_for

pytestmark = pytest.mark.slow


async def _history(path: Path, job: str) -> list[Any]:
    async with Scheduler(SQLiteBackend(path)) as scheduler:
        return await scheduler.history(job, limit=100)


def _one_slot_started(
    fleet: Fleet, instances: int, sleep_ms: int
) -> tuple[str, int, dict[str, Any]]:
    """Start ``instances`` workers with every option at its default on one slot a few seconds
    ahead, whose handler sleeps ``sleep_ms``; return the schedule, the slot and its first start."""
    schedule, slot = one_slot(lead_s=4)
    workers = fleet.spawn(instances, schedule=schedule, seconds=120, sleep_ms=sleep_ms)
    fleet.wait_ready(workers)
    first = wait_for(fleet, lambda r: r["event"] == "start" and r["slot"] == slot, 30, "start")
    return schedule, slot, first


async def test_sigterm_during_a_run_longer_than_the_lease_with_the_defaults(
    tmp_path: Path,
) -> None:
    # Defaults: grace_ms=30000, lease_ms=15000, jitter_ms=2000, overlap skip, 3 attempts. The
    # handler still needs 18 s when SIGTERM arrives: more than a lease, less than the grace.
    db = tmp_path / "anarchon.db"
    fleet = Fleet(f"sqlite:///{db}", tmp_path)
    try:
        _, slot, first = _one_slot_started(fleet, 2, sleep_ms=19_000)
        time.sleep(1.0)  # noqa: ASYNC251 - the processes run on; nothing to await here
        runner = runner_of(fleet, first)
        runner.kill(signal.SIGTERM)
        assert runner.wait(60) == 0
        fleet.stop_all()
    finally:
        fleet.stop_all()
    starts = [r for r in fleet.records("start") if r["slot"] == slot]
    assert len(starts) == 1, f"the slot started {len(starts)} times:\n{fleet.logs()}"
    [end] = [r for r in runner.records() if r["event"] == "end"]
    assert end["lost"] is False, "the draining run was told it lost its lease"
    runs = [r for r in await _history(db, "tick") if r.slot_ms == slot]
    assert [(r.attempt, r.status) for r in runs] == [(1, RunStatus.SUCCEEDED)], runs


async def test_a_run_killed_with_its_instance_is_taken_over_after_a_restart_with_the_defaults(
    tmp_path: Path,
) -> None:
    # One replica, killed mid-run (SIGKILL: OOM, or the grace period's end) and started again:
    # nobody lost the slot's claim, so only the new process can take the run over. Every option
    # at its default: the lease (15 s) must end first, then attempt 2 runs here.
    db = tmp_path / "anarchon.db"
    fleet = Fleet(f"sqlite:///{db}", tmp_path)
    try:
        schedule, slot, first = _one_slot_started(fleet, 1, sleep_ms=40_000)
        runner_of(fleet, first).kill(signal.SIGKILL)
        killed_at = time.time()
        [restarted] = fleet.spawn(1, schedule=schedule, seconds=120, sleep_ms=40_000)
        second = wait_for(
            fleet,
            lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
            45,
            "the restarted instance's takeover",
        )
        assert second["pid"] == restarted.pid and second["fence"] > first["fence"]
        # Not before the lease the dead runner took (15 s from its claim) has ended.
        assert second["t"] - first["t"] >= 14.0, (second["t"] - first["t"], fleet.logs())
        print(f"\ntaken over {second['t'] - killed_at:.1f}s after the kill -9 (lease 15 s)")
        restarted.kill(signal.SIGKILL)
    finally:
        fleet.stop_all()
    runs = [r for r in await _history(db, "tick") if r.slot_ms == slot]
    assert [(r.attempt, r.status, r.reason) for r in runs] == [
        (2, RunStatus.RUNNING, None),
        (1, RunStatus.FAILED, "lease lost"),
    ], runs


def _spawn_plain(tmp: Path, url: str, name: str, **options: Any) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.core.plain_worker", "--url", url, "--instance", name]
    args += ["--out", str(tmp / f"{name}.jsonl"), "--ready", str(tmp / f"{name}.ready")]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    with (tmp / f"{name}.log").open("wb") as log:
        return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _records(tmp: Path, name: str) -> list[dict[str, Any]]:
    path = tmp / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _until(predicate: Any, seconds: float, what: str, logs: Any) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.05)


def _anarchon_run(
    tmp: Path, target: str, log_path: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``anarchon run TARGET`` in ``tmp`` (where the application's module is), its output into
    ``log_path``."""
    args = [sys.executable, "-m", "anarchon", "run", target, *options]
    with log_path.open("wb") as log:
        return subprocess.Popen(args, cwd=tmp, env=env, stdout=log, stderr=log)


def test_an_instance_with_every_thread_hung_leaves_its_slots_and_still_stops(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'anarchon.db'}"
    procs: list[subprocess.Popen[bytes]] = []

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("*.log")))

    def starts(name: str, job: str | None = None) -> list[dict[str, Any]]:
        found = [r for r in _records(tmp_path, name) if r["event"] == "start"]
        return [r for r in found if job is None or r["job"] == job]

    try:
        # 32 plain jobs that hang, max_workers at its default (32): every thread is taken.
        hung = _spawn_plain(tmp_path, url, "hung", hung=32, grace_ms=1_000)
        procs.append(hung)
        _until(lambda: len(starts("hung")) >= 32, 30, "32 hung handlers", logs)
        assert {r["job"] for r in starts("hung")} == {f"hang{n}" for n in range(32)}
        healthy = _spawn_plain(tmp_path, url, "healthy", other_jitter_ms=300)
        procs.append(healthy)
        _until(lambda: (tmp_path / "healthy.ready").exists(), 30, "the healthy instance", logs)
        began = time.time()
        time.sleep(4.0)
        others = [r for r in starts("healthy", "other") if r["t"] >= began]
        assert len(others) >= 3, f"'other' went silent while one instance was hung\n{logs()}"
        assert not [r for r in starts("hung", "other") if r["t"] >= began]
        stopping = time.monotonic()
        hung.send_signal(signal.SIGTERM)
        try:
            code = hung.wait(20)
        except subprocess.TimeoutExpired:
            message = f"the hung instance did not exit after SIGTERM\n{logs()}"
            raise AssertionError(message) from None
        took = time.monotonic() - stopping
        assert code == 0 and took < 15, (code, took)
        log = (tmp_path / "hung.log").read_text()
        assert "abandoning 32 handler thread(s)" in log and "job hang0" in log, log
        assert "not claiming" in log, log
    finally:
        stop_processes(procs, timeout_s=20)


STUBBORN_APP = """
import asyncio, os, signal, threading
from anarchon import MemoryBackend, Scheduler

async def stubborn(ctx):
    while True:  # swallows every cancellation, as a careless retry loop would
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

scheduler = Scheduler(MemoryBackend(), grace_ms=200)
scheduler.add("stubborn", "* * * * * *", stubborn, jitter_ms=0)
threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
scheduler.run()
print("run() returned")
"""


def test_run_returns_after_sigterm_even_if_a_handler_ignores_cancellation() -> None:
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", STUBBORN_APP],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=40,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not exit:\n{exc.stderr!r}") from None
    took = time.monotonic() - began
    assert done.returncode == 0 and "run() returned" in done.stdout, done.stderr
    # Not handed over (a backup would run the slot beside it): left with its lease to expire.
    assert "they ignore cancellation: exiting with 1 handler(s)" in done.stderr, done.stderr
    assert took < 25, took


TWICE_APP = """
import asyncio, json, os, time
from anarchon import Scheduler

scheduler = Scheduler()  # SQLite on $ANARCHON_DB; every option at its default

@scheduler.job("long", os.environ["SCHEDULE"])
async def long(ctx):
    with open(os.environ["OUT"], "a") as out:
        record = {"pid": os.getpid(), "attempt": ctx.attempt, "t": time.time()}
        out.write(json.dumps(record) + "\\n")
    if ctx.attempt == 1:
        await asyncio.sleep(600)
"""


def test_a_second_sigterm_hands_the_run_over_at_once_with_the_defaults(tmp_path: Path) -> None:
    # `anarchon run`, grace_ms 30 s: a deploy tool (or an impatient operator) that signals twice
    # must not wait out the grace, nor kill the process with its run unreleased (the default
    # action of a SIGTERM that nobody catches any more): the run goes to the other instance now.
    (tmp_path / "twiceapp.py").write_text(TWICE_APP)
    out = tmp_path / "starts.jsonl"
    schedule, slot = one_slot(lead_s=8)
    env = {**os.environ, "ANARCHON_DB": str(tmp_path / "anarchon.db")}
    env.update(SCHEDULE=schedule, OUT=str(out))
    env.pop("ANARCHON_BACKEND", None)
    procs: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
    for n in range(2):
        log_path = tmp_path / f"instance{n}.log"
        proc = _anarchon_run(
            tmp_path, "twiceapp:scheduler", log_path, "--log-format", "json", env=env
        )
        procs[proc.pid] = (proc, log_path)

    def starts() -> list[dict[str, Any]]:
        text = out.read_text() if out.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def everything() -> str:
        return "\n".join(f"--- {pid}\n{log.read_text()}" for pid, (_, log) in procs.items())

    def actions(pid: int) -> list[str]:
        lines = procs[pid][1].read_text().splitlines()
        return [json.loads(line).get("action") for line in lines if line.startswith("{")]

    try:
        _until(lambda: starts(), 60, "the slot's first start", everything)
        [first] = starts()
        runner = procs[first["pid"]][0]
        [backup] = [proc for pid, (proc, _) in procs.items() if pid != runner.pid]
        runner.send_signal(signal.SIGTERM)
        _until(lambda: "signal" in actions(runner.pid), 20, "the first signal's log", everything)
        time.sleep(1.0)
        assert runner.poll() is None, f"the runner did not drain its run\n{everything()}"
        second, second_wall = time.monotonic(), time.time()
        runner.send_signal(signal.SIGTERM)
        try:
            code = runner.wait(25)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit after the second SIGTERM\n{everything()}") from None
        # The grace would have held the runner 29 s more.
        assert code == 0 and time.monotonic() - second < 20, (code, everything())
        _until(lambda: len(starts()) == 2, 30, "the backup's start", everything)
        taken = starts()[1]
        assert (taken["pid"], taken["attempt"]) == (backup.pid, 2), starts()
        # Handed over, not left to expire: the lease, renewed until the second signal (every
        # 5 s), would have kept the backup out for 10 s or more.
        assert taken["t"] - second_wall < 8.0, (taken["t"] - second_wall, everything())
        said = actions(runner.pid)
        assert "grace_cut_short" in said and "handed_over" in said, everything()
        assert "Traceback" not in procs[runner.pid][1].read_text(), everything()
    finally:
        stop_processes((proc for proc, _ in procs.values()), timeout_s=40)
    history = asyncio.run(_history(tmp_path / "anarchon.db", "long"))
    runs = [(r.attempt, r.status, r.reason) for r in history if r.slot_ms == slot]
    assert runs == [(2, RunStatus.SUCCEEDED, None), (1, RunStatus.FAILED, "handed over")], runs


SLOW_CLEANUP_APP = """
import asyncio
from anarchon import MemoryBackend, Scheduler

scheduler = Scheduler(MemoryBackend())

@scheduler.job("slow", "* * * * * *", jitter_ms=0)
async def slow(ctx):
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(30)  # cleans up for a long while, then ends
        raise
"""


def test_a_third_sigint_exits_at_once_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "slowapp.py").write_text(SLOW_CLEANUP_APP)
    log_path = tmp_path / "run.log"
    proc = _anarchon_run(tmp_path, "slowapp:scheduler", log_path)

    def logged(text: str) -> Any:
        return lambda: text in log_path.read_text()

    try:
        _until(logged("running slow attempt 1"), 60, "the run", log_path.read_text)
        proc.send_signal(signal.SIGINT)
        _until(logged("SIGINT: stopping"), 20, "the first signal", log_path.read_text)
        proc.send_signal(signal.SIGINT)
        _until(logged("SIGINT while stopping"), 20, "the second signal", log_path.read_text)
        third = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the handler still cleans up: 30 s to go
        code = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log_path.read_text()
    assert code == 130 and time.monotonic() - third < 15, (code, text)
    assert "interrupted while stopping: exiting with 1 handler(s) still running" in text, text
    assert "Traceback" not in text and "ignore cancellation" not in text, text
