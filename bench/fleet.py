"""Processes of a measurement: spawn, wait until ready, read their records, sample, stop.

Every process the bench starts is tracked here and ended by its own pid (SIGTERM, then
SIGKILL after a timeout); :func:`stop_everything` is the last resort of the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = ["ROOT", "Proc", "poll", "spawn", "stop", "stop_everything", "wait_ready"]

ROOT = Path(__file__).resolve().parents[1]
_NUMBERS = re.compile(r"\d+")
_URLS = re.compile(r"\w+://\S+")
_ALL: list[Proc] = []


@dataclass(eq=False)
class Proc:
    """One process and the files it writes: records (JSON lines), a ready file, a log."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    log: Path
    ready_path: Path | None
    spawned_at: float
    _offset: int = 0
    _seen: list[dict[str, Any]] = field(default_factory=list)
    _ps: psutil.Process | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def ready(self) -> dict[str, Any] | None:
        """The ready file's content, or None while there is none."""
        if self.ready_path is None or not self.ready_path.exists():
            return None
        try:
            data: dict[str, Any] = json.loads(self.ready_path.read_text())
        except (OSError, ValueError):
            return None
        return data

    def records(self) -> list[dict[str, Any]]:
        """Every complete record written so far (read incrementally)."""
        if self.out.exists():
            with self.out.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            self._offset += end
            for line in data[:end].splitlines():
                if line.strip():
                    self._seen.append(json.loads(line))
        return self._seen

    def starts(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("e") == "start"]

    def send(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def ps(self) -> psutil.Process:
        if self._ps is None:
            self._ps = psutil.Process(self.pid)
        return self._ps

    def cpu_s(self) -> float:
        """User + system CPU seconds used so far (0 if the process is gone)."""
        try:
            times = self.ps().cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)

    def rss(self) -> int:
        try:
            return int(self.ps().memory_info().rss)
        except psutil.Error:
            return 0

    def log_problems(self) -> Counter[str]:
        """WARNING and ERROR lines of the log, counted by message shape (numbers as N)."""
        found: Counter[str] = Counter()
        if not self.log.exists():
            return found
        for line in self.log.read_text(errors="replace").splitlines():
            for level in (" WARNING ", " ERROR "):
                if level in line:
                    message = line.split(level, 1)[1]
                    message = _URLS.sub("<url>", message)
                    found[level.strip() + ": " + _NUMBERS.sub("N", message)[:160]] += 1
        return found

    def log_tail(self, lines: int = 15) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


async def poll(predicate: Callable[[], bool], limit_s: float, every_s: float = 0.05) -> bool:
    """Wait until ``predicate()`` holds (True) or ``limit_s`` has passed (False).

    Polling, because what the bench waits for (other processes' files and exit codes) announces
    itself through no event.
    """
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)
    return True


def spawn(
    name: str,
    argv: list[str],
    work: Path,
    *,
    ready: bool = True,
    python: str | None = None,
) -> Proc:
    """Start ``python -m <argv...>`` in the repository root; output goes to ``<work>/<name>``."""
    work.mkdir(parents=True, exist_ok=True)
    out, log = work / f"{name}.jsonl", work / f"{name}.log"
    ready_path = work / f"{name}.ready" if ready else None
    for path in (out, log, ready_path):
        if path is not None and path.exists():
            path.unlink()
    args = [python or sys.executable, "-m", *argv, "--out", str(out)]
    if ready_path is not None:
        args += ["--ready", str(ready_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            args, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    proc = Proc(name, popen, out, log, ready_path, time.time())
    _ALL.append(proc)
    return proc


async def run_to_json(name: str, argv: list[str], work: Path, limit_s: float) -> dict[str, Any]:
    """Run ``python -m <argv...>`` to its end (killed after ``limit_s``) and return the JSON it
    wrote to its ``--out`` file, or ``{"error": ...}`` saying why there is none."""
    proc = spawn(name, argv, work, ready=False)
    if not await poll(lambda: not proc.alive(), limit_s, every_s=0.25):
        proc.send(signal.SIGKILL)
        return {"error": f"took over {limit_s:.0f} s"}
    if proc.popen.returncode != 0 or not proc.out.exists():
        return {"error": f"failed: {proc.log_tail(3)}"}
    found: dict[str, Any] = json.loads(proc.out.read_text())
    return found


async def wait_ready(procs: list[Proc], limit_s: float, key: str = "t_started") -> list[str]:
    """Wait until every process has written ``key`` to its ready file; return the problems."""

    def done(proc: Proc) -> bool:
        info = proc.ready()
        return (info is not None and key in info) or not proc.alive()

    await poll(lambda: all(done(p) for p in procs), limit_s)
    problems = []
    for proc in procs:
        info = proc.ready()
        if info is None or key not in info:
            state = "exited" if not proc.alive() else "not ready"
            problems.append(f"{proc.name} {state}: {proc.log_tail(5)}")
    return problems


async def stop(procs: list[Proc], limit_s: float = 30.0, sig: int = signal.SIGTERM) -> None:
    """Signal every live process, wait up to ``limit_s``, then SIGKILL what is left."""
    for proc in procs:
        proc.send(sig)
    await poll(lambda: not any(p.alive() for p in procs), limit_s)
    for proc in procs:
        if proc.alive():
            proc.send(signal.SIGKILL)
            await asyncio.to_thread(proc.popen.wait, 10)
    for proc in procs:
        proc.records()


def stop_everything() -> None:
    """SIGKILL every process the bench started that still runs (by pid), and reap them."""
    for proc in _ALL:
        if proc.alive():
            proc.send(signal.SIGKILL)
    for proc in _ALL:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(10)
