"""The registry with real processes: three instances on SQLite and on PostgreSQL, read with the
``anarchon instances`` and ``anarchon jobs`` commands as an operator would (docs/operations.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import procs
from tests.conformance.procs import stop_processes
from tests.harness import Namespace

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgres"]
# Generous: the machine may be loaded; each wait polls until it holds.
WAIT_S = 60.0


def anarchon(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon", "--log-level", "WARNING", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def read_json(*argv: str) -> dict[str, Any]:
    out = anarchon(*argv, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def wait_for(check: Callable[[], Any], what: str) -> Any:
    return procs.wait_for(check, what, WAIT_S)


class Instances:
    """Worker processes; all stopped afterwards."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, schedule: str, heartbeat_ms: int | None) -> None:
        ready = self.tmp / f"{name}.ready"
        args = [sys.executable, "-m", "tests.conformance.registry_worker", "--url", self.url]
        args += ["--instance", name, "--schedule", schedule, "--ready", str(ready)]
        if heartbeat_ms is not None:
            args += ["--heartbeat-ms", str(heartbeat_ms)]
        with (self.tmp / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log)
        wait_for(ready.exists, f"{name} to start")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def stop_all(self) -> None:
        stop_processes(self.procs.values())


@pytest.fixture
def instances(ns: Namespace, tmp_path: Path) -> Iterator[Instances]:
    assert ns.url is not None
    made = Instances(ns.url, tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def live(url: str) -> dict[str, dict[str, Any]]:
    return {i["id"]: i for i in read_json("instances", "--backend", url)["instances"]}


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_three_instances_drift_and_a_killed_one_disappears(instances: Instances) -> None:
    url = instances.url
    for name, schedule in (("w0", "0 0 1 1 *"), ("w1", "0 0 1 1 *"), ("w2", "0 0 2 1 *")):
        instances.spawn(name, schedule, heartbeat_ms=300)

    found = wait_for(lambda: (seen := live(url)).keys() == {"w0", "w1", "w2"} and seen, "three")
    for record in found.values():
        assert record["heartbeat_age_ms"] < 10_000, record
        assert record["interval_ms"] == 300
        assert record["pid"] == instances.procs[record["id"]].pid
        assert [job["name"] for job in record["jobs"]] == ["sync"]

    warning = "job 'sync' is defined differently: '0 0 1 1 *' in UTC on w0, w1; '0 0 2 1 *'"
    wait_for(lambda: any(warning in instances.log(n) for n in ("w0", "w1", "w2")), "the warning")
    for name in ("w0", "w1", "w2"):  # once per drift, however many heartbeats
        assert instances.log(name).count("is defined differently") <= 1

    table = anarchon("jobs", "--backend", url)
    assert table.returncode == 0, table.stderr
    assert "sync*" in table.stdout and "definitions differ" in table.stdout, table.stdout
    assert all(len(line) <= 100 for line in table.stdout.splitlines()), table.stdout
    (job,) = read_json("jobs", "--backend", url)["jobs"]
    assert job["name"] == "sync" and job["expression"] == "0 0 1 1 *"
    assert job["instances"] == ["w0", "w1", "w2"]
    assert [v["instances"] for v in job["drift"]["variants"]] == [["w0", "w1"], ["w2"]]

    instances.procs["w1"].kill()  # no clean stop: the others remove it after 6 heartbeats
    wait_for(lambda: live(url).keys() == {"w0", "w2"}, "w1 to be removed")
    text = anarchon("instances", "--backend", url)
    assert text.returncode == 0, text.stderr
    assert "w0" in text.stdout and "w1" not in text.stdout, text.stdout


@pytest.mark.parametrize("harness", ["sqlite", "postgres", "redis", "nats"], indirect=True)
def test_when_every_instance_is_killed_none_is_live(instances: Instances) -> None:
    """kill -9 every instance: nobody is left to remove their records, yet after six of their
    heartbeats every command agrees that none is live (docs/operations.md)."""
    url = instances.url
    for name in ("w0", "w1"):
        instances.spawn(name, "* * * * * *", heartbeat_ms=300)
    wait_for(lambda: live(url).keys() == {"w0", "w1"}, "two live instances")
    for proc in instances.procs.values():
        proc.kill()
        proc.wait(30)

    def none_live() -> dict[str, Any] | None:
        found = read_json("instances", "--backend", url)
        return found if not found["instances"] else None

    found = wait_for(none_live, "no live instance")
    assert sorted(i["id"] for i in found.get("silent", [])) == ["w0", "w1"]
    for record in found["silent"]:
        assert record["heartbeat_age_ms"] > 6 * 300, record
    text = anarchon("instances", "--backend", url)
    assert text.returncode == 0 and "no live instances in" in text.stdout, text
    assert "not live (silent for over 6 of their heartbeats" in text.stdout, text.stdout
    assert read_json("jobs", "--backend", url)["jobs"] == []
    table = anarchon("jobs", "--backend", url)
    assert table.returncode == 0 and "no live instance carries a job" in table.stdout, table
    for argv, consequence in (
        (("trigger", "sync"), "the request waits until one does"),
        (("pause", "sync"), "the pause holds once one carries it"),
    ):
        out = anarchon(*argv, "--backend", url)
        assert out.returncode == 0, out
        warning = f"anarchon: warning: no live instance carries job 'sync': {consequence}"
        assert warning in out.stderr, out.stderr


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_every_option_at_its_default(instances: Instances) -> None:
    url = instances.url
    instances.spawn("w0", "0 0 1 1 *", heartbeat_ms=None)
    record = wait_for(lambda: live(url).get("w0"), "w0 to record itself")
    assert record["interval_ms"] == 5_000
    assert record["heartbeat_age_ms"] < 30_000
    instances.procs["w0"].send_signal(signal.SIGTERM)
    assert instances.procs["w0"].wait(60) == 0
    assert live(url) == {}  # a clean stop removes the record at once


def test_reading_commands_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    for command in ("jobs", "instances"):
        out = anarchon(command, "--backend", f"sqlite:///{missing}")
        assert out.returncode == 3, out
        assert f"no anarchon data at {missing}" in out.stderr
    assert not missing.exists()
    env_out = subprocess.run(
        [sys.executable, "-m", "anarchon", "instances"],
        cwd=tmp_path,
        env={**os.environ, "ANARCHON_BACKEND": f"sqlite:///{missing}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert env_out.returncode == 3, env_out
    assert not missing.exists()
