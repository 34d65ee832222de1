"""One measuring process: the raw primitive and anarchon's ``Backend.claim`` on one backend.

    python -m bench.probe latency --backend redis --params '{...}' --url URL --n 500 --out f.json
    python -m bench.probe batch   --backend redis --params '{...}' --n 10000 --out f.json
    python -m bench.probe rate    --backend redis --params '{...}' --url URL --start-at T \
        --rounds 14 --seconds 0.5 --instance 0 --out f.json
    python -m bench.probe instant --backend redis --params '{...}' --start-at T --n 20 \
        --jobs 17 --run TAG --out f.json [--carriers i0,i1,i2 --instance 0]

``latency``: sequential round trips of one client (each call awaited before the next), first
the primitive, then a one-request ``claim`` (after a short warm-up each).
``batch``: the primitive for ``n`` keys in one go (the burst's reference).
``rate``: the claim rate's alternated rounds (:mod:`bench.ladder`). From wall time
``start-at``, ``rounds`` rounds of every step: the raw primitive in a loop over keys 0, 1, 2 ...;
on PostgreSQL with ``--record-url`` (tables made beforehand by :func:`bench.ladder.prepare`)
the run record alone, into a primary-key-only copy of the runs table and into the backend's own
runs table; the same-work floor (:mod:`bench.same_work`: the backend's own claim storage work by
a bare client) in a loop over slots 0, 1, 2 ... of 8 jobs; ``claim`` in a loop over slots 0,
1, 2 ... of 8 other jobs. Each step runs ``seconds``, a tenth of a second after the one before,
the steps' order reversed every other round, each round on keys and jobs of its own (named
after the run and the round), after a short warm-up of every step. Every process of a rate run
walks the same keys, so each key is contended by all of them; each call's round trip is
recorded too (``lat_ms``, per step over all rounds: the claim-latency curve's figures).
``instant``: the fire lag's floor under its own conditions. From wall time ``start-at``, once a
second for ``n`` instants, the primitive for ``jobs`` keys in one batch; every process of a run
claims the same keys at the same instants (as three instances claim the same due slots), and
records, per instant, the time from the instant to its batch's answer and how many keys it won.
With ``--carriers``, each process claims instead only the keys whose job it would be the
preferred instance for (rank 0 by :func:`anarchon._rendezvous.rank` of ``<prefix><k>:<slot>``
among the carriers, this process being carrier ``--instance``): the distinct keys each
instance claims at an instant with the defaults, so no key is contended and every process
writes.
Slots start at ``--base`` (epoch ms, now by default): a broker refuses to claim a slot older
than its de-duplication window.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from . import ladder
from .ladder import PostgresRecord, make_records
from .primitives import Primitive, make_primitive
from .same_work import SameWork, make_same_work

WARM_UP = 20
WARM_UP_S = 0.05
"""How long each step of a rate run is warmed up before its rounds."""
RATE_JOBS = 8
LATENCY_STEPS = ("primitive", "same_work", "claim")
"""The steps of a rate run whose round trips are kept (the claim-latency curve's lines)."""
INSTANT_EVERY_S = 1.0
# The rate loops' jobs carry the run's tag: every rate run on one namespace (section 3, then
# the claim curve's sizes) starts at its own "now" and walks slots thousands of seconds ahead,
# so with plain names a later run met the earlier runs' records and lost every claim.
CLAIM_JOB = "r{run}-{n}"
SAME_WORK_JOB = "s{run}-{n}"
RECORD_JOB = "l{run}-{n}"


@functools.cache
def _scheduler_parts() -> tuple[Any, Any, Any]:
    """What the scheduler makes its requests with, imported at the first request: the modes
    that build none (``batch``, ``instant``: the burst's reference batch, the fire lag's
    floors) measure the raw primitive without anarchon's modules loaded (with them, the
    collector's full passes during a 10 000-key batch cost more)."""
    from anarchon import Overlap, Trigger
    from anarchon._claims import _new_request

    return _new_request, Trigger.SCHEDULE, Overlap.ALLOW


def _request(job: str, slot: int, instance: str, lease: bool) -> Any:
    # As the scheduler makes a request (anarchon._claims): a run id and a token from one read
    # of 32 random bytes (two uuid4() cost about 10 us), the record by the scheduler's maker
    # (anarchon._frozen: ClaimRequest(...) costs three times as much), nothing imported per
    # call (two imports in here cost about 2 us of every claim the rate loop timed).
    new_request, schedule, allow = _scheduler_parts()
    ids = os.urandom(32).hex()
    return new_request(
        job=job,
        slot=slot,
        run_id=ids[:32],
        token=ids[32:],
        instance=instance,
        trigger=schedule,
        lease_ms=15_000 if lease else 0,
        overlap=allow,
    )


async def _backend(url: str) -> Any:
    from anarchon import backend_from_url

    backend = backend_from_url(url)
    await backend.start()
    return backend


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    prim = make_primitive(args.backend, json.loads(args.params))
    await prim.open()
    tag = uuid.uuid4().hex[:8]
    floor: list[float] = []
    try:
        for i in range(WARM_UP + args.n):
            began = time.perf_counter()
            await prim.claim(f"lat-{tag}-{i}")
            if i >= WARM_UP:
                floor.append((time.perf_counter() - began) * 1000)
    finally:
        await prim.close()
    claim: list[float] = []
    if args.url:
        backend = await _backend(args.url)
        lease = backend.is_lease_backend
        try:
            for i in range(WARM_UP + args.n):
                req = _request(f"lat{i % RATE_JOBS}", args.base + i * 1000, "probe", lease)
                began = time.perf_counter()
                await backend.claim([req])
                if i >= WARM_UP:
                    claim.append((time.perf_counter() - began) * 1000)
        finally:
            await backend.stop()
    return {"floor_ms": floor, "claim_ms": claim}


async def batch(args: argparse.Namespace) -> dict[str, Any]:
    prim = make_primitive(args.backend, json.loads(args.params))
    await prim.open()
    tag = uuid.uuid4().hex[:8]
    try:
        keys = [f"batch-{tag}-{i}" for i in range(args.n)]
        began = time.perf_counter()
        won = await prim.claim_batch(keys)
        elapsed = time.perf_counter() - began
    finally:
        await prim.close()
    return {"batch_s": elapsed, "won": won, "n": args.n}


async def _until(wall: float) -> None:
    await asyncio.sleep(max(0.0, wall - time.time()))


async def rate(args: argparse.Namespace) -> dict[str, Any]:
    prim = make_primitive(args.backend, json.loads(args.params))
    await prim.open()
    backend = await _backend(args.url)
    lease = backend.is_lease_backend
    instance = f"rate{args.instance}"
    work = make_same_work(args.backend, backend, instance, args.url)
    work.check(_request(SAME_WORK_JOB.format(run=args.run, n=0), args.base, instance, lease))
    await work.open()
    records = make_records(args.backend, args.record_url, instance)
    out: dict[str, Any] = {"instance": args.instance, "pid": os.getpid()}
    try:
        for record in records.values():
            await record.open()

        async def step_loop(step: str, run: str, base: int, end: float) -> dict[str, Any]:
            if step == "primitive":
                return await _primitive(prim, run, end)
            if step == "same_work":
                return await _same_work(work, run, base, end)
            if step == "claim":
                return await _claim(backend, run, base, end, instance, lease)
            return await _same_work(records[step], run, base, end, RECORD_JOB)

        out |= await _rounds(args, ladder.steps(args.backend, bool(records)), step_loop)
    finally:
        await prim.close()
        await work.close()
        for record in records.values():
            await record.close()
        await backend.stop()
    return out


async def _rounds(
    args: argparse.Namespace,
    steps: tuple[str, ...],
    step_loop: Callable[[str, str, int, float], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """``args.rounds`` rounds of every step from wall time ``args.start_at`` (after a short
    warm-up of each step before it), ``args.seconds`` each, the steps' order reversed every
    other round; each step's round trips pooled over the rounds. A record step that fails
    (:data:`ladder.RECORD_STEPS`: tables the copy cannot write) is said and its time waited
    out in every round, so the other steps keep their times and figures."""
    out: dict[str, Any] = {"steps": list(steps), "seconds": args.seconds, "rounds": []}
    lat: dict[str, list[float]] = {step: [] for step in steps}

    async def one(step: str, run: str, base: int, end: float) -> dict[str, Any]:
        if step in ladder.RECORD_STEPS:
            if "record_error" in out:
                await _until(end)
                return {"ops": 0, "won": [], "lat_ms": []}
            try:
                return await step_loop(step, run, base, end)
            except Exception as exc:
                out["record_error"] = f"{type(exc).__name__}: {exc}"[:200]
                await _until(end)
                return {"ops": 0, "won": [], "lat_ms": []}
        return await step_loop(step, run, base, end)

    # Warm-up: each step's first calls (connections, prepared statements) outside the rounds,
    # on keys and jobs of their own, at slots from the first round's start on.
    warm = f"{args.run}w"
    for step in steps:
        await one(step, warm, int(args.start_at * 1000), time.time() + WARM_UP_S)
    start = args.start_at
    for n in range(args.rounds):
        # Each round's keys are its own: its jobs and keys carry the round's tag.
        run, done = f"{args.run}x{n}", {}
        for step in ladder.order(steps, n):
            await _until(start)
            end = start + args.seconds
            done[step] = await one(step, run, int(start * 1000), end)
            lat[step] += done[step].pop("lat_ms")
            start = end + ladder.GAP_S
        out["rounds"].append(done)
    out["lat_ms"] = {step: lat[step] for step in LATENCY_STEPS if step in lat}
    return out


async def _primitive(prim: Primitive, run: str, end: float) -> dict[str, Any]:
    """The primitive's loop over keys 0, 1, 2 ... of ``run`` until wall time ``end``."""
    ops, won, lat = 0, [], []
    while time.time() < end:
        t = time.perf_counter()
        if await prim.claim(f"rate-{run}-{ops}"):
            won.append(ops)
        lat.append(round((time.perf_counter() - t) * 1000, 3))
        ops += 1
    return {"ops": ops, "won": won, "lat_ms": lat}


async def _claim(
    backend: Any, run: str, base: int, end: float, instance: str, lease: bool
) -> dict[str, Any]:
    """One-request claims over the slots of jobs :data:`CLAIM_JOB` of ``run`` from ``base``."""
    ops, won, lat = 0, [], []
    while time.time() < end:
        job = CLAIM_JOB.format(run=run, n=ops % RATE_JOBS)
        req = _request(job, base + ops * 1000, instance, lease)
        t = time.perf_counter()
        outcome = (await backend.claim([req]))[0]
        lat.append(round((time.perf_counter() - t) * 1000, 3))
        if outcome.ticket is not None:
            won.append(ops)
        ops += 1
    return {"ops": ops, "won": won, "lat_ms": lat}


async def _same_work(
    work: SameWork | PostgresRecord, run: str, base: int, end: float, jobs: str = SAME_WORK_JOB
) -> dict[str, Any]:
    """The same-work floor's loop (or a record step's): one claim's storage work at a time
    over the slots of jobs ``jobs`` of this run (apart from the claim loop's), a run id and
    token made as :func:`_request` makes them."""
    ops, won, lat = 0, [], []
    while time.time() < end:
        ids = os.urandom(32).hex()
        job = jobs.format(run=run, n=ops % RATE_JOBS)
        t = time.perf_counter()
        if await work.claim(job, base + ops * 1000, ids[:32], ids[32:]):
            won.append(ops)
        lat.append(round((time.perf_counter() - t) * 1000, 3))
        ops += 1
    return {"ops": ops, "won": won, "lat_ms": lat}


def preferred(carriers: list[str], instance: int, prefix: str, jobs: int, slot: int) -> list[int]:
    """The jobs ``<prefix><k>`` (``k < jobs``) whose ``slot`` carrier ``instance`` is ranked
    first for, as the scheduler ranks them with the defaults (rendezvous over the carriers)."""
    from anarchon._rendezvous import rank

    me = carriers[instance]
    return [k for k in range(jobs) if rank(me, carriers, f"{prefix}{k}:{slot}") == 0]


async def instant(args: argparse.Namespace) -> dict[str, Any]:
    prim = make_primitive(args.backend, json.loads(args.params))
    carriers = args.carriers.split(",") if args.carriers else []
    await prim.open()
    answers: list[dict[str, float]] = []
    try:
        for i in range(args.n):
            at = args.start_at + i * INSTANT_EVERY_S
            mine = list(range(args.jobs))
            if carriers:
                slot = round(at * 1000)
                mine = preferred(carriers, args.instance, args.prefix, args.jobs, slot)
            keys = [f"instant-{args.run}-{i}-{k}" for k in mine]
            await _until(at)
            if not keys:
                continue
            won = await prim.claim_batch(keys)
            answers.append(
                {"lag_ms": round((time.time() - at) * 1000, 3), "won": won, "keys": len(keys)}
            )
    finally:
        await prim.close()
    return {"instance": args.instance, "instants": answers}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.probe")
    p.add_argument("mode", choices=("latency", "batch", "rate", "instant"))
    p.add_argument("--backend", required=True)
    p.add_argument("--params", required=True, help="the primitive's parameters, JSON")
    p.add_argument("--url", help="anarchon backend URL (latency, rate)")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=0.5, help="per step of a round (rate)")
    p.add_argument("--instance", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="keys per instant (instant)")
    p.add_argument("--run", default="0", help="a tag that keeps this run's keys apart")
    p.add_argument("--carriers", default="", help="instance ids, comma-separated (instant)")
    p.add_argument("--prefix", default="f", help="the jobs' name prefix (instant, carriers)")
    p.add_argument("--rounds", type=int, default=14, help="alternated rounds (rate)")
    p.add_argument("--record-url", help="the record steps' namespace (rate, PostgreSQL)")
    p.add_argument("--base", type=int, default=0, help="first slot, epoch ms (default: now)")
    args = p.parse_args(argv)
    if not args.base:
        args.base = int(time.time()) * 1000
    return args


def main() -> None:
    args = parse()
    modes = {"latency": latency, "batch": batch, "rate": rate, "instant": instant}
    result = asyncio.run(modes[args.mode](args))
    with open(args.out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
