"""``anarchon run`` stopped by SIGTERM or SIGINT at any moment of its start-up ends the
documented way (exit 0, no traceback), both ways in: ``python -m anarchon`` and the console
script. Real processes on SQLite, every option at its default.

Importing anarchon takes seconds on a loaded host. Before, the command's handlers came only
after that import (``anarchon.cli`` and the package it pulls in), and a deploy's SIGTERM
meanwhile killed the process (exit 143; SIGINT: a traceback, exit 1). To land a signal in that
window every time, a ``sitecustomize`` of the test's own makes one module's import wait (and
says when it waits); nothing of anarchon's is changed for it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os
from anarchon import Scheduler

scheduler = Scheduler()

@scheduler.job("tick", "* * * * * *")
def tick(ctx):
    with open(os.environ["OUT"], "a") as out:
        out.write("ran\\n")
"""

#: Makes the import of $SLOW_IMPORT wait $IMPORT_S seconds, after writing the file $IMPORTING.
SITECUSTOMIZE = """
import os, sys, time

class _SlowImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("SLOW_IMPORT"):
            sys.meta_path.remove(self)
            with open(os.environ["IMPORTING"], "w") as marker:
                marker.write(name)
            time.sleep(float(os.environ["IMPORT_S"]))
        return None

sys.meta_path.insert(0, _SlowImport())
"""


def _command(entry: str) -> list[str]:
    if entry == "module":
        return [sys.executable, "-m", "anarchon"]
    script = Path(sys.executable).with_name("anarchon")  # the console script of this venv
    if not script.exists():
        pytest.skip(f"no console script at {script}")
    return [sys.executable, str(script)]


def _env(tmp: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_DB", "ANARCHON_BACKEND")}
    paths = [str(tmp / "hook"), env.get("PYTHONPATH", str(ROOT / "src"))]
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        ANARCHON_DB=str(tmp / "anarchon.db"),
        OUT=str(tmp / "out.txt"),
        **more,
    )
    return env


def _spawn(tmp: Path, entry: str, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp / "hook").mkdir(exist_ok=True)
    (tmp / "hook" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp / "cronapp.py").write_text(APP)
    log = tmp / "run.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*_command(entry), "run", "cronapp:scheduler"],
            cwd=tmp,
            env=_env(tmp, **env),
            stdout=sink,
            stderr=sink,
        )
    return proc, log


def _importing(proc: subprocess.Popen[bytes], log: Path, importing: Path, slow: str) -> None:
    """Wait until ``proc`` waits in the import of ``slow`` (the hook wrote ``importing``)."""
    deadline = time.monotonic() + 60
    while not importing.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"{slow} was never imported\n{log.read_text()}")
        time.sleep(0.02)


def _ended(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("entry", "slow", "sig"),
    [
        ("module", "anarchon.cli", signal.SIGTERM),
        ("script", "anarchon.cli", signal.SIGINT),
        ("module", "anarchon._scheduler", signal.SIGINT),
        ("script", "anarchon._scheduler", signal.SIGTERM),
    ],
)
def test_a_signal_while_anarchon_itself_is_imported_exits_0(
    tmp_path: Path, entry: str, slow: str, sig: signal.Signals
) -> None:
    importing = tmp_path / "importing"
    proc, log = _spawn(tmp_path, entry, SLOW_IMPORT=slow, IMPORTING=str(importing), IMPORT_S="3")
    _importing(proc, log, importing, slow)
    proc.send_signal(sig)  # while the import of `slow` waits: before, 143 (SIGINT: exit 1)
    code = _ended(proc, 60)
    text = log.read_text()
    assert code == 0, (code, text)
    assert "Traceback" not in text, text
    assert f"{sig.name} before the scheduler started: not starting it" in text, text
    assert not (tmp_path / "out.txt").exists(), "a handler ran"


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM now (Linux: /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_sigterm_at_any_moment_of_the_start_up_exits_0(tmp_path: Path) -> None:
    # From the moment the process catches SIGTERM (anarchon's first import) through the
    # imports, the app's, the scheduler's start and its first slots, one SIGTERM at a spread of
    # moments: every exit is 0, without a traceback. No sleep decides anything: the moment
    # is what it is, and each must end cleanly.
    rng = random.Random(7)
    delays = [0.0, 0.0, 0.01, 0.05, *(rng.uniform(0.1, 4.0) for _ in range(8))]
    for n, delay in enumerate(delays):
        tmp = tmp_path / str(n)
        tmp.mkdir()
        proc, log = _spawn(tmp, "module" if n % 2 else "script")
        deadline = time.monotonic() + 60
        while not _catches_sigterm(proc.pid):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"SIGTERM never caught\n{log.read_text()}")
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        code = _ended(proc, 90)
        text = log.read_text()
        assert code == 0, (n, delay, code, text)
        assert "Traceback" not in text, (n, delay, text)


def _dashboard(
    tmp: Path, entry: str, *args: str, **env: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """``anarchon dashboard`` on a free port (SQLite at $ANARCHON_DB by default: a file that
    does not exist, so a dashboard that got as far as its check would exit 3)."""
    from tests.ports import any_free

    (tmp / "hook").mkdir(exist_ok=True)
    (tmp / "hook" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp / "dashboard.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*_command(entry), "dashboard", "--port", str(any_free()), *args],
            cwd=tmp,
            env=_env(tmp, **env),
            stdout=sink,
            stderr=sink,
        )
    return proc, log


@pytest.mark.parametrize(
    ("entry", "slow", "sig", "code"),
    [
        ("module", "anarchon.cli", signal.SIGTERM, 0),
        ("script", "uvicorn", signal.SIGTERM, 0),
        ("script", "uvicorn", signal.SIGINT, 130),
    ],
)
def test_a_signal_while_the_dashboard_is_imported_ends_it_as_when_it_serves(
    tmp_path: Path, entry: str, slow: str, sig: signal.Signals, code: int
) -> None:
    # `anarchon dashboard` gave both signals their default actions back as soon as its command
    # line was read, then imported uvicorn, Starlette and Jinja2 (seconds on a loaded host): a
    # deploy's SIGTERM meanwhile killed it (143) where a SIGTERM while it serves exits 0.
    # Every option at its default.
    importing = tmp_path / "importing"
    proc, log = _dashboard(
        tmp_path, entry, SLOW_IMPORT=slow, IMPORTING=str(importing), IMPORT_S="3"
    )
    _importing(proc, log, importing, slow)
    proc.send_signal(sig)
    ended = _ended(proc, 60)
    text = log.read_text()
    assert ended == code, (ended, text)
    assert "Traceback" not in text, text
    assert f"anarchon dashboard: {sig.name} before it served: not serving" in text, text
    assert "anarchon dashboard on http" not in text and "no anarchon data" not in text, text


def test_a_sigterm_while_the_dashboard_checks_a_silent_backend_exits_0_at_once(
    tmp_path: Path,
) -> None:
    # The check for anarchon's data waits up to 15 s on a backend that accepts and never
    # answers; a SIGTERM meanwhile killed the dashboard (143). Now it cancels the check.
    from tests.ports import silent_server

    with silent_server() as (port, accepted):
        proc, log = _dashboard(tmp_path, "module", "--backend", f"redis://127.0.0.1:{port}")
        assert accepted.wait(60), f"the check never reached the backend\n{log.read_text()}"
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        ended = _ended(proc, 60)
        took = time.monotonic() - began
    text = log.read_text()
    assert ended == 0, (ended, text)
    assert took < 10, (took, text)  # not the check's 15 s
    assert "Traceback" not in text and "anarchon dashboard on http" not in text, text
