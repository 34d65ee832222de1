"""5. Failover: kill -9 of the runner to the takeover's start, and hand-over on SIGTERM.

Per lease backend (all at once, staggered by a second), three instances run one job due every
``CYCLE_S`` seconds whose handler sleeps a while. At each try, as soon as a handler start is
on disk (records are written at once here), the runner is killed; the delay is from the
signal to the start of attempt 2 on another instance. A replacement instance is started after
each try, so three contend again.

* kill -9 round: ``lease_ms`` short (2 s); the backup takes over when the lease expires, so
  the delay is about ``lease_ms`` minus the moments the runner lived. "After expiry" is the
  takeover's start minus (attempt 1's start + ``lease_ms``): the backups' reaction time.
* SIGTERM round: a long lease (20 s) and ``grace_ms`` 300; the runner's handler outlives the
  grace, is cancelled and its lease released at once, so a backup takes over without waiting
  for expiry. "After grace" is the delay minus ``grace_ms``.

NATS is a broker: no lease, no takeover, no hand-over (a crashed run is lost, by design).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

from .context import Context
from .fleet import Proc, poll, spawn, stop, wait_ready
from .stats import median

CYCLE_S = 4
INSTANCES = 3
KILL_SLEEP_MS = 1_500
TERM_SLEEP_MS = 1_500
START_TIMEOUT_S = 5.0


class _Round:
    def __init__(self, ctx: Context, name: str, kind: str) -> None:
        self.ctx = ctx
        self.name = name
        self.kind = kind
        settings = ctx.settings
        self.lease_ms = settings.kill_lease_ms if kind == "kill" else settings.handover_lease_ms
        self.grace_ms = settings.handover_grace_ms if kind == "term" else 30_000
        self.phase = ctx.index(name)
        self.url = ctx.services.url(name, f"failover{kind}")
        self.spec = json.dumps(
            [
                {
                    "prefix": kind,
                    "count": 1,
                    "schedule": f"{self.phase}-59/{CYCLE_S} * * * * *",
                    "sleep_ms": KILL_SLEEP_MS if kind == "kill" else TERM_SLEEP_MS,
                    "options": {"jitter_ms": 0, "lease_ms": self.lease_ms, "catch_up": "none"},
                }
            ]
        )
        self.procs: list[Proc] = []
        self.made = 0

    def add(self) -> Proc:
        proc = spawn(
            f"{self.name}-{self.kind}-{self.made}",
            [
                "bench.worker",
                "--url",
                self.url,
                "--spec",
                self.spec,
                "--instance",
                f"{self.kind}{self.made}",
                "--flush-ms",
                "0",
                "--grace-ms",
                str(self.grace_ms),
            ],
            self.ctx.dir("failover"),
        )
        self.made += 1
        self.procs.append(proc)
        return proc

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.alive() and p.ready() is not None]

    def _record(self, slot_ms: int, attempt: int) -> dict[str, Any] | None:
        job = f"{self.kind}0"
        for proc in self.procs:
            for record in proc.starts():
                if record["j"] == job and record["s"] == slot_ms and record.get("a") == attempt:
                    return record
        return None

    async def find(self, slot_ms: int, attempt: int, limit_s: float) -> dict[str, Any] | None:
        await poll(lambda: self._record(slot_ms, attempt) is not None, limit_s, 0.005)
        return self._record(slot_ms, attempt)

    def next_slot(self, after: float) -> int:
        second = int(after) + 1
        while second % CYCLE_S != self.phase:
            second += 1
        return second * 1000

    async def run(self, tries: int) -> dict[str, Any]:
        for _ in range(INSTANCES):
            self.add()
        problems = await wait_ready(self.procs, 90)
        delays: list[float] = []
        after_ref: list[float] = []
        notes: list[str] = problems[:]
        attempts = 0
        while len(delays) < tries and attempts < tries * 2:
            attempts += 1
            await poll(lambda: len(self.live()) >= 2, 60)
            slot = self.next_slot(time.time() + 0.3)
            first = await self.find(slot, 1, slot / 1000 - time.time() + START_TIMEOUT_S)
            if first is None:
                notes.append(f"slot {slot}: no start")
                continue
            runner = next(p for p in self.procs if p.pid == first["p"])
            sent = time.time()
            runner.send(signal.SIGKILL if self.kind == "kill" else signal.SIGTERM)
            second = await self.find(slot, 2, self.lease_ms / 1000 + 10)
            self.add()
            if second is None:
                notes.append(f"slot {slot}: no takeover")
                continue
            delays.append((second["t"] - sent) * 1000)
            if self.kind == "kill":
                after_ref.append((second["t"] - first["t"]) * 1000 - self.lease_ms)
            else:
                after_ref.append((second["t"] - sent) * 1000 - self.grace_ms)
        await stop(self.procs, limit_s=20)
        return {
            "lease_ms": self.lease_ms,
            "grace_ms": self.grace_ms if self.kind == "term" else None,
            "tries": len(delays),
            "delays_ms": delays,
            "median_ms": median(delays),
            "min_ms": min(delays) if delays else None,
            "max_ms": max(delays) if delays else None,
            "after_ref_median_ms": median(after_ref),
            "notes": notes,
        }


async def measure(ctx: Context) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    targets = ctx.available(lease=True)
    for kind in ("kill", "term"):
        ctx.say(f"failover: {kind} round on {', '.join(t.name for t in targets) or 'nothing'}")
        answers = await asyncio.gather(
            *(_Round(ctx, t.name, kind).run(ctx.settings.failover_tries) for t in targets),
            return_exceptions=True,
        )
        for target, answer in zip(targets, answers, strict=True):
            value = {"error": repr(answer)} if isinstance(answer, BaseException) else answer
            rows.setdefault(target.name, {})[kind] = value
    return rows
