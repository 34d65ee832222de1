"""Real server processes for the integration tests: started in a session of their own, their
output in a file, waited on by what they print, stopped by their process id."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
BIN = Path(sys.executable).parent

STARTED = re.compile(r"scheduler (\S+) started with")
STOPPED = re.compile(r"scheduler (\S+) stopped")
TICK = re.compile(r"tick slot=(\S+) instance=(\S+) fence=(\d+)")


@dataclass
class Proc:
    """One process we started (and the processes it forks, in its own session)."""

    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def found(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        return list(pattern.finditer(self.text()))

    def wait_for(
        self, pattern: re.Pattern[str], count: int = 1, timeout: float = 60
    ) -> list[re.Match[str]]:
        """Wait until ``pattern`` has matched ``count`` times in the output."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.found(pattern)
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"process exited ({self.proc.returncode}) before {pattern.pattern!r} "
                    f"x{count}:\n{self.text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern.pattern!r} x{count} in {timeout}s:\n{self.text()}"
                )
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> tuple[int, float]:
        """Send ``sig`` to the process we started; its exit code and how long it took (s)."""
        began = time.monotonic()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit {timeout}s after signal {sig}:\n{self.text()}") from None
        return code, time.monotonic() - began


@dataclass
class Procs:
    """The processes of one test; whatever is left is killed (by process group id) at the end."""

    tmp: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, args: Sequence[str], env: dict[str, str], cwd: Path | None = None) -> Proc:
        log = self.tmp / f"proc{len(self.started)}.log"
        full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(args),
                cwd=cwd or self.tmp,
                env=full,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = Proc(proc, log)
        self.started.append(started)
        return started

    def kill_left(self) -> None:
        for started in self.started:
            if started.proc.poll() is None:
                # Our own session: the server and the workers it forked.
                os.killpg(started.proc.pid, signal.SIGKILL)
                started.proc.wait(10)


@contextmanager
def processes(tmp: Path) -> Iterator[Procs]:
    procs = Procs(tmp)
    try:
        yield procs
    finally:
        procs.kill_left()


def per_slot(matches: Sequence[re.Match[str]]) -> Counter[str]:
    """How many times each slot (group 1) was logged."""
    return Counter(m.group(1) for m in matches)


def contiguous_seconds(slots: Sequence[Any]) -> list[str]:
    """The whole seconds missing between the first and the last of ``slots`` (ISO strings)."""
    from datetime import datetime, timedelta

    moments = sorted(datetime.fromisoformat(s) for s in slots)
    if not moments:
        return []
    present = set(moments)
    missing = []
    at = moments[0]
    while at < moments[-1]:
        if at not in present:
            missing.append(at.isoformat())
        at += timedelta(seconds=1)
    return missing
