"""Real instances and a real dashboard for the browser tests and ``make screenshots``.

Three worker processes (:mod:`tests.web.worker`) share one backend; the dashboard runs as the
``anarchon dashboard`` command in a process of its own, on a free loopback port. Every process is
stopped by its pid.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from anarchon import Backend, RunStatus, Trigger, backend_from_url
from anarchon.backend import ClaimRequest
from tests.conformance.procs import stop_processes
from tests.ports import any_free

ROOT: Final = Path(__file__).resolve().parents[2]
TOKEN: Final = "s3cret-operator-token"
WAIT_S: Final = 60.0


def wait_until(check: object, what: str, timeout: float = WAIT_S) -> None:
    """Poll ``check()`` every 0.1 s until true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.1)


@dataclass
class Cluster:
    """Three instances, a dashboard, and the backend URL they share."""

    url: str
    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    base: str = ""

    def spawn_workers(self, count: int = 3) -> None:
        for n in range(count):
            name = f"w{n}"
            ready = self.tmp / f"{name}.ready"
            args = [sys.executable, "-m", "tests.web.worker", "--url", self.url]
            args += ["--instance", name, "--ready", str(ready)]
            with (self.tmp / f"{name}.log").open("wb") as log:
                self.procs[name] = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log)
        for n in range(count):
            name = f"w{n}"
            wait_until((self.tmp / f"{name}.ready").exists, f"{name} to start\n{self.logs()}")

    def serve(self, token: str | None = TOKEN) -> None:
        port = any_free()
        args = [sys.executable, "-m", "anarchon", "dashboard", "--backend", self.url]
        args += ["--host", "127.0.0.1", "--port", str(port)]
        if token is not None:
            token_file = self.tmp / "token"
            token_file.write_text(token + "\n")
            args += ["--token-file", str(token_file)]
        with (self.tmp / "dashboard.log").open("wb") as log:
            self.procs["dashboard"] = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log)
        self.base = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            assert self.procs["dashboard"].poll() is None, self.logs()
            try:
                with urllib.request.urlopen(self.base + "/instances", timeout=5) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(answers, f"the dashboard at {self.base}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    def stop(self) -> None:
        stop_processes(self.procs.values(), timeout_s=20)

    def backend(self) -> Backend:
        return backend_from_url(self.url)


@contextmanager
def cluster(url: str, tmp: Path, token: str | None = TOKEN) -> Iterator[Cluster]:
    """Three instances on ``url`` and a dashboard on them; all stopped afterwards."""
    found = Cluster(url, tmp)
    try:
        found.spawn_workers()
        found.serve(token)
        yield found
    finally:
        found.stop()


async def seed_missed(url: str, job: str, slot_ms: int, reason: str) -> None:
    """Record ``job``'s slot ``slot_ms`` as ``missed`` the way the core does (a claim with
    ``skip_status=missed``), for a slot no instance ran."""
    backend = backend_from_url(url)
    await backend.start()
    try:
        [outcome] = await backend.claim(
            [
                ClaimRequest(
                    job=job,
                    slot=slot_ms,
                    run_id=uuid.uuid4().hex,
                    token=uuid.uuid4().hex,
                    instance="w0",
                    trigger=Trigger.SCHEDULE,
                    lease_ms=15_000,
                    skip_reason=reason,
                    skip_status=RunStatus.MISSED,
                )
            ]
        )
        assert outcome.run.status is RunStatus.MISSED, outcome
    finally:
        await backend.stop()


def seed_missed_sync(url: str, job: str, slot_ms: int, reason: str) -> None:
    asyncio.run(seed_missed(url, job, slot_ms, reason))
