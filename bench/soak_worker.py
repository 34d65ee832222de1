"""One soak instance: :mod:`bench.worker`, plus a sampler of its asyncio task count.

    python -m bench.soak_worker --tasks /tmp/w0.tasks.jsonl --sample-s 10 <bench.worker args>

The task count can only be read from inside the process; everything else the soak samples
(RSS, CPU, descriptors, sockets) is read from outside through psutil.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time

from . import worker
from .peers._record import Recorder


async def sample_tasks(recorder: Recorder, every_s: float) -> None:
    """Record ``len(asyncio.all_tasks())`` every ``every_s`` (this sampler counts itself)."""
    while True:
        recorder.add({"e": "tasks", "t": time.time(), "n": len(asyncio.all_tasks())})
        recorder.flush()
        await asyncio.sleep(every_s)


async def main(args: argparse.Namespace, rest: argparse.Namespace) -> None:
    recorder = Recorder(args.tasks, flush_ms=0)
    sampler = asyncio.ensure_future(sample_tasks(recorder, args.sample_s))
    try:
        await worker.main(rest)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.soak_worker", add_help=False)
    p.add_argument("--tasks", required=True, help="JSON lines of task counts")
    p.add_argument("--sample-s", type=float, default=10.0)
    args, rest = p.parse_known_args(argv)
    return args, worker.parse(rest)


if __name__ == "__main__":
    own, arguments = parse()
    logging.basicConfig(
        level=arguments.log_level,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(main(own, arguments))
