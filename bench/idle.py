"""4. Idle cost: one instance with N registered jobs, and one with none as the reference.

Per backend, one instance registers N jobs with the default options, each due daily at least
five hours away, so nothing fires; a second instance registers no job. They are started one
at a time (start-up is timed alone): spawn to ``start()`` returned, and to the start-up work
settled (on lease backends the default ``catch_up='latest'`` looks up each job's last slot).
Then all of them idle together for ``idle_seconds`` (the failover measurement runs meanwhile:
CPU time is counted per process, so it does not show up here) and CPU time and RSS are read
from /proc through psutil.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from .context import Context
from .fleet import Proc, spawn, stop, wait_ready

SETTLE_TIMEOUT_S = 300.0  # start-up of 100 000 jobs on a loaded host


@dataclass
class Idle:
    """Instances started by :func:`start`, measured by :func:`finish`."""

    procs: dict[tuple[str, int], Proc] = field(default_factory=dict)
    startup: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    cpu0: dict[tuple[str, int], float] = field(default_factory=dict)
    t0: float = 0.0


async def start(ctx: Context, reference: bool = True) -> Idle:
    """Start, one at a time, an instance with ``idle_jobs`` jobs per backend (and, with
    ``reference``, one with none)."""
    idle = Idle()
    for target in ctx.available():
        for jobs in (ctx.settings.idle_jobs, 0) if reference else (ctx.settings.idle_jobs,):
            ctx.say(f"idle: starting {target.name} with {jobs} jobs")
            spec = [{"prefix": "i", "count": jobs, "schedule": "idle"}] if jobs else []
            proc = spawn(
                f"{target.name}-{jobs}",
                [
                    "bench.worker",
                    "--url",
                    ctx.services.url(target.name, f"idle{jobs}"),
                    "--spec",
                    json.dumps(spec),
                ],
                ctx.dir("idle"),
            )
            problems = await wait_ready([proc], SETTLE_TIMEOUT_S, key="t_settled")
            key = (target.name, jobs)
            idle.procs[key] = proc
            info = proc.ready()
            if problems or info is None:
                idle.startup[key] = {"error": 1.0}
                continue
            idle.startup[key] = {
                "started_s": info["t_started"] - proc.spawned_at,
                "settled_s": info["t_settled"] - proc.spawned_at,
                "add_start_s": info["t_started"] - info["t_imported"],
            }
    await asyncio.sleep(2.0)  # let the last one's start-up garbage settle
    idle.t0 = time.time()
    idle.cpu0 = {key: proc.cpu_s() for key, proc in idle.procs.items()}
    return idle


async def finish(ctx: Context, idle: Idle) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, idle.t0 + ctx.settings.idle_seconds - time.time()))
    elapsed = time.time() - idle.t0
    rows: dict[str, Any] = {"seconds": round(elapsed, 1), "jobs": ctx.settings.idle_jobs}
    for (name, jobs), proc in idle.procs.items():
        row = {**idle.startup[(name, jobs)]}
        if proc.alive():
            row["cpu_pct"] = (proc.cpu_s() - idle.cpu0[(name, jobs)]) / elapsed * 100
            row["rss_mb"] = proc.rss() / 2**20
        else:
            row["error"] = 1.0
            row["log"] = proc.log_tail(5)  # type: ignore[assignment]
        rows.setdefault(name, {})[str(jobs)] = row
    await stop(list(idle.procs.values()), limit_s=30)
    return rows
