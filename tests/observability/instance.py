"""One application instance for the real-Prometheus test: a scheduler on a SQLite file with a
job that fails now and then, its metrics served by the same server ``anarchon run
--metrics-port`` uses.

On SIGTERM the scheduler stops; the server goes on serving the final counts (so that Prometheus
scrapes them once more) until the second SIGTERM, or ``--linger`` seconds.

    python -m tests.observability.instance --db /tmp/a.db --port 9464 --instance w0 \
        --ready /tmp/w0.ready --stopped /tmp/w0.stopped
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time

from anarchon import RunContext, Scheduler, SQLiteBackend
from anarchon._http import HttpServer

JOB = "flaky"


def slot_second(ctx: RunContext) -> int:
    return int(ctx.slot.timestamp()) if ctx.slot else 0


async def flaky(ctx: RunContext) -> None:
    """Every second; the slots of second % 7 == 3 run 1.6 s (the next slot is skipped: overlap),
    those of second % 5 == 0 fail."""
    second = slot_second(ctx)
    if second % 7 == 3:
        await asyncio.sleep(1.6)
    if second % 5 == 0:
        raise RuntimeError(f"flaky: slot second {second} is a multiple of 5")


def build(args: argparse.Namespace) -> Scheduler:
    scheduler = Scheduler(
        SQLiteBackend(args.db), instance_id=args.instance, grace_ms=5_000, heartbeat_ms=1_000
    )
    scheduler.add(JOB, "* * * * * *", flaky, jitter_ms=0, max_late_ms=2_000, overlap="skip")
    return scheduler


def _mark(path: str) -> None:
    with open(path, "w") as handle:
        json.dump({"pid": os.getpid(), "t": time.time()}, handle)


async def serve(scheduler: Scheduler, ready: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await scheduler.start()
    _mark(ready)
    await stop.wait()
    await scheduler.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--stopped", required=True)
    p.add_argument("--linger", type=float, default=60.0)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {args.instance} %(name)s %(levelname)s %(message)s",
    )
    scheduler = build(args)
    server = HttpServer(scheduler, args.port, "127.0.0.1")
    server.start()
    try:
        asyncio.run(serve(scheduler, args.ready))
        _mark(args.stopped)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the second SIGTERM ends the process
        time.sleep(args.linger)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
