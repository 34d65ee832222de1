"""``anarchon run`` on a Redis URL whose redis-py timeout is absurd (``nan``, ``0``, ``-1``,
``inf``): a real process, every other option at its default. It exits at once with code 2 and
one line naming the option, its value and the rule. Before the check, ``socket_timeout=nan``
left the process hung at start without a log line (killed after a minute here), and ``0`` or
``-1`` exited 4 saying the server could not be reached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.backends.redis import SERVER, delete_prefix, reachable, unique_prefix

pytestmark = pytest.mark.slow

APP = """
import os
from anarchon import Scheduler

scheduler = Scheduler()

@scheduler.job("tick", "* * * * * *")
async def tick(ctx):
    with open(os.environ["OUT"], "a") as out:
        out.write("ran\\n")
"""


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A fresh prefix on the shared server, deleted afterwards."""
    if not await reachable(SERVER):
        pytest.skip(f"no Redis at {SERVER}")
    name = unique_prefix()
    yield name
    await delete_prefix(SERVER, name)


def _run(tmp: Path, url: str) -> tuple[subprocess.Popen[str], Path]:
    (tmp / "durapp.py").write_text(APP)
    out = tmp / "out.txt"
    env = {**os.environ, "OUT": str(out)}
    env.pop("ANARCHON_BACKEND", None)
    args = [sys.executable, "-m", "anarchon", "run", "durapp:scheduler", "--backend", url]
    proc = subprocess.Popen(
        args, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, out


@pytest.mark.parametrize(
    ("option", "shown"),
    [
        ("socket_timeout=nan", "socket_timeout=nan"),
        ("socket_timeout=0", "socket_timeout=0.0"),
        ("socket_timeout=-1", "socket_timeout=-1.0"),
        ("socket_connect_timeout=inf", "socket_connect_timeout=inf"),
    ],
)
def test_an_absurd_redis_timeout_is_refused_before_the_scheduler_starts(
    tmp_path: Path, prefix: str, option: str, shown: str
) -> None:
    proc, out = _run(tmp_path, f"{SERVER}?{option}&prefix={prefix}")
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(
            f"anarchon run still ran after 60 s with {option}:\n{output}"
        ) from None
    assert proc.returncode == 2, (proc.returncode, output)
    assert f"has {shown}: it must be a number of seconds, above 0 and finite" in output, output
    assert "Traceback" not in output, output
    assert not out.exists(), "a handler ran"


def test_the_same_app_at_the_defaults_runs_and_stops_on_sigterm(
    tmp_path: Path, prefix: str
) -> None:
    proc, out = _run(tmp_path, f"{SERVER}?prefix={prefix}")
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert out.exists(), "no run within 60 s"
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, output)
    assert "Traceback" not in output, output
