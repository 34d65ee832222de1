"""One application instance for multi-process tests: a scheduler with one job on a backend URL.

Each handler start and end is appended as a JSON line to ``--out`` (one file per process), so
the test can count runs per slot after the processes are gone, including processes it killed.

    python -m tests.conformance.worker --url sqlite:////tmp/x.db --out /tmp/a.jsonl \
        --job tick --schedule "* * * * * *" --seconds 10

With ``--schedule-from PLAN`` the process loads (imports, makes its backend and scheduler),
creates ``--loaded`` and waits for the file ``PLAN`` to hold the job's schedule; the test writes
it once every instance is loaded, so start-up cost does not eat into a slot planned a few
seconds ahead (:func:`tests.conformance.test_failover.plan_one_slot`).
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
from typing import Any

from anarchon import RunContext, Scheduler, backend_from_url


def _write(path: str, record: dict[str, Any]) -> None:
    line = json.dumps(record) + "\n"
    # One write per line on an O_APPEND descriptor: lines of concurrent writers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "jitter_ms",
        "max_late_ms",
        "lease_ms",
        "max_attempts",
        "overlap",
        "catch_up",
        "catch_up_window_ms",
        "timeout_ms",
    )
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _record_spans() -> Any:
    """anarchon's spans into the OpenTelemetry SDK's in-memory exporter (its exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from anarchon import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.configure(provider)
    return exporter


def _spans(exporter: Any) -> list[dict[str, Any]]:
    """The ``slot <job>`` spans recorded: name, attributes, trace id and parent span id."""
    return [
        {
            "name": span.name,
            "attributes": dict(span.attributes or {}),
            "trace_id": span.context.trace_id,
            "parent": span.parent.span_id if span.parent else None,
        }
        for span in exporter.get_finished_spans()
        if span.name.startswith("slot ")
    ]


async def main(args: argparse.Namespace) -> None:
    backend = backend_from_url(args.url)
    given = {} if args.grace_ms is None else {"grace_ms": args.grace_ms}  # else the default
    if args.heartbeat_ms is not None:
        given["heartbeat_ms"] = args.heartbeat_ms
    scheduler = Scheduler(backend, instance_id=args.instance or f"w{os.getpid()}", **given)

    async def handler(ctx: RunContext) -> None:
        base = {
            "slot": int(ctx.slot.timestamp() * 1000) if ctx.slot else None,
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "fence": ctx.fence,
            "instance": ctx.instance,
            "pid": os.getpid(),
            "trigger": ctx.trigger.value,
        }
        _write(args.out, {"event": "start", "t": time.time(), **base})
        try:
            if args.handler_mode == "check":
                # Steps of half a second, each after ctx.check_lease(): a lost lease raises.
                until = time.monotonic() + args.sleep_ms / 1000
                while time.monotonic() < until:
                    ctx.check_lease()
                    await asyncio.sleep(0.5)
            elif args.handler_mode == "block":
                time.sleep(args.sleep_ms / 1000)  # noqa: ASYNC251 - blocks the loop on purpose
            else:
                await asyncio.sleep(args.sleep_ms / 1000)
        except asyncio.CancelledError:
            _write(args.out, {"event": "cancelled", "t": time.time(), **base})
            raise
        _write(args.out, {"event": "end", "t": time.time(), "lost": ctx.lease_lost, **base})

    exporter = _record_spans() if args.spans else None
    schedule = args.schedule
    if args.schedule_from is not None:
        schedule = _planned_schedule(args.schedule_from, args.loaded)  # the loop runs nothing yet
    scheduler.add(args.job, schedule, handler, **_options(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await scheduler.start()
    if args.ready:
        _write(args.ready, {"pid": os.getpid(), "t": time.time()})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.seconds)
    await scheduler.stop()
    metrics = scheduler.metrics()
    _write(
        args.out,
        {
            "event": "exit",
            "t": time.time(),
            "pid": os.getpid(),
            "metrics": metrics.as_dict(),
            "by_job": {
                name: {"slots": figures.slots, "runs": figures.runs}
                for name, figures in metrics.by_job.items()
            },
        },
    )
    if exporter is not None:
        _write(args.out, {"event": "spans", "pid": os.getpid(), "spans": _spans(exporter)})


def _planned_schedule(plan: str, loaded: str | None) -> str:
    """Create ``loaded`` (if given), then wait for the file ``plan`` and return the schedule
    it holds (the test writes it whole: a rename)."""
    if loaded:
        _write(loaded, {"pid": os.getpid(), "t": time.time()})
    while not os.path.exists(plan):
        time.sleep(0.02)
    with open(plan) as handle:
        return handle.read().strip()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready")
    p.add_argument("--job", default="tick")
    p.add_argument("--schedule", default="* * * * * *")
    p.add_argument("--schedule-from", help="wait, loaded, for the schedule in this file")
    p.add_argument("--loaded", help="created once loaded (with --schedule-from)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--sleep-ms", type=int, default=0)
    p.add_argument("--grace-ms", type=int, help="default: the Scheduler's")
    p.add_argument("--heartbeat-ms", type=int, help="default: the Scheduler's")
    p.add_argument(
        "--handler-mode",
        choices=["sleep", "block", "check"],
        default="sleep",
        help="sleep: await asyncio.sleep; block: time.sleep inside async def (blocks the loop); "
        "check: asyncio.sleep in steps, each after ctx.check_lease()",
    )
    p.add_argument("--instance")
    for name in (
        "jitter-ms",
        "max-late-ms",
        "lease-ms",
        "max-attempts",
        "catch-up-window-ms",
        "timeout-ms",
    ):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--overlap")
    p.add_argument("--catch-up")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--spans",
        type=int,
        default=0,
        help="1: record anarchon's spans (OpenTelemetry SDK, in memory) and write its slot "
        "spans on exit",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    logging.basicConfig(
        level=arguments.log_level,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(main(arguments))
