"""The instances of one trial: worker processes, their records, and what the harness did to them.

Every action of the harness (a signal, a clock step, a link fault, a server restart) is written to
the trial's timeline with its ``time.monotonic()`` stamp, the clock the workers' records share.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.faketime import FakeClockFile
from tests.nats.servers import _die_with_parent

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Instance:
    """One worker process."""

    name: str
    directory: Path
    proc: subprocess.Popen[bytes]
    clock: FakeClockFile | None = None
    signals: list[tuple[float, str]] = field(default_factory=list)
    exited_mono: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def out(self) -> Path:
        return self.directory / f"{self.name}.jsonl"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.name}.log"

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.exited_mono is None:
            self.exited_mono = time.monotonic()
        return False

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        out = []
        for line in self.out.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by kill -9
                out.append(json.loads(line))
        return out


class Fleet:
    """Worker processes of one trial, sharing one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.instances: list[Instance] = []
        self.timeline: list[dict[str, Any]] = []

    def note(self, action: str, **fields: Any) -> float:
        """Write a harness action to the timeline; returns its monotonic stamp."""
        mono = time.monotonic()
        self.timeline.append({"action": action, "mono": mono, "wall": time.time(), **fields})
        return mono

    def spawn(self, count: int, faked: bool = False) -> list[Instance]:
        """Start ``count`` workers (under libfaketime if ``faked``); they wait for their spec."""
        started = []
        for _ in range(count):
            name = f"w{len(self.instances)}"
            env = dict(os.environ)
            clock = None
            if faked:
                clock = FakeClockFile(self.directory / f"{name}.faketime")
                env.update(clock.env())
            with (self.directory / f"{name}.log").open("wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.chaos.worker", "--dir", str(self.directory),
                     "--name", name],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C of the harness is not theirs
                    preexec_fn=_die_with_parent,  # but they die with it (PR_SET_PDEATHSIG)
                )  # fmt: skip
            instance = Instance(name, self.directory, proc, clock)
            self.instances.append(instance)
            started.append(instance)
        return started

    def wait_event(self, instances: list[Instance], event: str, timeout: float) -> None:
        """Wait until each of ``instances`` has a record ``event`` (or a log ``action``)."""
        deadline = time.monotonic() + timeout
        for instance in instances:
            while not any(_is(r, event) for r in instance.records()):
                if not instance.alive():
                    raise TrialError(f"{instance.name} exited before {event!r}:\n{self.logs()}")
                if time.monotonic() > deadline:
                    raise TrialError(f"{instance.name} not {event!r} in {timeout}s:\n{self.logs()}")
                time.sleep(0.1)

    def go(self, instance: Instance, spec: dict[str, Any]) -> None:
        """Hand ``instance`` its spec: it builds its scheduler and runs."""
        target = self.directory / f"{instance.name}.go"
        tmp = target.with_suffix(".go-tmp")
        tmp.write_text(json.dumps({**spec, "instance": instance.name}))
        tmp.replace(target)

    def signal(self, instance: Instance, sig: signal.Signals) -> float:
        mono = self.note("signal", target=instance.name, signal=sig.name)
        instance.signals.append((mono, sig.name))
        with contextlib.suppress(ProcessLookupError):
            os.kill(instance.pid, sig)
        return mono

    def by_pid(self, pid: int) -> Instance:
        return next(i for i in self.instances if i.pid == pid)

    def records(self) -> list[dict[str, Any]]:
        return [r for i in self.instances for r in i.records()]

    def kill_all(self) -> None:
        """SIGKILL every worker still alive (the end of a trial; records are already on disk)."""
        for instance in self.instances:
            if instance.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(instance.pid, signal.SIGCONT)
                    os.kill(instance.pid, signal.SIGKILL)
        for instance in self.instances:
            with contextlib.suppress(subprocess.TimeoutExpired):
                instance.proc.wait(15)
            instance.alive()

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for i in self.instances:
            if i.log.exists():
                parts.append(
                    f"--- {i.name} (pid {i.pid})\n{i.log.read_text(errors='replace')[-tail:]}"
                )
        return "\n".join(parts)


class TrialError(RuntimeError):
    """The trial could not be carried out (a worker did not start, a server did not come up)."""


def _is(record: dict[str, Any], event: str) -> bool:
    return record.get("event") == event or (
        record.get("event") == "log" and record.get("action") == event
    )
