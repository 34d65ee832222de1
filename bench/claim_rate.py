"""3. Claim rate with three contending processes, as a share of the raw primitive's rate.

Three :mod:`bench.probe` processes per backend start together (at one wall-clock time) and,
for ``rate_seconds`` each, first do the raw primitive over keys 0, 1, 2 ..., then the
same-work floor (:mod:`bench.same_work`: the backend's own claim storage work by a bare client)
over slots 0, 1, 2 ... of 8 jobs in turn, and then one-request ``Backend.claim`` calls over
slots 0, 1, 2 ... of 8 other jobs. All three walk the same keys, so every key is contended
three ways. Rate = calls answered per second, all three processes together; share = claim
rate / primitive rate (the target), beside same-work / primitive (what the storage work leaves
of the primitive) and claim / same-work (what anarchon's Python leaves of the storage work).
Every key must have one winner, in every phase. On the backends of ``ladder_backends``
(settings) the same processes then run the record ladder (:mod:`bench.ladder`): short
alternated rounds of the primitive, the run record alone (PostgreSQL), the same-work floor and
the claim, each step's figure taken over all its rounds.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

from . import ladder
from .context import Context
from .fleet import poll, spawn, stop
from .stats import percentile

INSTANCES = 3
START_LEAD_S = 3.0


def _summary(answers: list[dict[str, Any]], phase: str, seconds: float) -> dict[str, Any]:
    ops = sum(a[phase]["ops"] for a in answers)
    wins: Counter[int] = Counter(k for a in answers for k in a[phase]["won"])
    reached = max(a[phase]["ops"] for a in answers)
    # Keys every process got past are decided: each must have exactly one winner.
    settled = min(a[phase]["ops"] for a in answers)
    return {
        "ops": ops,
        "rate": ops / seconds,
        "decided": reached,
        "duplicates": sum(n - 1 for n in wins.values() if n > 1),
        "unclaimed": sum(1 for k in range(settled) if wins[k] == 0),
    }


async def _one(
    ctx: Context,
    name: str,
    instances: int = INSTANCES,
    lead_s: float = START_LEAD_S,
    with_ladder: bool = False,
) -> dict[str, Any]:
    """One backend with ``instances`` contending processes, all starting ``lead_s`` from now;
    ``with_ladder``: then the record ladder's rounds (:mod:`bench.ladder`)."""
    target = ctx.targets[name]
    seconds = ctx.settings.rate_seconds
    run = uuid.uuid4().hex[:8]
    base = int(time.time()) * 1000
    url = ctx.services.url(name, "rate")
    rounds = ctx.settings.ladder_rounds if with_ladder else 0
    step_s = ctx.settings.ladder_seconds
    extra: list[str] = []
    ladder_error: dict[str, str] = {}
    lurl = ladder.ladder_url(name, url) if rounds else None
    if lurl is not None:
        try:
            await ladder.prepare(lurl)
            extra = ["--ladder-url", lurl]
        except Exception as exc:  # the claim rate is measured all the same
            ladder_error["ladder_error"] = f"{type(exc).__name__}: {exc}"[:200]
            rounds = 0
    if rounds:
        extra += ["--ladder-rounds", str(rounds), "--ladder-seconds", str(step_s)]
    ladder_s = rounds * len(ladder.steps(name)) * (step_s + ladder.GAP_S)
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
                "--seconds",
                str(seconds),
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
    limit = start_at + 3 * seconds + ladder_s + 30 - time.time()
    await poll(lambda: not any(p.alive() for p in procs), limit)
    await stop(procs, limit_s=5)
    answers = []
    for proc in procs:
        if proc.popen.returncode != 0 or not proc.out.exists():
            return {"error": f"{proc.name} failed: {proc.log_tail(3)}"}
        answers.append(json.loads(proc.out.read_text()))
    primitive = _summary(answers, "primitive", seconds)
    same = _summary(answers, "same_work", seconds)
    claim = _summary(answers, "claim", seconds)
    return {
        "seconds": seconds,
        "primitive": primitive,
        "same_work": same,
        "claim": claim,
        "share": _ratio(claim, primitive),
        "same_share": _ratio(same, primitive),
        "python_share": _ratio(claim, same),
        "instances": instances,
        "primitive_lat": _latency(answers, "primitive"),
        "same_work_lat": _latency(answers, "same_work"),
        "claim_lat": _latency(answers, "claim"),
        **(_ladder(answers) if rounds else ladder_error),
    }


def _ladder(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The ladder's figures, or why a process could not run it."""
    for answer in answers:
        if "ladder" not in answer:
            return {"ladder_error": answer.get("ladder_error", "no ladder in the answer")}
    return {"ladder": ladder.summary(answers)}


def _ratio(top: dict[str, Any], bottom: dict[str, Any]) -> float | None:
    return top["rate"] / bottom["rate"] if bottom["rate"] else None


def _latency(answers: list[dict[str, Any]], phase: str) -> dict[str, float | None]:
    """Round-trip percentiles (ms) of one phase's calls, every process's calls pooled."""
    lat = [v for a in answers for v in a[phase].get("lat_ms", [])]
    return {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "calls": len(lat)}


async def measure(ctx: Context) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for target in ctx.available():
        ctx.say(f"claim rate: {target.name}")
        with_ladder = target.name in ctx.settings.ladder_backends
        rows[target.name] = await _one(ctx, target.name, with_ladder=with_ladder)
    return rows
