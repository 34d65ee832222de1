"""Claims per slot: rank delays (docs/guarantees.md, "Rank delays") at fleet scale.

Per backend and fleet size (3, 10, 30, 100 schedulers, all in one process and one event loop:
each child process of this module is one such fleet), every scheduler carries the same few
every-second jobs (``jitter_ms`` 600, ``heartbeat_ms`` 1000). Counted over the slots of a window
after a warm-up (the instances have read each other in the registry): claim requests the
backend answered per slot, fire lag (slot to the handler's start, on this host's clock) p50 and
p99, and slots run never (missed) or twice (duplicates), both of which must be 0.

"With one dead preferred instance": a phantom instance keeps a fresh registry record carrying
the jobs but never claims (a process stopped, its record not yet stale), so the slots it is
ranked first for cost one rank delay (half the jitter); their lag is reported on its own.

Schedulers share a few backend objects (one per ten schedulers) so that 100 of them do not need
100 connection pools; their clocks keep leases on the event loop (no keeper thread each). On
PostgreSQL each shared backend's pool holds at most :data:`PG_POOL` connections: ten pools of
the default ten, plus their ten LISTEN connections, passed the server's 100 connections (shared
with whatever else runs there), and the refused connections, not the claims, made the 28.45
claims per slot and the unrun slots of the 2026-12-04 05:10 run (with pools of 3, on a loaded
machine: 1.00 and none unrun in 6 runs of 7; one loop that falls behind still makes more).

    python -m bench.claims --url URL --schedulers 10 [--ghost] --seconds 5 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .context import Context
from .fleet import poll, spawn
from .stats import percentile

SIZES = (3, 10, 30, 100)
JOBS = 5
JITTER_MS = 600
HEARTBEAT_MS = 1_000
WARM_UP_S = 3
SCHEDULERS_PER_BACKEND = 10
GHOST = "ghost-instance"
PG_POOL = 3


def _frugal(url: str) -> str:
    """``url`` with a PostgreSQL pool of :data:`PG_POOL` connections unless it names a size."""
    if not url.startswith(("postgresql:", "postgres:")) or "max_connections=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}max_connections={PG_POOL}"


async def measure(ctx: Context) -> dict[str, Any]:
    """Every available backend, every size, with and without a dead preferred instance."""
    quick = ctx.settings.name == "quick"
    seconds = 2.0 if quick else 20.0
    # Quick: the dead instance only at the smallest and largest fleet (under 3 minutes).
    haunted = (SIZES[0], SIZES[-1]) if quick else SIZES
    out: dict[str, Any] = {"sizes": list(SIZES), "seconds": seconds, "backends": {}}
    for target in ctx.available():
        rows: dict[str, Any] = {}
        for size in SIZES:
            for ghost in (False, True) if size in haunted else (False,):
                key = f"{size}{'-ghost' if ghost else ''}"
                dead = " + a dead one" if ghost else ""
                ctx.say(f"claims: {target.name}, {size} schedulers{dead}")
                rows[key] = await _one(ctx, target.name, size, ghost, seconds)
        out["backends"][target.name] = rows
    return out


async def _one(ctx: Context, backend: str, size: int, ghost: bool, seconds: float) -> Any:
    section = f"claims{size}{'g' if ghost else ''}"
    argv = ["bench.claims", "--url", ctx.services.url(backend, section)]
    argv += ["--schedulers", str(size), "--seconds", str(seconds)]
    if ghost:
        argv.append("--ghost")
    proc = spawn(f"{backend}-{section}", argv, ctx.dir("claims"), ready=False)
    limit = 120.0 + seconds
    if not await poll(lambda: not proc.alive(), limit):
        proc.send(9)
        return {"error": f"took over {limit:.0f} s"}
    if proc.popen.returncode != 0 or not proc.out.exists():
        return {"error": proc.log_tail(3)}
    return json.loads(proc.out.read_text())


# -- the child: one fleet in one process ------------------------------------------------------


async def _fleet(url: str, size: int, ghost: bool, seconds: float) -> dict[str, Any]:
    from anarchon import RunContext, Scheduler, backend_from_url
    from anarchon._clock import SystemClock
    from anarchon.backend import Backend, ClaimOutcome, ClaimRequest

    class LoopClock(SystemClock):
        """The system clock under another name: leases are kept on the event loop (one keeper
        thread and connection per scheduler would not fit 100 schedulers)."""

    claims: Counter[tuple[str, int]] = Counter()
    calls = [0]
    runs: Counter[tuple[str, int]] = Counter()
    lags: dict[tuple[str, int], float] = {}

    def counted(backend: Backend) -> Backend:
        claim = backend.claim

        async def counting(requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
            calls[0] += 1
            for request in requests:
                if request.slot is not None:
                    claims[(request.job, request.slot)] += 1
            return await claim(requests)

        backend.claim = counting  # type: ignore[method-assign]
        return backend

    async def tick(ctx: RunContext) -> None:
        assert ctx.slot is not None
        slot = round(ctx.slot.timestamp() * 1000)
        key = (ctx.job, slot)
        runs[key] += 1
        lags.setdefault(key, time.time() * 1000 - slot)

    shared = [
        counted(backend_from_url(_frugal(url)))
        for _ in range(max(1, (size + SCHEDULERS_PER_BACKEND - 1) // SCHEDULERS_PER_BACKEND))
    ]
    for backend in shared:
        await backend.start()
    schedulers = []
    for n in range(size):
        scheduler = Scheduler(
            shared[n % len(shared)],
            instance_id=f"bench-{n:03d}",
            heartbeat_ms=HEARTBEAT_MS,
            clock=LoopClock(),
        )
        for j in range(JOBS):
            scheduler.add(f"tick{j}", "* * * * * *", tick, jitter_ms=JITTER_MS)
        schedulers.append(scheduler)
    ids = [s.instance_id for s in schedulers] + ([GHOST] if ghost else [])
    stopping = asyncio.Event()

    haunting = (
        asyncio.ensure_future(_phantom(shared[0], schedulers[0], stopping)) if ghost else None
    )
    began = time.time()
    for at in range(0, size, 10):  # ten at a time: 100 start-ups at once stall the loop
        await asyncio.gather(*(s.start() for s in schedulers[at : at + 10]))
    started = time.time()
    await asyncio.sleep(WARM_UP_S + seconds + 2.5)
    stopping.set()
    await asyncio.gather(*(s.stop() for s in schedulers[1:]))
    await schedulers[0].stop()
    if haunting is not None:
        await haunting
    for backend in shared:
        await backend.stop()
    window_from = (int(started) + 1 + WARM_UP_S) * 1000
    figures = _summary(window_from, seconds, ghost, ids, claims, runs, lags)
    metrics = [s.metrics() for s in schedulers]
    return {
        "schedulers": size,
        "ghost": ghost,
        "calls": calls[0],
        "heard": sum(m.claims_heard for m in metrics),
        "unranked": sum(m.claims_unranked for m in metrics),
        "start_s": started - began,
        **figures,
    }


async def _phantom(backend: Any, scheduler: Any, stopping: asyncio.Event) -> None:
    """A dead preferred instance: a fresh registry record carrying ``scheduler``'s jobs, kept
    fresh until ``stopping``; it never claims."""
    from anarchon._heartbeat import definition_of
    from anarchon.errors import AnarchonError
    from anarchon.registry import InstanceRecord

    store = backend.registry()
    jobs = tuple(definition_of(j) for j in scheduler._jobs.values())
    while not stopping.is_set():
        now = round(time.time() * 1000) + (scheduler._services.backend_clock.offset_ms or 0)
        record = InstanceRecord(
            id=GHOST,
            host="bench",
            pid=0,
            version="0",
            started_ms=now,
            heartbeat_ms=now,
            interval_ms=HEARTBEAT_MS,
            clock_offset_ms=0,
            jobs=jobs,
        )
        with contextlib.suppress(AnarchonError):  # a slow beat: the next one comes
            await store.record(record)
        await asyncio.sleep(HEARTBEAT_MS / 1000)


def _summary(
    first: int,
    seconds: float,
    ghost: bool,
    ids: list[str],
    claims: Counter[tuple[str, int]],
    runs: Counter[tuple[str, int]],
    lags: dict[tuple[str, int], float],
) -> dict[str, Any]:
    """The figures over the window's slots (from ``first``, epoch ms, for ``seconds``)."""
    from anarchon._rendezvous import rank

    window = [(f"tick{j}", first + s * 1000) for s in range(int(seconds)) for j in range(JOBS)]
    ran = [k for k in window if runs[k]]
    haunted = [k for k in window if ghost and rank(GHOST, ids, f"{k[0]}:{k[1]}") == 0]
    lag = [lags[k] for k in ran]
    lag_haunted = [lags[k] for k in haunted if k in lags]
    return {
        "slots": len(window),
        "claims_per_slot": sum(claims[k] for k in window) / len(window),
        "missed": sum(1 for k in window if not runs[k]),
        "duplicates": sum(1 for k in window if runs[k] > 1),
        "lag_p50_ms": percentile(lag, 50) if lag else None,
        "lag_p99_ms": percentile(lag, 99) if lag else None,
        "ghost_slots": len(haunted),
        "ghost_lag_p50_ms": percentile(lag_haunted, 50) if lag_haunted else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.claims", description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--schedulers", type=int, default=3)
    p.add_argument("--ghost", action="store_true")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the shared backends' stops warn at the end
    result = asyncio.run(_fleet(args.url, args.schedulers, args.ghost, args.seconds))
    with open(args.out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
