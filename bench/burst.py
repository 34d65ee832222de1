"""2. Burst: N jobs due in the same second, three instances, one backend at a time.

Each instance registers the same N jobs, all due once at the same fixed time of day (6 fields,
UTC, ``jitter_ms=0``, ``catch_up='none'``), a few seconds after they start. The core claims the
slots due at one instant in ``Backend.claim`` calls of up to 2 000, one after another, so each
instance sends N claims in batches. Measured: when the last of the N handlers started (after the
slot), duplicates and misses; then how the instances stop (SIGTERM, SIGKILL after 20 s) and what
they logged (WARNING and ERROR lines, counted). The reference is the raw primitive for N keys
done in one batch by one client (:meth:`bench.primitives.Primitive.claim_batch`), measured just
before. A last row, one instance on the in-memory backend, shows what the core alone needs for N
slots at once.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from .context import Context
from .fleet import Proc, spawn, stop, wait_ready
from .stats import percentile, tally

INSTANCES = 3
SETTLE_S = 1.0
"""After the last expected start, wait this long for late duplicates."""
DEADLINE_S = 30.0
"""Give up waiting for starts this long after the slot."""
STOP_S = 20.0
"""After the burst, SIGTERM the instances and SIGKILL those still running this much later."""


async def _reference(ctx: Context, name: str, jobs: int) -> dict[str, Any]:
    target = ctx.targets[name]
    try:
        answer = await ctx.probe(
            f"batch-{name}",
            "burst",
            [
                "batch",
                "--backend",
                name,
                "--params",
                json.dumps(target.primitive),
                "--n",
                str(jobs),
            ],
            limit_s=120,
        )
    except Exception as exc:
        return {"error": str(exc)}
    return {"batch_s": answer["batch_s"], "won": answer["won"]}


async def _attempt(
    ctx: Context, name: str, jobs: int, lead_s: float, n: int, instances: int = INSTANCES
) -> dict[str, Any]:
    slot_s = math.ceil(time.time() + lead_s)
    moment = datetime.fromtimestamp(slot_s, UTC)
    spec = [
        {
            "prefix": "b",
            "count": jobs,
            "schedule": f"{moment.second} {moment.minute} {moment.hour} * * *",
            "options": {"jitter_ms": 0, "catch_up": "none"},
        }
    ]
    url = ctx.services.url(name, f"burst{n}")
    procs: list[Proc] = [
        spawn(
            f"{name}-{n}-{i}",
            ["bench.worker", "--url", url, "--spec", json.dumps(spec), "--instance", f"i{i}"],
            ctx.dir("burst"),
        )
        for i in range(instances)
    ]
    late = await wait_ready(procs, max(0.5, slot_s - 0.3 - time.time()))
    if late:
        await stop(procs, limit_s=10)
        return {"not_ready": late, "lead_s": lead_s}
    slot_ms = slot_s * 1000
    ready_at = max(p.ready()["t_started"] for p in procs)  # type: ignore[index]
    last_new = time.time()
    seen = 0
    while time.time() < slot_s + DEADLINE_S:
        await asyncio.sleep(0.1)
        count = sum(len(p.starts()) for p in procs)
        if count != seen:
            seen, last_new = count, time.time()
        elif count >= jobs and time.time() - last_new >= SETTLE_S:
            break
    stopping = time.time()
    await stop(procs, limit_s=STOP_S)
    stop_s = time.time() - stopping
    problems: Counter[str] = Counter()
    for proc in procs:
        problems.update(proc.log_problems())
    result = tally(
        [(f"b{i}", slot_ms) for i in range(jobs)], [r for p in procs for r in p.starts()]
    )
    exits = [r for p in procs for r in p.records() if r.get("e") == "exit"]
    counters: Counter[str] = Counter()
    for record in exits:
        counters.update({k: v for k, v in record["metrics"].items() if isinstance(v, int)})
    return {
        "jobs": jobs,
        "ran": result.ran,
        "missed": result.missed,
        "duplicates": result.duplicates,
        "first_ms": min(result.lags_ms) if result.lags_ms else None,
        "p50_ms": percentile(result.lags_ms, 50),
        "all_ms": max(result.lags_ms) if result.lags_ms else None,
        "winners": sorted(result.by_pid.values(), reverse=True),
        "ready_before_slot_s": slot_s - ready_at,
        "stop_s": stop_s,
        "clean_exits": len(exits),
        "recorded": counters["runs_succeeded"] + counters["runs_failed"],
        "refused": counters["result_refused"],
        "taken_over": counters["taken_over"],
        "instances": instances,
        "warnings": sum(problems.values()),
        "top_warning": problems.most_common(1)[0] if problems else None,
        "lead_s": lead_s,
    }


async def measure(ctx: Context) -> dict[str, Any]:
    jobs = ctx.settings.burst_jobs
    rows: dict[str, Any] = {"jobs": jobs}
    lead = ctx.settings.burst_lead_s
    for name in [t.name for t in ctx.available()] + ["memory"]:
        ctx.say(f"burst: {name}, {jobs} jobs")
        reference = await _reference(ctx, name, jobs) if name != "memory" else {}
        count = 1 if name == "memory" else INSTANCES
        row = await _attempt(ctx, name, jobs, lead, 0, count)
        if "not_ready" in row:
            # The instances took longer to start than planned: once more, with twice the lead.
            ctx.say(f"burst: {name} instances not ready in {lead:.0f} s; retrying")
            row = await _attempt(ctx, name, jobs, lead * 2, 1, count)
        rows[name] = {**row, "reference": reference}
    return rows
