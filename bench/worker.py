"""One anarchon instance for the bench: a scheduler with groups of jobs on a backend URL.

    python -m bench.worker --url sqlite:////tmp/b.db --out /tmp/w0.jsonl --ready /tmp/w0.ready \
        --spec '[{"prefix": "f", "count": 14, "schedule": "0-59/4 * * * * *",
                  "options": {"jitter_ms": 0}}]'

Each group registers ``count`` jobs ``<prefix><n>`` with one schedule (or, with ``"schedule":
"idle"``, daily schedules at least five hours away, so nothing fires while idle cost is
measured; with ``"spread:<minutes>"``, :func:`spread_schedule`). Every handler start is
recorded (job, slot, host time, attempt, fence, pid) through
:class:`bench.peers._record.Recorder`; the ready file says when the scheduler had started and,
later, when the work ``start()`` spawned (catch-up look-ups) had settled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

T_SPAWNED = time.time()

from anarchon import RunContext, Scheduler, backend_from_url  # noqa: E402

from .peers._record import Recorder, write_json  # noqa: E402

T_IMPORTED = time.time()


def idle_schedule(n: int, now: datetime) -> str:
    """A daily schedule for job ``n`` that fires no sooner than five hours from ``now``."""
    hour = (now.hour + 6 + (n // 60) % 12) % 24
    return f"{n % 60} {hour} * * *"


def spread_schedule(n: int, period: int) -> str:
    """Job ``n`` every ``period`` minutes (a divisor of 60), at second ``n % 60`` and minute
    offset ``(n // 60) % period``: 1 000 jobs spread evenly over the period (the soak's)."""
    return f"{n % 60} {(n // 60) % period}-59/{period} * * * *"


def make_handler(recorder: Recorder, sleep_ms: int) -> Any:
    """The bench's handler: record the start, then sleep ``sleep_ms`` (0: return at once)."""

    async def handler(ctx: RunContext) -> None:
        slot = round(ctx.slot.timestamp() * 1000) if ctx.slot is not None else None
        recorder.start(ctx.job, slot, a=ctx.attempt, f=ctx.fence)
        if sleep_ms:
            try:
                await asyncio.sleep(sleep_ms / 1000)
            except asyncio.CancelledError:
                recorder.add({"e": "cancelled", "t": time.time(), "j": ctx.job, "s": slot})
                raise

    return handler


def register(scheduler: Scheduler, spec: list[dict[str, Any]], recorder: Recorder) -> int:
    """Add every job of ``spec``; return how many."""
    now = datetime.now(UTC)
    added = 0
    for group in spec:
        handler = make_handler(recorder, int(group.get("sleep_ms", 0)))
        options = dict(group.get("options", {}))
        for n in range(int(group["count"])):
            schedule = group["schedule"]
            if schedule == "idle":
                schedule = idle_schedule(n, now)
            elif schedule.startswith("spread:"):
                schedule = spread_schedule(n, int(schedule.removeprefix("spread:")))
            scheduler.add(f"{group['prefix']}{n}", schedule, handler, **options)
            added += 1
    return added


async def settle(scheduler: Scheduler, limit_s: float, stop: asyncio.Event) -> None:
    """Wait until the tasks ``start()`` spawned (catch-up look-ups) are done, up to ``limit_s``.

    Reads a private attribute: the bench wants to know when start-up work is over, which the
    public API does not say.
    """
    deadline = time.monotonic() + limit_s
    while getattr(scheduler, "_tasks", None):
        if time.monotonic() >= deadline or stop.is_set():
            return
        await asyncio.sleep(0.05)


async def main(args: argparse.Namespace) -> None:
    recorder = Recorder(args.out, args.flush_ms)
    flusher = asyncio.ensure_future(recorder.run())
    scheduler = Scheduler(
        backend_from_url(args.url),
        instance_id=args.instance or f"w{os.getpid()}",
        grace_ms=args.grace_ms,
    )
    jobs = register(scheduler, json.loads(args.spec), recorder)
    t_added = time.time()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await scheduler.start()
    ready: dict[str, Any] = {
        "pid": os.getpid(),
        "jobs": jobs,
        "t_spawned": T_SPAWNED,
        "t_imported": T_IMPORTED,
        "t_added": t_added,
        "t_started": time.time(),
    }
    if args.ready:
        write_json(args.ready, ready)
    await settle(scheduler, 120, stop)
    ready["t_settled"] = time.time()
    if args.ready:
        write_json(args.ready, ready)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.seconds)
    stopping = time.time()
    await scheduler.stop()
    recorder.add(
        {
            "e": "exit",
            "t": time.time(),
            "stop_s": time.time() - stopping,
            "p": os.getpid(),
            "metrics": scheduler.metrics().as_dict(),
        }
    )
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.worker")
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready")
    p.add_argument("--instance")
    p.add_argument("--spec", required=True, help="JSON list of job groups")
    p.add_argument("--grace-ms", type=int, default=30_000)
    p.add_argument("--seconds", type=float, default=900.0, help="exit after this long anyway")
    p.add_argument("--flush-ms", type=int, default=200, help="0: write each record at once")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    logging.basicConfig(
        level=arguments.log_level,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(main(arguments))
