"""APScheduler 3 with one SQLAlchemy job store shared by every process: one process.

    python -m bench.peers.apscheduler_worker --url postgresql+psycopg://127.0.0.1/db \
        --schema aps --setup
    python -m bench.peers.apscheduler_worker --url ... --schema aps --jobs 30 --period 10 \
        --phase 4 --out w.jsonl --ready w.ready

This is the set-up APScheduler's FAQ says does not work ("How do I share a single job store
among one or more worker processes? Short answer: You can't"), and the one users keep trying
under gunicorn. Each process adds the same jobs (``replace_existing=True``) to the shared
store and runs an ``AsyncIOScheduler`` with the defaults (``misfire_grace_time=1``,
``coalesce=True``, ``max_instances=1``). ``--setup`` creates the table and exits.

APScheduler 3 does not tell a job its scheduled time, so a start is attributed to the latest
due time at or before it (the schedule's grid); scheduler events (missed runs) are recorded too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from ._record import Recorder, write_json

RECORDER: Recorder | None = None
GRID: tuple[int, int] = (10, 0)


async def tick(job: str) -> None:
    """Record the start, attributed to the latest due time of the grid at or before it."""
    started = time.time()
    period, phase = GRID
    slot = int((started - phase) // period * period + phase)
    assert RECORDER is not None
    RECORDER.add({"e": "start", "t": started, "j": job, "s": slot * 1000, "p": os.getpid()})


def store(args: argparse.Namespace) -> SQLAlchemyJobStore:
    return SQLAlchemyJobStore(url=args.url, tableschema=args.schema)


async def setup(args: argparse.Namespace) -> None:
    scheduler = AsyncIOScheduler(jobstores={"default": store(args)}, timezone="UTC")
    scheduler.start(paused=True)
    scheduler.shutdown(wait=False)


def _on_event(event: Any) -> None:
    assert RECORDER is not None
    kind = "missed" if event.code == EVENT_JOB_MISSED else "max_instances"
    when = getattr(event, "scheduled_run_time", None)
    RECORDER.add(
        {
            "e": kind,
            "t": time.time(),
            "j": event.job_id,
            "s": int(when.timestamp() * 1000) if when is not None else None,
            "p": os.getpid(),
        }
    )


async def main(args: argparse.Namespace) -> None:
    global RECORDER, GRID
    RECORDER = Recorder(args.out, 200)
    GRID = (args.period, args.phase)
    flusher = asyncio.ensure_future(RECORDER.run())
    scheduler = AsyncIOScheduler(jobstores={"default": store(args)}, timezone="UTC")
    scheduler.add_listener(_on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
    for n in range(args.jobs):
        scheduler.add_job(
            tick,
            "cron",
            second=f"{args.phase}-59/{args.period}",
            id=f"j{n}",
            args=[f"j{n}"],
            replace_existing=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    scheduler.start()
    write_json(args.ready, {"pid": os.getpid(), "t_started": time.time()})
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.seconds)
    finally:
        scheduler.shutdown(wait=False)
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers.apscheduler_worker")
    p.add_argument("--url", required=True, help="SQLAlchemy URL of the shared job store")
    p.add_argument("--schema", default=None)
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
    asyncio.run(setup(arguments) if arguments.setup else main(arguments))
