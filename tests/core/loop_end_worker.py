"""An application that runs its scheduler under ``asyncio.run(main())`` and lets ``main`` end
with the scheduler still running: no ``async with``, no ``await scheduler.stop()``.

``main`` starts the scheduler (every option at its default), waits until its one job's handler
runs (the handler then sleeps for minutes) and the process gets SIGUSR1, and returns (``--end
return``) or raises (``--end raise``). With ``--plain RELEASE`` the handler is a plain function,
run on a thread: it waits until the file RELEASE exists, then returns. Each event is a JSON line
in ``--out``: ``start`` (the handler began), ``finished`` (the plain handler returns), ``ending``
(main ends now) and ``exited`` (``asyncio.run()`` came back).

    python -m tests.core.loop_end_worker --url sqlite:////tmp/x.db --out /tmp/a.jsonl \
        --schedule "5 * * * * *" --end return
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time

from anarchon import RunContext, Scheduler
from tests.conformance.worker import _write


async def main(args: argparse.Namespace) -> None:
    scheduler = Scheduler(args.url, instance_id=args.instance)
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        _write(args.out, _started(ctx))
        started.set()
        await asyncio.sleep(600)

    loop = asyncio.get_running_loop()

    def plain(ctx: RunContext) -> None:
        _write(args.out, _started(ctx))
        loop.call_soon_threadsafe(started.set)
        while not os.path.exists(args.plain):
            time.sleep(0.02)
        _write(args.out, {"event": "finished", "t": time.time(), "pid": os.getpid()})

    go = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    scheduler.add("tick", args.schedule, plain if args.plain else handler)
    await scheduler.start()
    await started.wait()
    await go.wait()
    _write(args.out, {"event": "ending", "t": time.time(), "pid": os.getpid()})
    if args.end == "raise":
        raise RuntimeError("main failed with the scheduler still running")


def _started(ctx: RunContext) -> dict[str, object]:
    """The ``start`` record of a run (the handler began)."""
    return {
        "event": "start",
        "t": time.time(),
        "slot": int(ctx.slot.timestamp() * 1000) if ctx.slot else None,
        "attempt": ctx.attempt,
        "instance": ctx.instance,
        "pid": os.getpid(),
    }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--instance", default="ending")
    p.add_argument("--schedule", required=True)
    p.add_argument("--end", choices=["return", "raise"], default="return")
    p.add_argument("--plain", default="", help="a plain handler, released by this file")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse()
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    try:
        with contextlib.suppress(RuntimeError):
            asyncio.run(main(arguments))
    finally:
        _write(arguments.out, {"event": "exited", "t": time.time(), "pid": os.getpid()})
