"""1. Fire lag: slot to handler start, with ``jitter_ms=0`` and with the defaults.

The floor, per backend, is the round trip of one client doing the raw claim primitive
(:mod:`bench.primitives`), measured alone just before; the one-request ``Backend.claim`` round
trip is shown beside it to say where the lag goes. The issue's target is read against it.

The same-instant floor is the raw primitive under the fire lag's own conditions: three
processes wake at the same instants (once a second) and each claims the same ``J`` keys in one
batch (:func:`bench.probe.instant`); a key's lag is the instant to the answer of the batch that
won it. It is what a scheduler with no code of its own would see on this machine, so
``lag p99 - same-instant floor p99`` is what anarchon itself adds.

The distinct-key floor is its counterpart for the defaults table: the same three processes at
the same instants, but each claims only the keys of the jobs it is the preferred instance for
(the rendezvous ranking of the fire lag's own instance ids and job names), so every process
wins what it claims and every one of them commits a write at the instant (three durable
commits on SQLite and PostgreSQL, where the same-key floor has one writer and two losers that
write nothing). A SQLite process that finds the write lock taken tries again every
:data:`DISTINCT_LOCK_POLL_S`, so the floor measures the commits, not SQLite's busy handler.

Fire lag: three instances per backend, every backend at once but staggered: backend ``i`` fires
at seconds ``i, i + 5, i + 10 ...`` of each minute, so only one backend's instances wake at any
moment. At each of its instants, ``J`` jobs are due together (``J`` = slots wanted / instants
in the window) and the core claims them in one backend call. A fifth row, one instance on the
in-memory backend (no I/O, nobody to contend with), shows what the core itself costs. Lag is
the winner's handler start (``time.time()`` in the handler) minus the slot, both on this
host's clock.

Then the same fleets again with every job option at its default: each slot's preferred instance
claims at the slot, the others after a rank delay unless they hear of the winner first, so no
key is contended; a second table shows what a user who sets nothing gets.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
import uuid
from typing import Any

from anarchon import Scheduler

from .context import Context
from .fleet import Proc, poll, spawn, stop, wait_ready
from .stats import percentile, tally

FIRE_CYCLE_S = 5
PHASES = {"sqlite": 0, "redis": 1, "postgres": 2, "nats": 3, "memory": 4}
INSTANCES = 3
# The fire lag's instance ids and job names: the distinct-key floor ranks them as the defaults do.
INSTANCE_IDS = [f"i{n}" for n in range(INSTANCES)]
JOB_PREFIX = "f"
# In the distinct-key floor every SQLite process writes at the instant, so two of three wait for
# the write lock: they try again this often rather than through SQLite's busy handler, whose
# sleeps (1, 2, 5, 10 ... ms) would be measured instead of the other writers' commits.
DISTINCT_LOCK_POLL_S = 0.000_1
SAME_INSTANT_N = 20
SAME_INSTANT_QUICK = 5
SAME_INSTANT_LEAD_S = 3.0
# The scheduler's default heartbeat, in whole seconds (rounded up).
HEARTBEAT_S = -(-inspect.signature(Scheduler).parameters["heartbeat_ms"].default // 1000)


def jobs_per_instant(ctx: Context) -> int:
    """``J``: how many slots are due at each of a backend's instants."""
    instants = ctx.settings.fire_window_s // FIRE_CYCLE_S
    return math.ceil(ctx.settings.fire_min_slots / instants)


async def floors(ctx: Context) -> dict[str, Any]:
    """Round trips of the primitive and of a one-request claim, per backend, one at a time;
    then each backend's same-instant floor (same keys) and distinct-key floor."""
    out: dict[str, Any] = {}
    for target in ctx.available():
        ctx.say(f"floor: {target.name}")
        try:
            answer = await ctx.probe(
                f"latency-{target.name}",
                "floor",
                [
                    "latency",
                    "--backend",
                    target.name,
                    "--params",
                    json.dumps(target.primitive),
                    "--url",
                    ctx.services.url(target.name, "floor"),
                    "--n",
                    str(ctx.settings.floor_ops),
                ],
                limit_s=120,
            )
        except Exception as exc:
            out[target.name] = {"error": str(exc)}
            continue
        out[target.name] = {
            "floor_p50": percentile(answer["floor_ms"], 50),
            "floor_p99": percentile(answer["floor_ms"], 99),
            "claim_p50": percentile(answer["claim_ms"], 50),
            "claim_p99": percentile(answer["claim_ms"], 99),
            "n": len(answer["floor_ms"]),
        }
        out[target.name].update(await _same_instant(ctx, target.name, distinct=False))
        out[target.name].update(await _same_instant(ctx, target.name, distinct=True))
    return out


