"""``anarchon demo``: several processes share one SQLite file and one every-2-seconds job.

The parent starts the instances, relays what each prints as it happens, stops them with SIGTERM
and then reads the shared history to count slots, runs, duplicates and missed slots.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ._models import RunStatus
from ._schedule import CronSchedule
from ._scheduler import Scheduler
from .backends.sqlite import SQLiteBackend

__all__ = ["run_demo"]

DEMO_JOB = "demo"
DEMO_SCHEDULE = "*/2 * * * * *"


async def _instance(db: Path, name: str, seconds: float) -> None:
    scheduler = Scheduler(SQLiteBackend(db), instance_id=name, grace_ms=5_000)

    @scheduler.job(DEMO_JOB, DEMO_SCHEDULE, jitter_ms=500)
    async def demo(ctx: object) -> None:
        from ._context import RunContext

        assert isinstance(ctx, RunContext) and ctx.slot is not None
        print(f"slot {ctx.slot:%H:%M:%S} ran on {name} (fence {ctx.fence})", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with scheduler:
        print(f"ready {name}", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


async def _relay(proc: asyncio.subprocess.Process, ready: asyncio.Event, waiting: set[str]) -> None:
    assert proc.stdout is not None
    async for raw in proc.stdout:
        line = raw.decode().rstrip()
        if line.startswith("ready "):
            waiting.discard(line.split(" ", 1)[1])
            if not waiting:
                ready.set()
            continue
        print(line, flush=True)


async def run_demo(instances: int = 3, seconds: float = 20.0) -> int:
    """Run the demo; return the number of duplicate plus missed slots (0 is success).

    SIGINT or SIGTERM ends it early as its end would: the instances are stopped, the slots due
    so far are counted, and the temporary directory is removed."""
    loop = asyncio.get_running_loop()
    stopped: list[str] = []
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        stopped.append(sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        with tempfile.TemporaryDirectory(prefix="anarchon-demo-") as tmp:
            return await _demo(Path(tmp) / "demo.db", instances, seconds, stop, stopped)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _demo(
    db: Path, instances: int, seconds: float, stop: asyncio.Event, stopped: list[str]
) -> int:
    names = [f"instance-{n + 1}" for n in range(instances)]
    print(f"{instances} instances share {db}; job {DEMO_JOB!r} runs at '{DEMO_SCHEDULE}'")
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "anarchon._demo",
            str(db),
            name,
            str(seconds + 30),
            stdout=asyncio.subprocess.PIPE,
        )
        for name in names
    ]
    ready, waiting = asyncio.Event(), set(names)
    relays = [asyncio.ensure_future(_relay(p, ready, waiting)) for p in procs]
    began = time.time()
    try:
        await _wait_any(60, ready, stop)
        if ready.is_set() and not stop.is_set():
            began = time.time()
            await _wait_any(seconds, stop)
    finally:
        ended = time.time()
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(p.wait() for p in procs))
        await asyncio.gather(*relays)
    if stopped:
        print(f"stopped by {stopped[0]} after {ended - began:.1f} of {seconds:g} s")
    elif not ready.is_set():
        print(f"the {instances} instances did not all start within 60 s", file=sys.stderr)
        return 1
    if not ready.is_set():
        return 0
    return await _summarise(db, began, ended)


async def _wait_any(within_s: float, *events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set, at most ``within_s`` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _summarise(db: Path, began: float, ended: float) -> int:
    backend = SQLiteBackend(db)
    await backend.start()
    try:
        history = await backend.history(DEMO_JOB, limit=10_000)
    finally:
        await backend.stop()
    # The slots every instance was up for: after all were ready, before the stop began,
    # leaving each slot its jitter (0.5 s) to be claimed.
    schedule = CronSchedule(DEMO_SCHEDULE)
    expected = set(schedule.slots(int(began * 1000), int((ended - 1) * 1000)))
    runs = Counter(r.slot_ms for r in history if r.status is RunStatus.SUCCEEDED)
    duplicates = sum(n - 1 for slot, n in runs.items() if slot in expected and n > 1)
    missed = len([slot for slot in expected if runs[slot] == 0])
    ran = sum(runs[slot] for slot in expected)
    print(f"slots: {len(expected)}, runs: {ran}, duplicates: {duplicates}, missed: {missed}")
    return duplicates + missed


def main(argv: list[str] | None = None) -> None:
    """Entry point of one demo instance: ``python -m anarchon._demo DB NAME SECONDS``."""
    parser = argparse.ArgumentParser(prog="anarchon._demo")
    parser.add_argument("db", type=Path)
    parser.add_argument("name")
    parser.add_argument("seconds", type=float)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(_instance(args.db, args.name, args.seconds))


if __name__ == "__main__":
    main()
