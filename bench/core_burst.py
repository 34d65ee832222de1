"""The core alone, in one process: N jobs due at one instant on the in-memory backend.

    python -m bench.core_burst --n 10000 [--history 20] [--profile burst.prof]

The set-up of the burst section's memory row (one instance, ``jitter_ms=0``, ``catch_up='none'``,
a fixed time of day a few seconds ahead) without the bench's worker process and its recorder,
so a change to the core can be compared A/B in one sitting. Prints one JSON line: when the first,
median and last handler started after the slot (ms), the process CPU from just before the slot
until the last start (both threads: the lease keeper's too), and the garbage collector's CPU time
and collections by generation over that span (in a burst of 10 000 it was half the time).
With ``--history H``, each job already holds H ended runs (recorded through the backend before
the scheduler starts): a burst in steady state rather than a job's first.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import math
import os
import time
from datetime import UTC, datetime
from typing import Any

from anarchon import Overlap, RunContext, RunStatus, Scheduler, Trigger
from anarchon.backend import ClaimRequest, FinishRequest
from anarchon.testing import MemoryBackend


class _GcClock:
    """CPU time spent in the garbage collector (its thread's: wall time would count what other
    processes take on a busy machine), and collections by generation."""

    def __init__(self, count_walked: bool = False) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self.walked = 0
        self._count_walked = count_walked
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self._count_walked:  # the collector's work, free of the machine's load
                generation = info["generation"]
                self.walked += sum(len(gc.get_objects(g)) for g in range(generation + 1))
            self._began = time.thread_time()
            return
        self.seconds += time.thread_time() - self._began
        self.collections[info["generation"]] += 1


async def _recorded(jobs: int, history: int) -> MemoryBackend:
    """A backend where each of the ``jobs`` jobs holds ``history`` ended runs, an hour ago."""
    backend = MemoryBackend()
    first_s = int(time.time()) - 3600
    for n in range(history):
        requests = [
            ClaimRequest(
                job=f"b{job}",
                slot=(first_s + n) * 1000,
                run_id=os.urandom(16).hex(),
                token=os.urandom(16).hex(),
                instance="earlier",
                trigger=Trigger.SCHEDULE,
                lease_ms=30_000,
                overlap=Overlap.SKIP,
            )
            for job in range(jobs)
        ]
        won = [outcome.ticket for outcome in await backend.claim(requests) if outcome.ticket]
        await backend.finish_many([FinishRequest(t, RunStatus.SUCCEEDED, None) for t in won])
    return backend


async def burst(
    jobs: int, lead_s: float, profile: str | None, count_walked: bool = False, history: int = 0
) -> dict[str, Any]:
    """Run one burst of ``jobs`` slots; return its figures (with ``count_walked``, also how
    many objects the collections walked: slower, but the same on a busy machine; with
    ``history``, each job holds that many ended runs before it starts)."""
    lags: list[float] = []
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()

    async def handler(ctx: RunContext) -> None:
        assert ctx.slot is not None
        lags.append(time.time() - ctx.slot.timestamp())
        if len(lags) == jobs and not done.done():
            done.set_result(time.process_time())

    backend = await _recorded(jobs, history) if history else MemoryBackend()
    scheduler = Scheduler(backend, instance_id="core")
    slot_s = math.ceil(time.time() + lead_s)
    moment = datetime.fromtimestamp(slot_s, UTC)
    schedule = f"{moment.second} {moment.minute} {moment.hour} * * *"
    for n in range(jobs):
        scheduler.add(f"b{n}", schedule, handler, jitter_ms=0, catch_up="none")
    await scheduler.start()
    wait_s = slot_s - 0.05 - time.time()
    if wait_s <= 0:
        await scheduler.stop()
        raise SystemExit(f"start-up took past the slot: raise --lead-s (now {lead_s})")
    await asyncio.sleep(wait_s)
    collector = _GcClock(count_walked)
    gc.callbacks.append(collector)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    cpu_before = time.process_time()
    try:
        cpu_after = await asyncio.wait_for(done, 60)
    finally:
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
        gc.callbacks.remove(collector)
        await scheduler.stop()
    lags.sort()
    return {
        "jobs": jobs,
        "first_ms": round(lags[0] * 1000, 1),
        "p50_ms": round(lags[len(lags) // 2] * 1000, 1),
        "all_ms": round(lags[-1] * 1000, 1),
        "cpu_ms": round((cpu_after - cpu_before) * 1000, 1),
        "cpu_us_per_slot": round((cpu_after - cpu_before) / jobs * 1e6, 1),
        "gc_ms": round(collector.seconds * 1000, 1),
        "gc_collections": collector.collections,
        **({"history": history} if history else {}),
        **({"gc_walked": collector.walked} if count_walked else {}),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the burst, print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.core_burst")
    parser.add_argument("--n", type=int, default=10_000, help="jobs due at the one instant")
    parser.add_argument("--lead-s", type=float, default=3.0, help="the slot this far ahead")
    parser.add_argument(
        "--history", type=int, default=0, help="ended runs each job holds before the burst"
    )
    parser.add_argument("--profile", help="write a cProfile of the burst to this file")
    parser.add_argument(
        "--gc-walked",
        action="store_true",
        help="also count the objects the garbage collector walked (slows the burst down)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    figures = burst(args.n, args.lead_s, args.profile, args.gc_walked, args.history)
    print(json.dumps(asyncio.run(figures)))


if __name__ == "__main__":
    main()
