"""A real process: ``anarchon run --log-format json`` writes one JSON object a line with the
logging contract's fields, a failed run once at ERROR with its traceback; ``anarchon health``
exits 0 while the scheduler runs on this host and 1 once it has stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

APP = """
import os

from anarchon import RunContext, Scheduler, SQLiteBackend

scheduler = Scheduler(SQLiteBackend(os.environ["APP_DB"]), instance_id="proc-1", heartbeat_ms=300)


@scheduler.job("tick", "* * * * * *")
async def tick(ctx: RunContext) -> None:
    ctx.logger.info("ticked", extra={"rows": 3})


@scheduler.job("broken", "* * * * * *")
def broken(ctx: RunContext) -> None:
    raise ValueError("the export server said no to postgresql://app:s3cret@db/x")
"""


def anarchon(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_json_logs_and_health_of_a_real_process(tmp_path: Path) -> None:
    db = tmp_path / "anarchon.db"
    (tmp_path / "app.py").write_text(APP)
    env = {**os.environ, "APP_DB": str(db), "PYTHONPATH": str(tmp_path)}
    url = f"sqlite:///{db}"
    log = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "run", "--log-format", "json", "app:scheduler"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = (tmp_path / "stderr.log").read_text()
            if text.count('"run_failed"') >= 2 and text.count('"run_succeeded"') >= 2:
                break
            time.sleep(0.1)
        healthy = anarchon("health", "--backend", url, "--json", env=env)
        text_form = anarchon("health", "--backend", url, env=env)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    lines = (tmp_path / "stderr.log").read_text().splitlines()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is JSON

    assert healthy.returncode == 0, (healthy.stdout, healthy.stderr)
    report = json.loads(healthy.stdout)
    assert report["healthy"] is True and report["status"] == "ok"
    [instance] = report["instances"]
    assert instance["id"] == "proc-1" and instance["heartbeat_age_ms"] < 3_000
    assert text_form.returncode == 0 and text_form.stdout.startswith("ok: "), text_form.stdout

    started = [r for r in records if r.get("action") == "run_started" and r["job"] == "tick"]
    assert started, lines[:20]
    first = started[0]
    assert {"time", "level", "logger", "message"} <= first.keys()
    assert first["level"] == "INFO" and first["logger"] == "anarchon.scheduler"
    assert isinstance(first["slot"], int) and first["slot"] % 1000 == 0
    assert first["slot_iso"].endswith(".000+00:00")
    assert isinstance(first["run_id"], str) and first["attempt"] == 1
    assert isinstance(first["fence"], int) and first["instance"] == "proc-1"
    # What a handler logs through ctx.logger carries the same fields, slot in ms too.
    [ticked, *_] = [r for r in records if r["logger"] == "anarchon.job.tick"]
    assert ticked["rows"] == 3 and ticked["instance"] == "proc-1"
    assert isinstance(ticked["slot"], int) and ticked["slot_iso"].endswith("+00:00")
    # A failed run: one ERROR line with its traceback, nothing else repeats it.
    errors = [r for r in records if r["level"] == "ERROR"]
    assert errors and all(r["action"] == "run_failed" for r in errors), errors
    assert len({r["run_id"] for r in errors}) == len(errors), "a failure logged twice"
    for error in errors:
        assert "ValueError: the export server said no" in error["traceback"]
        assert "s3cret" not in json.dumps(error) and "app:***@db" in error["message"]
    tracebacks = [r for r in records if "traceback" in r]
    assert len(tracebacks) == len(errors), tracebacks

    after = anarchon("health", "--backend", url, "--json", env=env)
    assert after.returncode == 1, (after.stdout, after.stderr)
    assert "no live instance on host" in json.loads(after.stdout)["problems"][0]
    missing = anarchon("health", "--backend", f"sqlite:///{tmp_path / 'none.db'}", env=env)
    assert missing.returncode == 3, missing.stderr
