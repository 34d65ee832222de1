"""Start worker processes (real application instances) and read what they recorded."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.nats.servers import _die_with_parent

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    """One instance process."""

    proc: subprocess.Popen[bytes]
    out: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]


@dataclass
class Fleet:
    """Several worker processes sharing one backend namespace."""

    url: str
    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    def spawn(self, count: int = 1, **options: Any) -> list[Worker]:
        started = []
        for _ in range(count):
            n = len(self.workers)
            out, log, ready = (
                self.tmp / f"w{n}.jsonl",
                self.tmp / f"w{n}.log",
                self.tmp / f"w{n}.ready",
            )
            args = [
                sys.executable,
                "-m",
                "tests.conformance.worker",
                "--url",
                self.url,
                "--out",
                str(out),
                "--ready",
                str(ready),
                "--instance",
                f"w{n}",
            ]
            if "schedule_from" in options:  # see wait_loaded
                args += ["--loaded", str(self.tmp / f"w{n}.loaded")]
            for key, value in options.items():
                args += [f"--{key.replace('_', '-')}", str(value)]
            with log.open("wb") as handle:
                proc = subprocess.Popen(
                    args,
                    cwd=ROOT,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # even if the test process is killed
                )
            worker = Worker(proc, out, log)
            self.workers.append(worker)
            started.append(worker)
        return started

    def wait_ready(self, workers: list[Worker], timeout: float = 30) -> None:
        """Wait until each of ``workers`` has started its scheduler."""
        self._wait_file(workers, ".ready", timeout)

    def wait_loaded(self, workers: list[Worker], timeout: float = 90) -> None:
        """Wait until each of ``workers``, spawned with ``schedule_from``, has loaded and
        waits for its schedule."""
        self._wait_file(workers, ".loaded", timeout)

    def _wait_file(self, workers: list[Worker], suffix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in workers:
            while not worker.log.with_suffix(suffix).exists():
                if worker.proc.poll() is not None:
                    raise AssertionError(f"worker exited early:\n{worker.log.read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"worker not {suffix[1:]}:\n{worker.log.read_text()}")
                time.sleep(0.05)

    def stop_all(self, timeout: float = 60) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.kill(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout)
            except subprocess.TimeoutExpired:
                worker.kill(signal.SIGKILL)
                worker.wait(10)

    def freeze(self, worker: Worker) -> None:
        """SIGSTOP ``worker``; on SQLite, at a moment it holds no write transaction.

        SQLite's write lock is a lock on the file: a process frozen inside one of its (short)
        transactions stops every other process's writes until it resumes, by SQLite's design and
        as docs/backends/sqlite.md says. These tests freeze an instance to take its lease from it,
        which no instance can do while the frozen one holds the file (CI of 9a8f8d7: the stopped
        runner of attempt 2 held it, "database is locked" for 40 s, no attempt 3). So the freeze is
        retried until the file's write lock is free while the process is stopped.
        """
        path = sqlite_path(self.url)
        for _ in range(50):
            worker.kill(signal.SIGSTOP)
            if path is None or write_lock_is_free(path):
                return
            worker.kill(signal.SIGCONT)
            time.sleep(0.2)
        raise AssertionError(f"{path}'s write lock was held at each of 50 freezes of {worker.pid}")

    def kill_all(self) -> None:
        """SIGKILL every worker still running and reap it: for a test that is done while handlers
        still run, which a graceful stop (SIGTERM) would wait for up to the grace (30 s)."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.kill()
        for worker in self.workers:
            worker.wait(10)

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        out = [r for w in self.workers for r in w.records()]
        return [r for r in out if event is None or r["event"] == event]

    def starts_per_slot(self) -> Counter[int]:
        return Counter(r["slot"] for r in self.records("start") if r["slot"] is not None)

    def logs(self) -> str:
        return "\n".join(
            f"--- {w.log.name}\n{w.log.read_text()}" for w in self.workers if w.log.exists()
        )


async def busy_then_paused(
    fleet: Fleet, backend: Any, job: str, busy_s: float, **options: Any
) -> list[Worker]:
    """Two workers (options at their defaults but ``options``) running the worker's
    every-second ``job``, whose handler takes 2.5 s (on a lease backend the slots meanwhile are
    skipped for overlap), for ``busy_s``; then a pause of 3.5 s stored through ``backend`` (a
    started backend on the fleet's namespace) and waited out (each slot skipped, paused): until
    a slot after it has a record, for at most 6 s."""
    import asyncio

    from anarchon import steering

    workers = fleet.spawn(2, sleep_ms=2_500, **options)
    fleet.wait_ready(workers)
    await asyncio.sleep(busy_s)
    now = await steering.backend_now_ms(backend)
    until_ms = now + 3_500
    await steering.pause(backend, job, until_ms=until_ms, by="test")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        runs = await backend.history(job, limit=20)
        if any(r.slot_ms is not None and r.slot_ms > until_ms for r in runs):
            break
        await asyncio.sleep(0.2)
    return workers


async def serve_until_signalled(scheduler: Any, ready: str) -> None:
    """Run ``scheduler`` (a worker process's) until SIGTERM or SIGINT; create the file
    ``ready`` once it has started, so the test knows the instance is up."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with scheduler:
        os.close(os.open(ready, os.O_WRONLY | os.O_CREAT, 0o644))
        await stop.wait()


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout_s: float = 30) -> None:
    """SIGTERM every process still running, wait for each, and SIGKILL one that outlives
    ``timeout_s``."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def wait_for(
    check: Callable[[], Any], what: str, timeout_s: float = 60.0, every_s: float = 0.3
) -> Any:
    """Call ``check`` every ``every_s`` until it returns something true, and return that; fail
    the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(every_s)


def sqlite_path(url: str) -> str | None:
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None


def write_lock_is_free(path: str) -> bool:
    """Whether a write transaction on ``path`` can begin within 2 s (the frozen process's
    commits take milliseconds: one still locked after 2 s is frozen inside it)."""
    conn = sqlite3.connect(path, timeout=2.0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return False
    finally:
        conn.close()
