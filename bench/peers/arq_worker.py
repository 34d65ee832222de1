"""arq's cron jobs, as its docs set them up for several workers: one arq worker process.

    python -m bench.peers.arq_worker --redis redis://127.0.0.1:6379/15 --token abc --jobs 30 \
        --period 10 --phase 0 --out w.jsonl --ready w.ready

Registers ``jobs`` cron jobs ``bench<token>:j<n>``, each due at seconds ``phase``,
``phase + period`` ... of every minute, with arq's defaults (``unique=True``: every worker
enqueues job id ``<name>:<unix ms of the run>``, and Redis keeps the first; the run time is
``:SS.123456``, arq's default microsecond; poll every 0.5 s). The queue is named after the
token, and every key arq writes contains it, so the bench can delete them afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

from arq import cron
from arq.connections import RedisSettings
from arq.worker import Worker

from ._record import Recorder, write_json

RECORDER: Recorder | None = None


async def tick(ctx: dict[str, Any]) -> None:
    """Record the start: the job id is ``bench<token>:j<n>:<unix ms of the run>``."""
    started = time.time()
    name, ms = str(ctx["job_id"]).rsplit(":", 1)
    assert RECORDER is not None
    RECORDER.add(
        {
            "e": "start",
            "t": started,
            "j": name.rsplit(":", 1)[-1],
            "s": int(ms) // 1000 * 1000,
            "p": os.getpid(),
            "try": ctx.get("job_try"),
        }
    )


async def main(args: argparse.Namespace) -> None:
    global RECORDER
    RECORDER = Recorder(args.out, 200)
    flusher = asyncio.ensure_future(RECORDER.run())
    seconds = set(range(args.phase, 60, args.period))

    async def on_startup(ctx: dict[str, Any]) -> None:
        write_json(args.ready, {"pid": os.getpid(), "t_started": time.time()})

    worker = Worker(
        functions=[],
        cron_jobs=[
            cron(tick, name=f"bench{args.token}:j{n}", second=seconds) for n in range(args.jobs)
        ],
        redis_settings=RedisSettings.from_dsn(args.redis),
        queue_name=f"arq:bench{args.token}:queue",
        on_startup=on_startup,
        handle_signals=True,
    )
    try:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(worker.async_run(), args.seconds)
    finally:
        with contextlib.suppress(Exception):
            await worker.close()
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers.arq_worker")
    p.add_argument("--redis", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--period", type=int, default=10)
    p.add_argument("--phase", type=int, default=0)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
