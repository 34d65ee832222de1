"""The ``anarchon`` command, run as a real process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
        timeout=120,
    )


def test_next_prints_iso_times_with_the_zone_offset() -> None:
    out = cli("next", "30 2 * * *", "--tz", "America/New_York", "-n", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT02:30:00-0[45]:00", line) for line in lines), lines


def test_next_with_a_bad_expression_says_why() -> None:
    out = cli("next", "61 * * * *")
    assert out.returncode == 2
    assert "minute field '61'" in out.stderr


def test_run_and_history(tmp_path: Path) -> None:
    app = tmp_path / "cronapp.py"
    app.write_text(
        "from anarchon import Scheduler\n"
        "scheduler = Scheduler()\n"
        "@scheduler.job('beat', '* * * * * *', jitter_ms=0)\n"
        "def beat(ctx):\n"
        "    print('beat', ctx.fence, flush=True)\n"
    )
    env = {**os.environ, "ANARCHON_DB": str(tmp_path / "app.db"), "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "run", "cronapp:scheduler"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(3.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert output.count("beat ") >= 2, output
    assert "stopped" in output

    out = cli("history", "beat", "-n", "2", cwd=tmp_path, ANARCHON_DB=str(tmp_path / "app.db"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["started", "(UTC)"]
    assert len(lines) == 3 and all("succeeded" in line for line in lines[1:])
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert (
        cli("history", "beat", "--backend", url).stdout
        == cli("history", "beat", cwd=tmp_path, ANARCHON_DB=str(tmp_path / "app.db")).stdout
    )


def test_run_with_a_bad_target_says_why() -> None:
    out = cli("run", "no_such_module_xyz:scheduler")
    assert out.returncode != 0 and "cannot import 'no_such_module_xyz'" in out.stderr
    out = cli("history", "x", "--backend", "ftp://host/")
    assert out.returncode == 2 and "unknown scheme 'ftp'" in out.stderr


@pytest.mark.slow
def test_demo_ends_with_no_duplicates_and_nothing_missed(tmp_path: Path) -> None:
    out = cli("demo", "--instances", "3", "--seconds", "8", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = out.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"slots: (\d+), runs: (\d+), duplicates: 0, missed: 0", summary)
    assert match and int(match.group(1)) >= 3 and match.group(1) == match.group(2), out.stdout
