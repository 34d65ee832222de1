"""One application instance for the steering process tests (test_steering_processes.py,
test_retry_processes.py).

    python -m tests.conformance.steering_worker --url URL [--instance w0] --out w0.jsonl \
        --ready w0.ready --fleet steer|retry|crash

``steer``: the Scheduler and both jobs (``tick`` and ``other``, every second) with every option
at its default but the schedule. ``retry``: ``flaky`` (raises on its first run, succeeds on its
retry), ``doomed`` (always raises; ``on_failure`` once its retry failed too), both every two
seconds with ``retries=1``, and ``beat`` (every second, ``max_late_ms=1000``, no jitter, so a
gap of seconds is recorded ``missed`` when instances restart). ``crash``: ``flaky`` alone, every
two seconds, with every option at its default but ``retries=1``.

With ``$ANARCHON_TEST_EXIT_AFTER_FAILED_FINISH`` set, the process exits (``os._exit``, status
:data:`EXIT_STATUS`) as soon as a call recording results returns a ``failed`` run, before the
scheduler does anything more, after one JSON line ``{"event": "exit", ...}`` naming that run.

Each handler start, and each ``on_failure`` call, is appended as one JSON line to ``--out``;
``--ready`` is created once the scheduler has started. Runs until SIGTERM (or SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Final

from anarchon import Run, RunContext, RunStatus, Scheduler, backend_from_url
from anarchon.backend import Backend, FinishRequest
from anarchon.errors import BackendError
from tests.conformance.procs import serve_until_signalled
from tests.conformance.worker import _write

EXIT_AFTER_FAILED_FINISH: Final = "ANARCHON_TEST_EXIT_AFTER_FAILED_FINISH"
"""Set (to anything): exit right after a failed result was recorded."""
EXIT_STATUS: Final = 17
"""The exit status of that exit."""


def _ms(ctx: RunContext) -> int | None:
    return round(ctx.slot.timestamp() * 1000) if ctx.slot else None


def exit_after_failed_finish(backend: Backend, out: str) -> None:
    """Make ``backend.finish_many`` end the process once it returns a ``failed`` run: what a
    process killed right after the backend accepted a failed result leaves behind."""
    recorded = backend.finish_many

    async def finish_many(items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        answers = await recorded(items)
        for run in answers:
            if isinstance(run, Run) and run.status is RunStatus.FAILED:
                _write(
                    out,
                    {"event": "exit", "job": run.job, "slot": run.slot_ms, "run_id": run.run_id},
                )
                os._exit(EXIT_STATUS)
        return answers

    backend.finish_many = finish_many  # type: ignore[method-assign]


async def main(args: argparse.Namespace) -> None:
    named = {} if args.instance is None else {"instance_id": args.instance}  # else the default
    backend = backend_from_url(args.url)
    if os.environ.get(EXIT_AFTER_FAILED_FINISH):
        exit_after_failed_finish(backend, args.out)  # before the scheduler binds the method
    scheduler = Scheduler(backend, **named)

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
    elif args.fleet == "crash":
        scheduler.add("flaky", "*/2 * * * * *", flaky, retries=1)
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
    parser.add_argument("--fleet", choices=["steer", "retry", "crash"], required=True)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s"
    )
    asyncio.run(main(parser.parse_args()))
