"""3. Claim rate with three contending processes, as a share of the raw primitive's rate.

Three :mod:`bench.probe` processes per backend start together (at one wall-clock time) and run
``rate_rounds`` alternated rounds (:mod:`bench.ladder`) of every step, ``rate_step_s`` each,
the steps' order reversed every other round: the raw primitive over keys 0, 1, 2 ...; on
PostgreSQL the run record alone (the record ladder's two steps); the same-work floor
(:mod:`bench.same_work`: the backend's own claim storage work by a bare client) over slots 0,
1, 2 ... of 8 jobs; one-request ``Backend.claim`` calls over slots 0, 1, 2 ... of 8 other jobs.
All three walk the same keys, so every key is contended three ways. A step's rate = its calls
answered in all rounds over their time, all three processes together; share = claim rate /
primitive rate (the target), beside same-work / primitive (what the storage work leaves of the
primitive) and claim / same-work (what anarchon's Python leaves of the storage work). Every
key must have one winner, in every round of every step. The steps alternate because one long
loop per step, one after the other, measured whether the processes happened to race for every
key or one ran ahead, and the machine's other work at that moment, as much as the step.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from . import ladder
from .context import Context
from .fleet import poll, spawn, stop
from .probe import LATENCY_STEPS
from .stats import percentile

INSTANCES = 3
START_LEAD_S = 3.0


async def _one(
    ctx: Context,
    name: str,
    instances: int = INSTANCES,
    lead_s: float = START_LEAD_S,
    rounds: int | None = None,
) -> dict[str, Any]:
    """One backend with ``instances`` contending processes, all starting ``lead_s`` from now,
    ``rounds`` rounds (default: the settings' ``rate_rounds``, with the record steps; the
    claim curve's fewer rounds have none)."""
    target = ctx.targets[name]
    step_s = ctx.settings.rate_step_s
    run = uuid.uuid4().hex[:8]
    base = int(time.time()) * 1000
    url = ctx.services.url(name, "rate")
    record_url = ladder.ladder_url(name, url) if rounds is None else None
    rounds = ctx.settings.rate_rounds if rounds is None else rounds
    extra = ["--rounds", str(rounds), "--seconds", str(step_s)]
    record_error: dict[str, str] = {}
    if record_url is not None:
        try:
            await ladder.prepare(record_url)
            extra += ["--record-url", record_url]
        except Exception as exc:  # the claim rate is measured all the same
            record_error["record_error"] = f"{type(exc).__name__}: {exc}"[:200]
            record_url = None
    steps = ladder.steps(name, record_url is not None)
    start_at = time.time() + lead_s
    procs = [
        spawn(
            f"{name}-{i}",
            [
                "bench.probe",
                "rate",
                "--backend",
                name,
                "--params",
                json.dumps(target.primitive),
                "--url",
                url,
                "--start-at",
                str(start_at),
                "--instance",
                str(i),
                "--run",
                run,
                "--base",
                str(base),
                *extra,
            ],
            ctx.dir("rate"),
            ready=False,
        )
        for i in range(instances)
    ]
    limit = start_at + rounds * len(steps) * (step_s + ladder.GAP_S) + 30 - time.time()
    await poll(lambda: not any(p.alive() for p in procs), limit)
    await stop(procs, limit_s=5)
    answers = []
    for proc in procs:
        if proc.popen.returncode != 0 or not proc.out.exists():
            return {"error": f"{proc.name} failed: {proc.log_tail(3)}"}
        answers.append(json.loads(proc.out.read_text()))
    return {**figures(answers), "instances": instances, **record_error}


def figures(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """A rate run's figures from its processes' answers: every step's over all the rounds
    (:func:`bench.ladder.summary`), the headline's ratios and the round trips' percentiles.
    Record steps that failed in any process are left out, and why is said."""
    failed = next((a["record_error"] for a in answers if "record_error" in a), None)
    names = [s for s in answers[0]["steps"] if failed is None or s not in ladder.RECORD_STEPS]
    found = ladder.summary(answers, names)
    steps = found["steps"]
    primitive, same, claim = steps["primitive"], steps["same_work"], steps["claim"]
    return {
        "seconds": found["seconds"],
        "rounds": found["rounds"],
        "steps": steps,
        "share": _ratio(claim, primitive),
        "same_share": _ratio(same, primitive),
        "python_share": _ratio(claim, same),
        **{f"{step}_lat": _latency(answers, step) for step in LATENCY_STEPS},
        **({"record_error": failed} if failed is not None else {}),
    }


def _ratio(top: dict[str, Any], bottom: dict[str, Any]) -> float | None:
    return top["rate"] / bottom["rate"] if bottom["rate"] else None


def _latency(answers: list[dict[str, Any]], step: str) -> dict[str, float | None]:
    """Round-trip percentiles (ms) of one step's calls, every process's calls in every round
    pooled."""
    lat = [v for a in answers for v in a["lat_ms"].get(step, [])]
    return {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "calls": len(lat)}


async def measure(ctx: Context) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for target in ctx.available():
        ctx.say(f"claim rate: {target.name}")
        rows[target.name] = await _one(ctx, target.name)
    return rows
