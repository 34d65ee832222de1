"""Steering a fleet of three real instance processes on every backend, with the real ``anarchon``
command (issue 13, "Done when"): pause and resume (one job and the whole cluster), a trigger,
retries with ``on_failure``, and the ``missed`` records of a gap in which every instance was
killed (docs/operations.md).

The instances are :mod:`tests.conformance.steering_worker` processes; each writes a JSON line
per handler start and per ``on_failure`` call. The tests read those lines and the backend's
history through ``anarchon history --json``, as an operator would.

Time bounds are generous (a noisy two-core machine): a pause must hold for every slot scheduled
from :data:`PAUSE_BOUND_MS` after the ``anarchon pause`` process returned (the design says "within
a second"; the bound adds a second of margin), and a trigger must run within
:data:`TRIGGER_BOUND_S` (the design says "about a second"; the measured time is printed).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import procs
from tests.conformance.procs import stop_processes
from tests.harness import Harness, Namespace
from tests.nats.servers import _die_with_parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgres", "redis", "nats"]
WAIT_S = 60.0
"""Every wait polls until its condition holds, failing after this long."""
PAUSE_BOUND_MS = 2_000
"""No slot scheduled this long after ``anarchon pause`` returned starts: 1 s + 1 s of margin."""
PAUSE_HELD_MS = PAUSE_BOUND_MS + 3_200
"""How long after ``anarchon pause`` returned the tests resume: :func:`check_paused` then finds
at least two whole slots from :data:`PAUSE_BOUND_MS` to a second before the resume, whatever
millisecond the pause returned at (5 s in the worst case), with 200 ms to spare."""
PAUSE_HELD_MAX_MS = PAUSE_HELD_MS + 5_000
"""How long :func:`resume_time` waits, at most, for what the test also needs before it resumes
(the assertions that follow then say what is missing)."""
TRIGGER_BOUND_S = 10.0
"""A triggered run starts this soon after ``anarchon trigger`` returned (about 1 s expected)."""
KILLED_S = 3.0
"""How long every instance stays killed in the missed-slots test: with the new instances' start
(about 3 s), a gap of about 6 slots of ``beat`` (every second), its older ones claimed at once,
its newer max_late_ms + 5 s after the start."""
SETTLED_S = 2.0
"""A slot of ``flaky`` or ``doomed`` is checked once its last record (flaky: its retry's start;
doomed: its ``on_failure`` call) is this old: a second retry or ``on_failure`` call, from another
instance's poll of the retry request (every second, the default ``control_poll_ms``), would have
come by then, and the checks read the records again after two ``history`` commands."""
SETTLED_MAX_MS = 5_000
"""...or once the slot is this old, whatever it lacks: the checks then say what."""
NEVER_TWICE_S = 3.0
"""How long a test watches, after a triggered run was claimed, for a run that must not start (a
second start of it, or a cancelled trigger's): every instance has polled its requests three
times since (every second, the default ``control_poll_ms``), and each poll claims every due
request of the job at once."""
MISSED_PREFIX = "missed: no instance carried the job from "


def now_ms() -> int:
    return int(time.time() * 1000)


def anarchon(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``anarchon ARGV --backend URL`` as a process; ``check``ed (exit 0). Without
    ``$ANARCHON_REQUESTER``: ``--by`` left out records ``user@host``."""
    env = {k: v for k, v in os.environ.items() if k != "ANARCHON_REQUESTER"}
    out = subprocess.run(
        [sys.executable, "-m", "anarchon", "--log-level", "WARNING", *argv, "--backend", url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, (argv, out.returncode, out.stdout, out.stderr)
    return out


def as_json(url: str, *argv: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(anarchon(url, *argv, "--json").stdout)
    return data


def history(url: str, job: str) -> list[dict[str, Any]]:
    """Every recorded run of ``job`` (``anarchon history --json``), oldest first."""
    runs: list[dict[str, Any]] = as_json(url, "history", job, "-n", "5000")["runs"]
    return runs[::-1]


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    return procs.wait_for(check, what, timeout, every_s=0.2)


def iso_ms(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class Instances:
    """Steering-worker processes on one namespace; every one stopped by its pid afterwards."""

    def __init__(self, url: str, tmp: Path, fleet: str) -> None:
        self.url, self.tmp, self.fleet = url, tmp, fleet
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self, *names: str, default_id: bool = False, env: dict[str, str] | None = None
    ) -> None:
        """Start one process per name and wait until each has started its scheduler;
        ``default_id``: the Scheduler picks its own instance id (the name is the files');
        ``env``: variables added to the processes' environment."""
        for name in names:
            args = [sys.executable, "-m", "tests.conformance.steering_worker", "--url", self.url]
            args += ["--fleet", self.fleet, "--out", str(self.tmp / f"{name}.jsonl")]
            args += ["--ready", str(self.tmp / f"{name}.ready")]
            if not default_id:
                args += ["--instance", name]
            with (self.tmp / f"{name}.log").open("wb") as log:
                self.procs[name] = subprocess.Popen(
                    args,
                    cwd=ROOT,
                    env={**os.environ, **(env or {})},
                    stdout=log,
                    stderr=log,
                    preexec_fn=_die_with_parent,
                )
        for name in names:
            ready = self.tmp / f"{name}.ready"

            def started(name: str = name, ready: Path = ready) -> bool:
                exited = self.procs[name].poll() is not None
                if ready.exists():  # started (and may have exited since, as a test asks)
                    return True
                assert not exited, f"{name} exited early:\n{self.logs()}"
                return False

            wait_for(started, f"{name} to start")

    def kill_all(self) -> None:
        """SIGKILL every running process (no clean stop: its registry record stays)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(30)

    def stop_all(self) -> None:
        stop_processes(self.procs.values())

    def records(self, event: str = "start", job: str | None = None) -> list[dict[str, Any]]:
        found = []
        for name in self.procs:
            path = self.tmp / f"{name}.jsonl"
            if path.exists():
                found += [json.loads(line) for line in path.read_text().splitlines() if line]
        return [r for r in found if r["event"] == event and job in (None, r["job"])]

    def slots(self, job: str) -> set[int]:
        """The slots of ``job`` whose handler started (scheduled runs and catch-ups)."""
        return {r["slot"] for r in self.records(job=job) if r["slot"] is not None}

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-4000:]}" for path in self.tmp.glob("*.log")
        )


@contextlib.contextmanager
def instances(ns: Namespace, tmp_path: Path, fleet: str) -> Iterator[Instances]:
    """:class:`Instances` of ``fleet`` on the test's namespace, every one stopped afterwards."""
    assert ns.url is not None
    made = Instances(ns.url, tmp_path, fleet)
    try:
        yield made
    finally:
        made.stop_all()


@pytest.fixture
def steer(ns: Namespace, tmp_path: Path) -> Iterator[Instances]:
    with instances(ns, tmp_path, "steer") as made:
        yield made


@pytest.fixture
def retry(ns: Namespace, tmp_path: Path) -> Iterator[Instances]:
    with instances(ns, tmp_path, "retry") as made:
        yield made


def paused_records(runs: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    return [
        r
        for r in runs
        if r["status"] == "skipped" and (r["reason"] or "").startswith(f"paused by {by}")
    ]


def resume_time(returned: int, enough: Callable[[int], bool] | None = None) -> int:
    """Wait until :data:`PAUSE_HELD_MS` after ``returned`` (when ``anarchon pause`` returned),
    and, if given, until ``enough(now)``, for at most :data:`PAUSE_HELD_MAX_MS`; returns the
    moment (ms) the test resumes from."""
    time.sleep(max(0, returned + PAUSE_HELD_MS - now_ms()) / 1000)
    while enough is not None and not enough(now := now_ms()):
        if now >= returned + PAUSE_HELD_MAX_MS:
            break
        time.sleep(0.05)
    return now_ms()


def check_paused(
    fleet: Instances, jobs: list[str], by: str, returned: int, resumed: int
) -> dict[str, int]:
    """No slot of ``jobs`` from ``returned + PAUSE_BOUND_MS`` to ``resumed`` started; each is
    recorded once, ``skipped``, ``paused by <by>``. Returns, per job, the newest slot that
    started after the pause minus ``returned`` (ms), for the report."""
    bound = returned + PAUSE_BOUND_MS
    latest: dict[str, int] = {}
    for job in jobs:
        started = fleet.slots(job)
        late = sorted(s for s in started if bound <= s < resumed)
        assert not late, (job, late, returned, fleet.logs())
        latest[job] = max((s for s in started if s < resumed), default=0) - returned
        runs = history(fleet.url, job)
        per_slot = Counter(r["slot_ms"] for r in runs if r["slot_ms"] is not None)
        held = paused_records(runs, by)
        assert held, (job, runs[-10:])
        assert all(per_slot[r["slot_ms"]] == 1 for r in held), (job, held, per_slot)
        window = range(bound - bound % 1000 + 1000, resumed - 1000, 1000)
        assert len(window) >= 2, (bound, resumed)
        paused_slots = {r["slot_ms"] for r in held}
        assert set(window) <= paused_slots, (job, sorted(set(window) - paused_slots))
        assert not set(window) & started, job
    return latest


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_pause_resume_and_trigger_on_three_instances(harness: Harness, steer: Instances) -> None:
    """Three instances with every Scheduler and job option at its default (instance ids
    included) but the schedules: ``tick`` and ``other``, every second."""
    url = steer.url
    steer.spawn("p0", "p1", "p2", default_id=True)
    ids = wait_for(
        lambda: len(found := as_json(url, "instances")["instances"]) == 3 and found,
        "three instances in the registry",
    )
    assert {i["pid"] for i in ids} == {p.pid for p in steer.procs.values()}
    assert all(i["interval_ms"] == 5_000 for i in ids)  # the default heartbeat
    instance_ids = {i["id"] for i in ids}
    wait_for(lambda: steer.slots("tick") and steer.slots("other"), "both jobs to run")

    # 1. One job paused: it stops everywhere, the other keeps running.
    said = anarchon(url, "pause", "tick", "--by", "alice@ops").stdout.strip()
    returned = now_ms()
    assert said == "paused job 'tick' on every instance, until resumed (by alice@ops)"
    [job] = [j for j in as_json(url, "jobs")["jobs"] if j["name"] == "tick"]
    assert job["paused"] is True and job["pause"]["by"] == "alice@ops", job

    def other_ran(now: int) -> bool:
        return len([s for s in steer.slots("other") if returned + PAUSE_BOUND_MS <= s < now]) >= 3

    resumed = resume_time(returned, other_ran)
    assert "resumed job 'tick'" in anarchon(url, "resume", "tick").stdout
    latest = check_paused(steer, ["tick"], "alice@ops", returned, resumed)
    ran = sorted(s for s in steer.slots("other") if returned + PAUSE_BOUND_MS <= s < resumed)
    assert len(ran) >= 3, (ran, steer.logs())  # the other job kept running
    wait_for(lambda: any(s > resumed for s in steer.slots("tick")), "tick to run again")
    print(f"[{harness.name}] pause tick: newest slot started {latest['tick']} ms after return")

    # The whole cluster paused (by whoever runs the command: --by at its default): both jobs
    # hold; resumed, both run again.
    said = anarchon(url, "pause", "--all").stdout.strip()
    returned = now_ms()
    by = f"{getpass.getuser()}@{socket.gethostname()}"
    assert said == f"paused every job on every instance, until resumed (by {by})", said
    resumed = resume_time(returned)
    assert "ended the whole-cluster pause" in anarchon(url, "resume", "--all").stdout
    latest = check_paused(steer, ["tick", "other"], f"{by} (all jobs)", returned, resumed)

    def again() -> bool:
        return all(any(s > resumed for s in steer.slots(n)) for n in ("tick", "other"))

    wait_for(again, "both jobs to run again")
    print(f"[{harness.name}] pause --all: newest slots after return (ms): {latest}")

    # 2. A trigger: one run, on one of the three, trigger manual, requested_by the --by value.
    # tick runs every second with overlap='skip': a manual run claimed while that second's run
    # holds its lease is rightly recorded as skipped for overlap; then the test asks again.
    for _ in range(3):
        sent = time.time()
        request_id = anarchon(url, "trigger", "tick", "--by", "carol@ops").stdout.strip()
        asked = time.time()
        fate = wait_for(
            partial(_trigger_fate, steer, request_id),
            "the triggered run",
            timeout=TRIGGER_BOUND_S + 20,
        )
        if fate == "ran":
            break
        [skip] = [r for r in history(url, "tick") if r["run_id"] == request_id]
        assert skip["trigger"] == "manual" and skip["status"] == "skipped", skip
        assert skip["reason"].startswith("overlap: "), skip
        assert not _manual(steer, request_id), skip
        print(f"[{harness.name}] trigger {request_id} skipped ({skip['reason']}); asking again")
    else:
        raise AssertionError("three triggers in a row were skipped for overlap")
    [start] = _manual(steer, request_id)
    seen = time.monotonic()
    took = start["t"] - asked
    assert start["trigger"] == "manual" and start["slot"] is None and start["retry"] == 0
    assert start["instance"] in instance_ids, (start, instance_ids)
    assert took < TRIGGER_BOUND_S, took
    print(
        f"[{harness.name}] trigger: ran on {start['instance']} {took:.2f} s after the command "
        f"returned ({start['t'] - sent:.2f} s after it was started)"
    )
    [run] = [r for r in history(url, "tick") if r["run_id"] == request_id]
    assert run["trigger"] == "manual", run
    assert run["requested_by"] == "carol@ops" and run["status"] == "succeeded", run
    assert run["instance"] == start["instance"] and run["slot_ms"] is None
    watched_since(seen)
    assert len(started := _manual(steer, request_id)) == 1, started


def watched_since(seen: float) -> None:
    """Sleep out what is left of :data:`NEVER_TWICE_S` since ``seen`` (``time.monotonic()``)."""
    time.sleep(max(0.0, seen + NEVER_TWICE_S - time.monotonic()))


def _manual(fleet: Instances, request_id: str) -> list[dict[str, Any]]:
    """The handler starts of the run triggered by ``request_id``."""
    return [r for r in fleet.records(job="tick") if r["run_id"] == request_id]


def _trigger_fate(fleet: Instances, request_id: str) -> str | None:
    """``ran`` once the triggered run started, ``skipped`` once it is recorded without
    running (its claim met the scheduled run's lease: overlap='skip'), else None."""
    if _manual(fleet, request_id):
        return "ran"
    recorded = [r for r in history(fleet.url, "tick") if r["run_id"] == request_id]
    return "skipped" if recorded and recorded[0]["status"] == "skipped" else None


def _settled_until(fleet: Instances) -> int:
    """A slot (ms) before which every first run of ``flaky`` and ``doomed`` has settled: its
    last record written :data:`SETTLED_S` ago, or the slot older than :data:`SETTLED_MAX_MS`."""
    now = time.time()
    last = {("flaky", r["slot"]): r["t"] for r in fleet.records(job="flaky") if r["retry"] == 1}
    last |= {("doomed", r["slot"]): r["t"] for r in fleet.records("on_failure")}
    firsts: list[tuple[int, str]] = sorted(
        (r["slot"], job)
        for job in ("flaky", "doomed")
        for r in fleet.records(job=job)
        if r["retry"] == 0
    )
    for slot, job in firsts:
        written = last.get((job, slot), now)
        if written > now - SETTLED_S and slot > now * 1000 - SETTLED_MAX_MS:
            return slot
    return firsts[-1][0] + 1 if firsts else 0


def _settled(fleet: Instances, job: str, until: int) -> list[int]:
    """The slots of ``job`` whose first run started and are older than ``until``."""
    return sorted(
        r["slot"] for r in fleet.records(job=job) if r["retry"] == 0 and r["slot"] < until
    )


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_retries_and_missed_slots_on_three_instances(harness: Harness, retry: Instances) -> None:
    url = retry.url
    retry.spawn("w0", "w1", "w2")

    # 3. Retries: flaky fails its first run and succeeds on its retry; doomed fails both, and
    # on_failure is called once per slot across the fleet.
    def enough() -> int | None:
        settled = _settled_until(retry)
        three = all(len(_settled(retry, job, settled)) >= 3 for job in ("flaky", "doomed"))
        return settled if three else None

    settled = wait_for(enough, "three slots of flaky and doomed to settle")
    flaky = history(url, "flaky")
    for slot in _settled(retry, "flaky", settled):
        starts = [r for r in retry.records(job="flaky") if r["slot"] == slot]
        assert sorted(r["retry"] for r in starts) == [0, 1], (slot, starts, retry.logs())
        first, again = sorted(starts, key=lambda r: r["retry"])
        assert (first["trigger"], again["trigger"]) == ("schedule", "retry"), starts
        runs = [r for r in flaky if r["slot_ms"] == slot]
        assert [(r["status"], r["trigger"]) for r in runs] == [
            ("failed", "schedule"),
            ("succeeded", "retry"),
        ], runs
        assert "flaky fails its first run" in runs[0]["error"], runs
        if runs[0]["fence"] is not None:
            assert runs[1]["fence"] > runs[0]["fence"], runs
    doomed = history(url, "doomed")
    failures = Counter(r["slot"] for r in retry.records("on_failure"))
    for slot in _settled(retry, "doomed", settled):
        starts = [r for r in retry.records(job="doomed") if r["slot"] == slot]
        assert sorted(r["retry"] for r in starts) == [0, 1], (slot, starts)
        runs = [r for r in doomed if r["slot_ms"] == slot]
        assert [(r["status"], r["trigger"]) for r in runs] == [
            ("failed", "schedule"),
            ("failed", "retry"),
        ], runs
        assert failures[slot] == 1, (slot, failures, retry.logs())
    hooked = [r for r in retry.records("on_failure") if r["slot"] < settled]
    assert {r["trigger"] for r in hooked} == {"retry"}, hooked  # the final failure's run
    assert all(r["job"] == "doomed" for r in retry.records("on_failure"))

    # 4. Missed: every instance killed for KILLED_S, then three new ones started.
    wait_for(lambda: len(retry.slots("beat")) >= 3, "beat to run")
    retry.kill_all()
    killed = now_ms()
    before = history(url, "beat")
    last = max(r["slot_ms"] for r in before if r["slot_ms"] is not None)
    time.sleep(KILLED_S)
    restarted = now_ms()
    retry.spawn("r0", "r1", "r2")

    # The first slot an instance's timer claimed after the restart (run, or skipped as too
    # late): every slot from the last recorded one to it was in the gap.
    def after() -> list[int]:
        runs = history(url, "beat")
        return [
            r["slot_ms"]
            for r in runs
            if r["trigger"] == "schedule" and r["status"] != "missed" and r["slot_ms"] > last
        ]

    first = min(wait_for(after, "a scheduled slot of beat after the restart"))
    gap = range(last + 1000, first, 1000)

    def whole() -> list[dict[str, Any]]:
        # The newer slots of the gap are recorded max_late_ms + jitter_ms + 5 s after the start.
        runs = [r for r in history(url, "beat") if r["slot_ms"] in gap]
        return runs if {r["slot_ms"] for r in runs} == set(gap) else []

    wait_for(whole, "a record of every slot of the gap")
    time.sleep(2)  # the others have started and read the backend too
    runs = whole()
    assert sorted(r["slot_ms"] for r in runs) == list(gap), runs  # each slot once
    missed = [r for r in runs if r["status"] == "missed"]
    caught = [r for r in runs if r["trigger"] == "catch-up"]
    assert len(missed) + len(caught) == len(gap), runs  # nobody else ran them
    assert len(caught) == (0 if harness.name == "nats" else 1), caught  # catch_up='latest'
    assert not caught or caught[0]["slot_ms"] == gap[-1], (caught, gap)
    slots = [r["slot_ms"] for r in missed]
    assert 1 <= len(slots) <= 20, slots  # a gap of about 9 s: every slot recorded
    assert not set(slots) & retry.slots("beat"), "a missed slot ran"
    for r in missed:
        reason = r["reason"]
        match = re.fullmatch(re.escape(MISSED_PREFIX) + r"(\S+) to (\S+)", reason)
        assert match, reason  # under 20 slots: no "in all" summary
        gap_from, gap_to = iso_ms(match[1]), iso_ms(match[2])
        # The gap starts at the newest record the recording instance saw: the last slot run
        # before the kill, or a slot another restarted instance had already recorded missed.
        assert last <= gap_from < r["slot_ms"], (reason, last, killed)
        assert restarted <= gap_to <= first + 1000, (reason, restarted, first)
    print(
        f"[{harness.name}] missed: {len(slots)} slot(s) recorded of a "
        f"{len(gap)}-slot gap; catch-up ran {len(caught)}"
    )

    slot = slots[len(slots) // 2]
    said = anarchon(url, "explain", "beat", str(slot)).stdout
    assert "missed" in said and "no instance carried the job from" in said, said
    fate = as_json(url, "explain", "beat", str(slot))
    assert fate["fate"] == "missed" and fate["reason"].startswith(MISSED_PREFIX), fate


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_a_cancelled_trigger_never_runs_on_three_instances(
    harness: Harness, steer: Instances
) -> None:
    """Two triggers wait while every instance is killed; ``anarchon cancel`` cancels one. Once
    the instances are back, the other is claimed (run, or skipped for overlap) and the cancelled
    one never starts: history holds it once, skipped, ``cancelled by ops``."""
    url = steer.url
    steer.spawn("w0", "w1", "w2")
    wait_for(lambda: len(steer.slots("tick")) >= 2, "tick to run")
    steer.kill_all()
    # The killed instances' records still name tick: the trigger is stored, with a warning.
    cancelled = anarchon(url, "trigger", "tick").stdout.strip()
    kept = anarchon(url, "trigger", "tick").stdout.strip()
    listed = {r["id"] for r in as_json(url, "requests")["requests"]}
    assert listed == {cancelled, kept}, listed
    said = anarchon(url, "cancel", cancelled, "--by", "ops").stdout
    assert said.strip().startswith(f"cancelled trigger {cancelled} of job 'tick'"), said
    steer.spawn("r0", "r1", "r2")

    def decided() -> bool:
        return any(r["run_id"] == kept for r in history(url, "tick"))

    wait_for(decided, "the kept trigger to be claimed", timeout=TRIGGER_BOUND_S + 20)
    seen = time.monotonic()
    [record] = [r for r in history(url, "tick") if r["run_id"] == cancelled]
    assert (record["status"], record["reason"]) == ("skipped", "cancelled by ops"), record
    assert record["skip_cause"] == "cancelled", record
    watched_since(seen)
    assert not _manual(steer, cancelled), steer.logs()
    assert as_json(url, "requests")["requests"] == []
