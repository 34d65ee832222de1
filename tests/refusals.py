"""A start that the server refuses for good, tried the two ways an application starts a
scheduler (``await scheduler.start()`` and ``async with scheduler``), every option at its
default: the backends' refusal tests share it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anarchon import BackendError, BackendUnavailable, Scheduler, backend_from_url

HOW: tuple[str, ...] = ("start", "async with")
"""The two ways a scheduler is started."""


async def refused_start(url: str, how: str) -> tuple[BackendError, float]:
    """Start a scheduler on ``url`` by ``how`` (one of :data:`HOW`); the error the start
    fails with, checked to be a refusal (a :class:`BackendError`, not
    :class:`BackendUnavailable`), and how long it took (s)."""
    scheduler = Scheduler(backend_from_url(url))
    began = time.monotonic()
    with pytest.raises(BackendError) as failed:
        if how == "start":
            await scheduler.start()
        else:
            async with scheduler:
                pass
    took = time.monotonic() - began
    assert not isinstance(failed.value, BackendUnavailable), "refused for good, not down"
    return failed.value, took


APP: str = (
    "from anarchon import Scheduler\n"
    "scheduler = Scheduler()\n"
    "scheduler.add('tick', '* * * * *', lambda ctx: None)\n"
)
"""An application of one job, for ``anarchon run app:scheduler``."""

COMMANDS: tuple[tuple[str, ...], ...] = (("jobs",), ("run", "app:scheduler"))
"""A command that reads the backend and one that starts a scheduler on it."""


def refused_cli(
    url: str, args: tuple[str, ...], cwd: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``anarchon ARGS --backend URL`` in ``cwd`` (with :data:`APP` as ``app.py``), checked to
    exit 4 (a backend error); what it printed and how long it took (s)."""
    (cwd / "app.py").write_text(APP)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "anarchon", *args, "--backend", url],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "ANARCHON_BACKEND": ""},
        timeout=60,
        check=False,
    )
    took = time.monotonic() - began
    assert done.returncode == 4, (done.returncode, done.stderr)
    return done, took
