"""6. The peers side by side: the same work, three processes each, in the same run.

The work: ``peers_jobs`` jobs, each due every ``peers_period_s`` seconds, for ``peers_window_s``
seconds (a sub-minute variant of "N jobs each minute": every system here takes seconds). Each
system gets its own second of the period, so their busy moments do not overlap:

======================  =====  ==================================================================
system                  phase  set-up (defaults everywhere, nothing tuned)
======================  =====  ==================================================================
arq cron                0      Redis (the bench's own db), ``cron(..., second=...)``, unique=True
procrastinate periodic  2      PostgreSQL (the bench's database), ``@app.periodic(cron=...)``
APScheduler 3           4      ``AsyncIOScheduler`` + one ``SQLAlchemyJobStore`` (PostgreSQL)
anarchon                6-9    Redis, PostgreSQL, SQLite, NATS; ``jitter_ms=0``, other defaults
======================  =====  ==================================================================

The peers run from their own virtualenv (``bench/.venv-peers``: arq needs redis-py < 6), as
separate processes. Counted over the window: slots due, slots run, missed, duplicates (a slot
started more than once), lag (first start minus slot), CPU of the three processes (% of one
core, from /proc), the same CPU per slot run (ms: the whole cluster's CPU time over the window
divided by the slots that ran) and their RSS at the end.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import time
from typing import Any

from .context import Context
from .fleet import ROOT, Proc, spawn, stop, wait_ready
from .stats import percentile, tally

INSTANCES = 3
PHASES = {
    "arq": 0,
    "procrastinate": 2,
    "apscheduler": 4,
    "anarchon-redis": 6,
    "anarchon-postgres": 7,
    "anarchon-sqlite": 8,
    "anarchon-nats": 9,
}
BACKEND_OF = {
    "arq": "redis",
    "procrastinate": "postgres",
    "apscheduler": "postgres",
    "anarchon-redis": "redis",
    "anarchon-postgres": "postgres",
    "anarchon-sqlite": "sqlite",
    "anarchon-nats": "nats",
}
LAG_ALLOWANCE_S = 3.0
"""After the window, wait this long for late starts."""


def _setup(ctx: Context, module: str, args: list[str]) -> None:
    assert ctx.peers_python is not None
    done = subprocess.run(
        [ctx.peers_python, "-m", module, *args, "--setup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} --setup failed: {done.stderr.strip().splitlines()[-1:]}")


async def _prepare_pg(ctx: Context) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(ctx.services.pg_dsn(), autocommit=True) as c:
        await c.execute("CREATE SCHEMA IF NOT EXISTS aps")


def _argv(ctx: Context, system: str, jobs: int, period: int) -> tuple[list[str], str | None]:
    """The command (after ``python -m``) of one instance of ``system`` and its interpreter."""
    phase = PHASES[system]
    common = ["--jobs", str(jobs), "--period", str(period), "--phase", str(phase)]
    if system == "arq":
        return [
            "bench.peers.arq_worker",
            "--redis",
            ctx.services.redis_url(),
            "--token",
            ctx.services.token,
            *common,
        ], ctx.peers_python
    if system == "procrastinate":
        return ["bench.peers.procrastinate_worker", "--dsn", ctx.services.pg_dsn(), *common], (
            ctx.peers_python
        )
    if system == "apscheduler":
        url = ctx.services.pg_dsn().replace("postgresql://", "postgresql+psycopg://", 1)
        return [
            "bench.peers.apscheduler_worker",
            "--url",
            url,
            "--schema",
            "aps",
            *common,
        ], ctx.peers_python
    backend = BACKEND_OF[system]
    spec = [
        {
            "prefix": "j",
            "count": jobs,
            "schedule": f"{phase}-59/{period} * * * * *",
            "options": {"jitter_ms": 0},
        }
    ]
    url = ctx.services.url(backend, "peers")
    return ["bench.worker", "--url", url, "--spec", json.dumps(spec)], None


async def _start(ctx: Context, system: str) -> list[Proc]:
    settings = ctx.settings
    if system == "procrastinate":
        await asyncio.to_thread(
            _setup, ctx, "bench.peers.procrastinate_worker", ["--dsn", ctx.services.pg_dsn()]
        )
    if system == "apscheduler":
        await _prepare_pg(ctx)
        url = ctx.services.pg_dsn().replace("postgresql://", "postgresql+psycopg://", 1)
        await asyncio.to_thread(
            _setup, ctx, "bench.peers.apscheduler_worker", ["--url", url, "--schema", "aps"]
        )
    argv, python = _argv(ctx, system, settings.peers_jobs, settings.peers_period_s)
    return [spawn(f"{system}-{i}", argv, ctx.dir("peers"), python=python) for i in range(INSTANCES)]


def systems(ctx: Context) -> tuple[list[str], dict[str, str]]:
    """The systems to run, and why the others cannot."""
    run: list[str] = []
    skipped: dict[str, str] = {}
    for system, backend in BACKEND_OF.items():
        target = ctx.targets.get(backend)
        if target is None:
            skipped[system] = f"backend {backend} not selected"
        elif not target.available:
            skipped[system] = f"{backend} {target.status}"
        elif not system.startswith("anarchon") and ctx.peers_python is None:
            skipped[system] = "no peers virtualenv (bench/.venv-peers; make bench creates it)"
        else:
            run.append(system)
    return run, skipped


async def measure(ctx: Context) -> dict[str, Any]:
    settings = ctx.settings
    wanted, skipped = systems(ctx)
    fleets: dict[str, list[Proc]] = {}
    errors: dict[str, str] = {}
    for system in wanted:
        try:
            fleets[system] = await _start(ctx, system)
        except Exception as exc:
            errors[system] = str(exc)
    every = [p for procs in fleets.values() for p in procs]
    problems = await wait_ready(every, 120)
    period = settings.peers_period_s
    w0 = math.ceil((time.time() + 5) / period) * period
    w1 = w0 + settings.peers_window_s // period * period
    ctx.say(
        f"peers: {', '.join(fleets)}; {settings.peers_jobs} jobs every {period} s, "
        f"window {w1 - w0} s"
    )
    await asyncio.sleep(max(0.0, w0 - time.time()))
    cpu0 = {p.name: p.cpu_s() for p in every}
    await asyncio.sleep(max(0.0, w1 - time.time()))
    cpu1 = {p.name: p.cpu_s() for p in every}
    rss = {p.name: p.rss() for p in every}
    await asyncio.sleep(LAG_ALLOWANCE_S)
    await stop(every, limit_s=30)
    rows: dict[str, Any] = {
        "jobs": settings.peers_jobs,
        "period_s": period,
        "window_s": w1 - w0,
        "skipped": skipped,
        "errors": errors,
        "problems": problems,
    }
    for system, procs in fleets.items():
        phase = PHASES[system]
        slots = [s * 1000 for s in range(w0, w1) if s % period == phase]
        expected = [(f"j{n}", slot) for slot in slots for n in range(settings.peers_jobs)]
        starts = [r for p in procs for r in p.starts()]
        result = tally(expected, starts)
        extra = [r for p in procs for r in p.records() if r.get("e") in ("missed", "max_instances")]
        cpu_s = sum(cpu1[p.name] - cpu0[p.name] for p in procs)
        rows[system] = {
            "backend": BACKEND_OF[system],
            "expected": result.expected,
            "ran": result.ran,
            "missed": result.missed,
            "duplicates": result.duplicates,
            "p50": percentile(result.lags_ms, 50),
            "p99": percentile(result.lags_ms, 99),
            "max": max(result.lags_ms) if result.lags_ms else None,
            "lags": sorted(result.lags_ms),
            "cpu_pct": cpu_s / (w1 - w0) * 100,
            "cpu_ms_per_slot": cpu_s * 1000 / result.ran if result.ran else None,
            "rss_mb": sum(rss[p.name] for p in procs) / 2**20 / len(procs),
            "winners": sorted(result.by_pid.values(), reverse=True),
            "events": {
                kind: sum(1 for r in extra if r["e"] == kind)
                for kind in ("missed", "max_instances")
            },
        }
    return rows
