"""A handler that forks (``os.fork()``) a child which does its work and calls ``sys.exit(0)``,
the parent waiting for it: real ``anarchon run`` processes, every option at its default, on
SQLite and on Redis, with a plain and an async handler.

The child ends as it asked (its ``sys.exit()`` comes out of the handler: the child exits there,
``os._exit``), the parent's run is recorded ``succeeded`` once per slot, and SIGTERM stops the
instance at once. Before, the scheduler took the child's ``SystemExit`` as the run's failure and
the child ran on as a copy of the scheduler: a plain handler's child waited for ever on the
handler thread's queue (deaf to SIGTERM, so the parent's wait and its run never ended), an async
handler's child ran the event loop on the parent's backend connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.backends.redis import SERVER, delete_prefix, reachable, unique_prefix
from tests.reaping import is_same, kill_if_same

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = """
import asyncio, os, sys, time
from anarchon import Scheduler

scheduler = Scheduler()

def child(ctx):
    with open(os.environ["CHILDREN"], "a") as out:
        out.write(f"{os.getpid()}\\n")
    time.sleep(0.3)  # the child's work
    sys.exit(0)

def done(ctx):
    with open(os.environ["OUT"], "a") as out:
        out.write(f"{ctx.slot.timestamp()}\\n")

if os.environ["KIND"] == "plain":
    @scheduler.job("forks", "*/2 * * * * *")
    def forks(ctx):
        pid = os.fork()
        if pid == 0:
            child(ctx)
        os.waitpid(pid, 0)
        done(ctx)
else:
    @scheduler.job("forks", "*/2 * * * * *")
    async def forks(ctx):
        pid = os.fork()
        if pid == 0:
            child(ctx)
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            await asyncio.sleep(0.05)
        done(ctx)
"""


def _alive(pid: int, cwd: Path) -> bool:
    """Whether the child ``pid`` still runs: a process with that pid in the test's folder (a pid
    that was freed may be another process's by now)."""
    return is_same(pid, cwd=cwd)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
@pytest.mark.parametrize("kind", ["plain", "async"])
def test_a_child_forked_by_a_handler_ends_with_its_sys_exit(
    tmp_path: Path, kind: str, backend: str
) -> None:
    env = {**os.environ, "KIND": kind, "ANARCHON_DB": str(tmp_path / "anarchon.db")}
    env.pop("ANARCHON_BACKEND", None)
    prefix = None
    if backend == "redis":
        if not asyncio.run(reachable(SERVER)):
            pytest.skip(f"no Redis at {SERVER}")
        prefix = unique_prefix()
        env["ANARCHON_BACKEND"] = f"{SERVER}?prefix={prefix}"
    out, children = tmp_path / "out.txt", tmp_path / "children.txt"
    env.update(OUT=str(out), CHILDREN=str(children))
    (tmp_path / "forkapp.py").write_text(APP)
    log = tmp_path / "run.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "anarchon", "run", "forkapp:scheduler"],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=sink,
        )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().split()) >= 3:
                break
            time.sleep(0.2)
        ran = out.read_text().split() if out.exists() else []
        pids = [int(p) for p in children.read_text().split()] if children.exists() else []
        tail = log.read_text()[-3000:]
        assert len(ran) >= 3, f"the parent's runs did not end: {ran}, children {pids}\n{tail}"
        time.sleep(1)  # a child that exited is gone (reaped by its parent) by now
        alive = [p for p in pids if _alive(p, tmp_path)]
        assert not alive, f"forked children still running: {alive}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        history = subprocess.run(
            [sys.executable, "-m", "anarchon", "history", "forks", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if children.exists():
            for pid in map(int, children.read_text().split()):
                kill_if_same(pid, cwd=tmp_path)  # the old code's children, by pid and folder
        if prefix is not None:
            asyncio.run(delete_prefix(SERVER, prefix))
    runs = json.loads(history.stdout)["runs"]
    assert runs and all(r["status"] == "succeeded" for r in runs), runs
    slots = Counter(r["slot_ms"] for r in runs)
    assert max(slots.values()) == 1, slots
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
