"""``anarchon run`` signalled while it still imports the application (before the event loop's
handlers exist): a real process on SQLite, defaults. It exits 0 without starting the scheduler,
as the exit-code table says for ``run`` stopped by SIGINT or SIGTERM; a second signal then
gets its default action, so an import stuck for ever can still be ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SLOW_APP = """
import os, pathlib, time
pathlib.Path(os.environ["IMPORTING"]).write_text("x")
time.sleep(float(os.environ.get("IMPORT_S", "4")))  # a slow import (a driver, a big app)
from anarchon import Scheduler

scheduler = Scheduler()

@scheduler.job("tick", "* * * * * *")
def tick(ctx):
    with open(os.environ["OUT"], "a") as out:
        out.write("ran\\n")
"""


def _start(tmp: Path, import_s: float) -> tuple[subprocess.Popen[bytes], Path, Path]:
    (tmp / "slowapp.py").write_text(SLOW_APP)
    importing, out, log = tmp / "importing", tmp / "out.txt", tmp / "run.log"
    env = {**os.environ, "ANARCHON_DB": str(tmp / "anarchon.db")}
    env.update(IMPORTING=str(importing), OUT=str(out), IMPORT_S=str(import_s))
    env.pop("ANARCHON_BACKEND", None)
    args = [sys.executable, "-m", "anarchon", "run", "slowapp:scheduler"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(args, cwd=tmp, env=env, stdout=sink, stderr=sink)
    deadline = time.monotonic() + 60
    while not importing.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"the app was never imported\n{log.read_text()}")
        time.sleep(0.05)
    return proc, out, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_apps_import_exits_0_without_starting(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc, out, log = _start(tmp_path, import_s=4)
    try:
        proc.send_signal(sig)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 0, (code, text)
    assert "Traceback" not in text, text
    assert f"{sig.name} before the scheduler started: not starting it" in text, text
    assert not out.exists(), "a handler ran"


def test_a_second_signal_during_a_stuck_import_gets_its_default_action(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path, import_s=600)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert proc.poll() is None, "the first SIGTERM is held until the import ends"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == -signal.SIGTERM, (code, log.read_text())
