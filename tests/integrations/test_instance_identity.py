"""Who is who in the registry, with real ``anarchon run`` processes on SQLite, every option at
its default, and on Redis, every option at its default but a 2 s heartbeat (the tests wait out
heartbeats, up to 9 of them): two processes given one ``instance_id`` are found and reported
(logs, ``anarchon instances``, ``anarchon health``), while a process restarted under the id of
one just killed is not; and ``anarchon health`` on a host where a sibling was killed with
SIGKILL reports the survivors' health, not the dead record's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.procs import STARTED, Proc, Procs, processes

pytestmark = pytest.mark.slow

APP = """
import os

from anarchon import RunContext, Scheduler

beat = os.environ.get("APP_HEARTBEAT_MS")
scheduler = Scheduler(
    os.environ["APP_BACKEND"],
    instance_id=os.environ.get("APP_ID") or None,
    **({"heartbeat_ms": int(beat)} if beat else {}),
)


@scheduler.job("tick", "* * * * * *")
async def tick(ctx: RunContext) -> None:
    ctx.logger.info("tick slot=%s instance=%s", ctx.slot.isoformat(), ctx.instance)
"""

SHARED = re.compile(r"ERROR .*instance id 'pod-1' is used by two processes")
BEAT_S = 5  # the default heartbeat_ms
SHORT_BEAT_S = 2  # on Redis (SQLite keeps the default)


def beat_of(url: str) -> int:
    """The heartbeat (s) the tests give the instances on ``url``: see the module's docstring."""
    return BEAT_S if url.startswith("sqlite") else SHORT_BEAT_S


@pytest.fixture(params=["sqlite", "redis"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'anarchon.db'}"
        return
    import redis

    prefix = f"test-identity-{uuid.uuid4().hex[:8]}:"
    yield f"redis://127.0.0.1:6379/0?prefix={prefix}"
    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def run(procs: Procs, tmp: Path, url: str, instance_id: str | None, beat_s: int = BEAT_S) -> Proc:
    """An ``anarchon run`` of :data:`APP` on ``url``; every option at its default but a
    ``beat_s`` other than :data:`BEAT_S`."""
    (tmp / "app.py").write_text(APP)
    path = os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p)
    env = {"APP_BACKEND": url, "APP_ID": instance_id or "", "PYTHONPATH": path}
    if beat_s != BEAT_S:
        env["APP_HEARTBEAT_MS"] = str(beat_s * 1000)
    return procs.start([sys.executable, "-m", "anarchon", "run", "app:scheduler"], env)


