"""Measure how fast a backup acts on Redis; prints the figures (not collected by pytest).

    .venv/bin/python -m tests.redis.measure_delays --runs 3

* takeover: three worker processes, lease 3000 ms, the runner killed with SIGKILL: time from
  the kill to the backup's handler start (bounded by the lease left at the kill).
* hand-over: the runner stopped with SIGTERM and grace_ms=100, lease 20000 ms: time from the
  signal to the backup's handler start (grace + release + pub/sub + takeover + claim start).
* hand-over without pub/sub: two in-process schedulers, the backup's notifications disabled,
  lease 3000 ms: the fallback at lease expiry that covers a lost message.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from anarchon import RunContext, Scheduler
from anarchon.backends.redis import RedisBackend
from tests.backends.redis import HARNESS, SERVER
from tests.conformance.procs import Fleet
from tests.conformance.test_failover import one_slot, runner_of, start_three, wait_for


async def takeover_after_kill() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with HARNESS.namespace(Path(tmp)) as ns:
            assert ns.url is not None
            fleet = Fleet(ns.url, Path(tmp))
            try:
                slot, first = start_three(fleet, sleep_ms=4_000, lease_ms=3_000)
                killed = time.time()
                runner_of(fleet, first).kill(signal.SIGKILL)
                second = wait_for(
                    fleet,
                    lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
                    20,
                    "the takeover",
                )
                return float(second["t"]) - killed
            finally:
                fleet.stop_all()


async def handover_after_sigterm() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with HARNESS.namespace(Path(tmp)) as ns:
            assert ns.url is not None
            fleet = Fleet(ns.url, Path(tmp))
            try:
                slot, first = start_three(fleet, sleep_ms=6_000, lease_ms=20_000, grace_ms=100)
                stopped = time.time()
                runner_of(fleet, first).kill(signal.SIGTERM)
                second = wait_for(
                    fleet,
                    lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
                    30,
                    "the hand-over",
                )
                return float(second["t"]) - stopped
            finally:
                fleet.stop_all()


class Deaf(RedisBackend):
    """A backend whose notifications are lost, as when pub/sub drops a message."""

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        return None


async def handover_without_pubsub() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with HARNESS.namespace(Path(tmp)) as ns:
            prefix = str(ns.extra["prefix"])
            starts: dict[str, float] = {}
            began = asyncio.Event()

            async def handler(ctx: RunContext) -> None:
                starts[ctx.instance] = time.time()
                began.set()
                await asyncio.sleep(30)

            schedule, _ = one_slot(3)
            schedulers = {
                name: Scheduler(Deaf(SERVER, prefix=prefix), instance_id=name, grace_ms=100)
                for name in ("a", "b")
            }
            for scheduler in schedulers.values():
                scheduler.add("job", schedule, handler, jitter_ms=0, lease_ms=3_000)
                await scheduler.start()
            try:
                await asyncio.wait_for(began.wait(), 15)
                [runner] = list(starts)
                [backup] = [name for name in schedulers if name != runner]
                stopped = time.time()
                await schedulers[runner].stop()
                for _ in range(300):
                    if backup in starts:
                        break
                    await asyncio.sleep(0.02)
                return starts[backup] - stopped
            finally:
                for scheduler in schedulers.values():
                    await scheduler.stop()


def show(name: str, values: list[float]) -> None:
    figures = ", ".join(f"{v:.2f}" for v in values)
    print(
        f"{name}: min {min(values):.2f}s median {statistics.median(values):.2f}s "
        f"max {max(values):.2f}s  ({figures})",
        flush=True,
    )


async def main(runs: int) -> None:
    for name, measure in (
        ("takeover after kill -9 (lease 3000 ms)", takeover_after_kill),
        ("hand-over after SIGTERM (grace 100 ms, lease 20000 ms)", handover_after_sigterm),
        ("hand-over, pub/sub lost (grace 100 ms, lease 3000 ms)", handover_without_pubsub),
    ):
        show(name, [await measure() for _ in range(runs)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args().runs))
