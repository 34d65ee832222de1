"""An application instance whose jobs are plain (thread) handlers, for multi-process tests.

``--hung N`` registers N jobs ``hang<n>`` whose handler never returns (a blocking call that
hangs); every instance also carries ``other``, a quick plain job. Each handler start is appended
as a JSON line to ``--out``.

    python -m tests.core.plain_worker --url sqlite:////tmp/x.db --out /tmp/a.jsonl --hung 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from anarchon import RunContext, Scheduler, backend_from_url
from tests.conformance.worker import _write

EVERY_SECOND = "* * * * * *"


async def main(args: argparse.Namespace) -> None:
    scheduler = Scheduler(
        backend_from_url(args.url), instance_id=args.instance, grace_ms=args.grace_ms
    )
    never = threading.Event()

    def record(ctx: RunContext) -> dict[str, Any]:
        slot = int(ctx.slot.timestamp() * 1000) if ctx.slot else None
        return {"t": time.time(), "job": ctx.job, "slot": slot, "instance": ctx.instance}

    def hang(ctx: RunContext) -> None:
        _write(args.out, {"event": "start", **record(ctx)})
        never.wait()  # hangs for good, and ignores ctx.should_stop

    def other(ctx: RunContext) -> None:
        _write(args.out, {"event": "start", **record(ctx)})

    for n in range(args.hung):  # registered first: they take the threads first
        scheduler.add(f"hang{n}", EVERY_SECOND, hang, jitter_ms=0)
    scheduler.add("other", EVERY_SECOND, other, jitter_ms=args.other_jitter_ms)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await scheduler.start()
    _write(args.ready, {"pid": os.getpid(), "t": time.time()})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.seconds)
    began = time.time()
    await scheduler.stop()
    _write(args.out, {"event": "stopped", "t": time.time(), "stop_s": time.time() - began})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--hung", type=int, default=0)
    p.add_argument("--other-jitter-ms", type=int, default=0)
    p.add_argument("--grace-ms", type=int, default=1_000)
    p.add_argument("--seconds", type=float, default=60.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(main(arguments))