def anarchon(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args, "--backend", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def reported_shared(url: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``anarchon health --instance pod-1 --json`` once it reports the id used by two processes:
    each process wrote what it found in the record at the beat it found it (a beat reads, then
    writes), so the record carries it from the first write after both were found on."""
    deadline = time.monotonic() + timeout
    while True:
        health = anarchon(url, "health", "--instance", "pod-1", "--json")
        if "used by two processes" in health.stdout or time.monotonic() >= deadline:
            return health
        time.sleep(0.2)


def test_two_processes_with_one_instance_id_are_reported(tmp_path: Path, backend_url: str) -> None:
    beat_s = beat_of(backend_url)
    with processes(tmp_path) as procs:
        first = run(procs, tmp_path, backend_url, "pod-1", beat_s)
        first.wait_for(STARTED, timeout=30)
        second = run(procs, tmp_path, backend_url, "pod-1", beat_s)
        second.wait_for(STARTED, timeout=30)
        # Each finds the other's write at its next beat after the other wrote (within 2).
        first.wait_for(SHARED, timeout=4 * beat_s)
        second.wait_for(SHARED, timeout=4 * beat_s)
        found = time.monotonic()
        health = reported_shared(backend_url, timeout=2 * beat_s + 2)
        listed = anarchon(backend_url, "instances")
        listed_json = anarchon(backend_url, "instances", "--json")
        # Each beats again before it stops: a second report of the same process would be
        # logged then (counted below).
        time.sleep(max(0.0, found + beat_s + 1 - time.monotonic()))
        for proc in (first, second):
            code, _ = proc.stop(signal.SIGTERM)
            assert code == 0, proc.text()
    pids = {first.proc.pid, second.proc.pid}
    for proc, other in ((first, second), (second, first)):
        lines = SHARED.findall(proc.text())
        assert len(lines) == 1, proc.text()  # once per other process
        assert f"pid {other.proc.pid}" in proc.text().split("is used by two processes")[1]
    assert health.returncode == 1, (health.stdout, health.stderr)
    report = json.loads(health.stdout)
    assert any("used by two processes" in p for p in report["problems"]), report
    assert "is used by two processes" in listed.stdout, listed.stdout
    (record,) = json.loads(listed_json.stdout)["instances"]
    assert record["shared_with"] is not None and record["pid"] in pids
    assert int(record["shared_with"].rsplit(" ", 1)[1]) in pids - {record["pid"]}


def test_a_restart_under_the_id_of_a_process_just_killed_is_not_reported(
    tmp_path: Path, backend_url: str
) -> None:
    beat_s = beat_of(backend_url)
    with processes(tmp_path) as procs:
        killed = run(procs, tmp_path, backend_url, "pod-1", beat_s)
        killed.wait_for(STARTED, timeout=30)
        time.sleep(1)
        killed.stop(signal.SIGKILL)  # its record stays, fresh, under the id
        restarted = run(procs, tmp_path, backend_url, "pod-1", beat_s)
        restarted.wait_for(STARTED, timeout=30)
        time.sleep(3 * beat_s)
        health = anarchon(backend_url, "health", "--instance", "pod-1")
        code, _ = restarted.stop(signal.SIGTERM)
    assert code == 0, restarted.text()
    assert "used by two processes" not in restarted.text(), restarted.text()
    assert health.returncode == 0, (health.stdout, health.stderr)


def health_of_host(url: str) -> tuple[int, dict[str, object]]:
    done = anarchon(url, "health", "--json")
    return done.returncode, json.loads(done.stdout)


def _records(report: dict[str, object]) -> list[dict[str, Any]]:
    """The registry records a ``health --json`` report shows (none in a report of no data)."""
    return report.get("instances", [])  # type: ignore[return-value]


def _pids(report: dict[str, object]) -> set[int]:
    return {r["pid"] for r in _records(report)}


def test_health_of_a_host_whose_sibling_was_killed_is_the_survivors(
    tmp_path: Path, backend_url: str
) -> None:
    """Two schedulers on this host (workers of one pod); one is killed with SIGKILL. Its record
    stays until the survivor's heartbeat removes it (6 heartbeats), stale from 3: the host's
    health stays the survivor's all along, and fails once no scheduler runs here."""
    beat_s = beat_of(backend_url)
    with processes(tmp_path) as procs:
        killed = run(procs, tmp_path, backend_url, None, beat_s)
        survivor = run(procs, tmp_path, backend_url, None, beat_s)
        killed.wait_for(STARTED, timeout=30)
        survivor.wait_for(STARTED, timeout=30)
        deadline = time.monotonic() + 60
        while _pids(health_of_host(backend_url)[1]) != {killed.proc.pid, survivor.proc.pid}:
            assert time.monotonic() < deadline, "both not recorded in 60 s"
            time.sleep(0.5)
        assert health_of_host(backend_url)[0] == 0
        killed.stop(signal.SIGKILL)
        began = time.monotonic()
        readings = []
        # Until the record, seen gone, is removed; at most 6 heartbeats and one after the kill.
        while time.monotonic() - began < 7 * beat_s + 3:
            readings.append((round(time.monotonic() - began), *health_of_host(backend_url)))
            gone = [r for _, _, report in readings for r in _records(report) if r["gone"]]
            if gone and killed.proc.pid not in _pids(readings[-1][2]):
                break
            time.sleep(2)
        assert all(code == 0 for _, code, _ in readings), readings
        assert gone and {r["pid"] for r in gone} == {killed.proc.pid}, readings
        survivor.stop(signal.SIGKILL)
        # Its record goes stale 3 heartbeats after its last: then no scheduler runs here.
        deadline = time.monotonic() + 3 * beat_s + 30
        while (failed := health_of_host(backend_url))[0] == 0 and time.monotonic() < deadline:
            time.sleep(1)
        code, report = failed
    assert code == 1, report
