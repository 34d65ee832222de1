"""procrastinate's periodic tasks, as its docs set them up: one worker process.

    python -m bench.peers.procrastinate_worker --dsn postgresql://127.0.0.1/db --setup
    python -m bench.peers.procrastinate_worker --dsn ... --jobs 30 --period 10 --phase 2 \
        --out w.jsonl --ready w.ready

``--setup`` applies procrastinate's schema to the (bench's own) database and exits. A worker
registers one task with ``jobs`` periodic ids, each due at seconds ``phase``, ``phase + period``
... (croniter's sixth field). Every worker runs the periodic deferrer, which inserts each due
``(task, periodic id, timestamp)`` once thanks to a unique constraint; the workers then fetch
and run the jobs (defaults: concurrency 1, LISTEN/NOTIFY plus a 5 s poll; the deferrer wakes
0.5 s after each due time, by design).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time

import procrastinate

from ._record import Recorder, write_json

RECORDER: Recorder | None = None


def build(dsn: str) -> procrastinate.App:
    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))


async def setup(dsn: str) -> None:
    app = build(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def main(args: argparse.Namespace) -> None:
    global RECORDER
    RECORDER = Recorder(args.out, 200)
    recorder = RECORDER
    flusher = asyncio.ensure_future(recorder.run())
    app = build(args.dsn)

    @app.task(name="bench_tick")  # type: ignore[untyped-decorator]
    async def tick(timestamp: int, job: str) -> None:
        recorder.add(
            {"e": "start", "t": time.time(), "j": job, "s": timestamp * 1000, "p": os.getpid()}
        )

    cron = f"* * * * * {args.phase}-59/{args.period}"
    for n in range(args.jobs):
        app.periodic(cron=cron, periodic_id=f"j{n}", task_kwargs={"job": f"j{n}"})(tick)
    try:
        async with app.open_async():
            write_json(args.ready, {"pid": os.getpid(), "t_started": time.time()})
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(app.run_worker_async(), args.seconds)
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers.procrastinate_worker")
    p.add_argument("--dsn", required=True)
    p.add_argument("--setup", action="store_true")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--period", type=int, default=10)
    p.add_argument("--phase", type=int, default=0)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--out")
    p.add_argument("--ready")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.setup:
        asyncio.run(setup(arguments.dsn))
    else:
        asyncio.run(main(arguments))
