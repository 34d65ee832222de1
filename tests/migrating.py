"""Instances of one store starting at once, each in a process of its own, and what each logged
with the action ``migrated``: the tests of the kit's migration runner on real backends.

The worker: ``python -m tests.migrating URL READY GO`` makes the backend of ``URL``, writes
``READY``, waits for ``GO`` to exist, starts the backend (which migrates), stops it and prints
each ``migrated`` record as a JSON line (logger, message).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from anarchon import backend_from_url
from anarchon.backend import Backend

ROOT = Path(__file__).resolve().parents[1]
# Generous: the machine may be loaded; the workers wait for one another at most this long.
WAIT_S = 60.0


def start_at_once(url: str, count: int, tmp: Path) -> list[list[tuple[str, str]]]:
    """Start ``count`` processes on ``url`` at once; the ``migrated`` records of each."""
    go = tmp / "go"
    ready = [tmp / f"ready{n}" for n in range(count)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.migrating", url, str(mark), str(go)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mark in ready
    ]
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(mark.exists() for mark in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()  # every interpreter has imported anarchon: they start together
        logged = []
        for proc in procs:
            out, err = proc.communicate(timeout=WAIT_S)
            assert proc.returncode == 0, err
            logged.append([_pair(json.loads(line)) for line in out.splitlines()])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return logged


def _pair(found: list[str]) -> tuple[str, str]:
    name, message = found
    return name, message


class _Migrated(logging.Handler):
    """Prints each ``migrated`` record as a JSON line: [logger, message]."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "migrated":
            print(json.dumps([record.name, record.getMessage()]), flush=True)


def _worker(url: str, ready: Path, go: Path) -> None:
    logging.getLogger("anarchon").addHandler(_Migrated())
    logging.getLogger("anarchon").setLevel(logging.INFO)
    backend = backend_from_url(url)  # its driver imported: what is left is the start
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    asyncio.run(_start_and_stop(backend))


async def _start_and_stop(backend: Backend) -> None:
    await backend.start()
    await backend.stop()


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
