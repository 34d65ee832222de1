"""One application instance for the steering process tests (test_steering_processes.py).

    python -m tests.conformance.steering_worker --url URL [--instance w0] --out w0.jsonl \
        --ready w0.ready --fleet steer|retry

``steer``: the Scheduler and both jobs (``tick`` and ``other``, every second) with every option
at its default but the schedule. ``retry``: ``flaky`` (raises on its first run, succeeds on its
retry), ``doomed`` (always raises; ``on_failure`` once its retry failed too), both every two
seconds with ``retries=1``, and ``beat`` (every second, ``max_late_ms=1000``, no jitter, so a
gap of seconds is recorded ``missed`` when instances restart).

Each handler start, and each ``on_failure`` call, is appended as one JSON line to ``--out``;
``--ready`` is created once the scheduler has started. Runs until SIGTERM (or SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

from anarchon import Run, RunContext, Scheduler, backend_from_url
from tests.conformance.procs import serve_until_signalled
from tests.conformance.worker import _write


def _ms(ctx: RunContext) -> int | None:
    return round(ctx.slot.timestamp() * 1000) if ctx.slot else None


async def main(args: argparse.Namespace) -> None:
    named = {} if args.instance is None else {"instance_id": args.instance}  # else the default
    scheduler = Scheduler(backend_from_url(args.url), **named)

    def record(ctx: RunContext) -> None:
        _write(
            args.out,
            {
                "event": "start",
                "t": time.time(),
                "job": ctx.job,
                "slot": _ms(ctx),
                "run_id": ctx.run_id,
                "attempt": ctx.attempt,
                "retry": ctx.retry,
                "fence": ctx.fence,
                "trigger": ctx.trigger.value,
                "instance": ctx.instance,
            },
        )

    async def plain(ctx: RunContext) -> None:
        record(ctx)

    async def flaky(ctx: RunContext) -> None:
        record(ctx)
        if ctx.retry == 0:
            raise RuntimeError(f"flaky fails its first run of {ctx.run_id}")

    async def doomed(ctx: RunContext) -> None:
        record(ctx)
        raise RuntimeError(f"doomed fails (retry {ctx.retry})")

    def on_failure(run: Run) -> None:
        _write(
            args.out,
            {
                "event": "on_failure",
                "t": time.time(),
                "job": run.job,
                "slot": run.slot_ms,
                "run_id": run.run_id,
                "trigger": run.trigger.value,
                "instance": scheduler.instance_id,
            },
        )

    options: dict[str, Any] = {"retries": 1, "retry_backoff_ms": 100}
    if args.fleet == "steer":
        scheduler.add("tick", "* * * * * *", plain)
        scheduler.add("other", "* * * * * *", plain)
    else:
        scheduler.add("flaky", "*/2 * * * * *", flaky, **options)
        scheduler.add("doomed", "*/2 * * * * *", doomed, on_failure=on_failure, **options)
        scheduler.add("beat", "* * * * * *", plain, max_late_ms=1000, jitter_ms=0)
    await serve_until_signalled(scheduler, args.ready)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--instance", help="default: the Scheduler's own instance id")
    parser.add_argument("--out", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--fleet", choices=["steer", "retry"], required=True)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s"
    )
    asyncio.run(main(parser.parse_args()))