async def _same_instant(ctx: Context, name: str, *, distinct: bool) -> dict[str, Any]:
    """:data:`INSTANCES` processes claim ``J`` keys in one batch each at the same instants: the
    same keys (figures ``instant_*``), or with ``distinct`` each its own share by the
    rendezvous ranking (figures ``distinct_*``)."""
    field = "distinct" if distinct else "instant"
    instants = SAME_INSTANT_QUICK if ctx.settings.name == "quick" else SAME_INSTANT_N
    start_at = math.ceil(time.time() + SAME_INSTANT_LEAD_S)
    params = dict(ctx.targets[name].primitive)
    if distinct and name == "sqlite":
        params["lock_poll_s"] = DISTINCT_LOCK_POLL_S
    argv = ["--params", json.dumps(params), "--n", str(instants)]
    argv += ["--jobs", str(jobs_per_instant(ctx)), "--start-at", str(start_at)]
    argv += ["--run", uuid.uuid4().hex[:8]]
    if distinct:
        argv += ["--carriers", ",".join(INSTANCE_IDS), "--prefix", JOB_PREFIX]
    procs = [
        spawn(
            f"{field}-{name}-{i}",
            ["bench.probe", "instant", "--backend", name, "--instance", str(i), *argv],
            ctx.dir("floor"),
            ready=False,
        )
        for i in range(INSTANCES)
    ]
    limit = start_at + instants + 30 - time.time()
    await poll(lambda: not any(p.alive() for p in procs), limit)
    await stop(procs, limit_s=5)
    lags: list[float] = []
    for proc in procs:
        if proc.popen.returncode != 0 or not proc.out.exists():
            return {f"{field}_error": f"{proc.name} failed: {proc.log_tail(3)}"}
        for answer in json.loads(proc.out.read_text())["instants"]:
            lags += [answer["lag_ms"]] * answer["won"]
    return {
        f"{field}_p50": percentile(lags, 50),
        f"{field}_p99": percentile(lags, 99),
        f"{field}_keys": len(lags),
        f"{field}_expected": instants * jobs_per_instant(ctx),
    }


def _expected(phase: int, jobs: int, w0: int, w1: int) -> list[tuple[str, int]]:
    seconds = [s for s in range(w0, w1) if s % FIRE_CYCLE_S == phase]
    return [(f"{JOB_PREFIX}{n}", s * 1000) for s in seconds for n in range(jobs)]


async def measure(ctx: Context) -> dict[str, Any]:
    """The fire lag with ``jitter_ms=0`` (every instance claims every slot at its instant: the
    contended case the target is read on, with the core alone beside it), then with every option
    at its default (each slot's preferred instance claims at the slot, the others only after a
    rank delay unless they hear of a winner)."""
    rows = await _window(ctx, {"jitter_ms": 0}, core=True, lead_s=2)
    # Rank delays need each instance to have read the others' heartbeat records (every
    # heartbeat): start counting two heartbeats after the last one started.
    rows["defaults"] = await _window(ctx, {}, core=False, lead_s=2 + 2 * HEARTBEAT_S)
    return rows


async def _window(
    ctx: Context, options: dict[str, Any], *, core: bool, lead_s: int
) -> dict[str, Any]:
    """Three instances per backend with the jobs' ``options``, staggered; lags over a window
    that starts ``lead_s`` after the last instance is ready."""
    instants = ctx.settings.fire_window_s // FIRE_CYCLE_S
    jobs = jobs_per_instant(ctx)
    work = ctx.dir("fire" if options else "firedefaults")
    fleets: dict[str, list[Proc]] = {}
    rows: dict[str, Any] = {"jobs_per_instant": jobs}
    for name in [t.name for t in ctx.available()] + (["memory"] if core else []):
        phase = PHASES[name]
        spec = [
            {
                "prefix": JOB_PREFIX,
                "count": jobs,
                "schedule": f"{phase}-59/{FIRE_CYCLE_S} * * * * *",
                "options": options,
            }
        ]
        url = ctx.services.url(name, "fire" if options else "firedefaults")
        fleets[name] = [
            spawn(
                f"{name}-{n}",
                ["bench.worker", "--url", url, "--spec", json.dumps(spec), "--instance", instance],
                work,
            )
            for n, instance in enumerate(INSTANCE_IDS[: 1 if name == "memory" else INSTANCES])
        ]
    every = [p for procs in fleets.values() for p in procs]
    problems = await wait_ready(every, 90)
    # Count whole cycles only, from a few seconds after the last instance started.
    w0 = (math.ceil(time.time()) + lead_s + FIRE_CYCLE_S) // FIRE_CYCLE_S * FIRE_CYCLE_S
    w1 = w0 + instants * FIRE_CYCLE_S
    ctx.say(
        f"fire lag ({'options ' + json.dumps(options) if options else 'defaults'}): "
        f"{len(fleets)} backends x {INSTANCES} instances, {jobs} jobs per instant, "
        f"window {w1 - w0} s"
    )
    await asyncio.sleep(max(0.0, w1 + 1.5 - time.time()))
    await stop(every, limit_s=30)
    rows.update({"window_s": w1 - w0, "problems": problems})
    for name, procs in fleets.items():
        starts = [r for p in procs for r in p.starts()]
        result = tally(_expected(PHASES[name], jobs, w0, w1), starts)
        won = lost = 0
        for proc in procs:
            for exit_record in (r for r in proc.records() if r.get("e") == "exit"):
                won += exit_record["metrics"].get("claims_won", 0)
                lost += exit_record["metrics"].get("claims_lost", 0)
        rows[name] = {
            "expected": result.expected,
            "ran": result.ran,
            "missed": result.missed,
            "duplicates": result.duplicates,
            "p50": result.p(50),
            "p99": result.p(99),
            "max": max(result.lags_ms) if result.lags_ms else None,
            "lags": sorted(result.lags_ms),
            "winners": sorted(result.by_pid.values(), reverse=True),
            # Over each process's whole life (start-up slots included), not only the window.
            "claims_per_slot": (won + lost) / won if won else None,
        }
    return rows
