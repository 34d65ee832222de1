"""One application instance of the fault suite: ``Scheduler.run()`` with jobs of chosen behaviours.

The process imports everything, appends a ``loaded`` record, and waits for its spec (a JSON file
``<name>.go`` the harness writes once every instance is loaded, so start-up cost does not eat
into the planned slot). Then it builds a scheduler with the spec's jobs, every option left at its
default unless the spec names it, and calls ``scheduler.run()`` as an application does: SIGTERM
stops it gracefully.

Every event is one JSON line in ``<name>.jsonl``, written with one ``write`` on an ``O_APPEND``
descriptor (lines of concurrent writers never interleave, and a ``kill -9`` loses nothing that
was written). Each record has ``wall`` (``time.time()``, faked under libfaketime) and ``mono``
(``time.monotonic()``, the machine-wide ``CLOCK_MONOTONIC``, never faked: the harness orders
events of all processes by it). Handler records carry job, slot, run_id, attempt, fence,
instance and pid; the scheduler's log records that have an ``action`` become ``log`` records
(``run_succeeded``/``run_failed``: a result accepted; ``result_refused``; ``lease_lost``;
``handed_over`` ...).

Handler behaviours (``behaviour`` of a job in the spec):

* ``normal``: async; ``duration_ms`` of work in steps of ``step_ms``, calling
  ``ctx.check_lease()`` before each step, as the docs advise.
* ``sync``: the same as a plain function (runs in the scheduler's worker threads).
* ``exit``: async; one step, then ``sys.exit(3)``.
* ``hang``: plain function; one step, then blocks forever.
* ``ignore_cancel``: async; steps without checking the lease, catching ``CancelledError`` and
  going on working.
* ``block_loop``: async; ``time.sleep(block_ms / 1000)`` inside ``async def`` (the event loop is
  blocked), then normal steps for ``duration_ms``.

``retry_duration_ms`` (default ``duration_ms``) is the work of attempts after the first.

    python -m tests.chaos.worker --dir /tmp/trial --name w0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anarchon import LeaseLost, RunContext, Scheduler, backend_from_url

# The attributes a scheduler log record may carry that are worth keeping.
LOG_FIELDS = ("job", "slot", "run_id", "attempt", "fence", "reason", "holder")


class Recorder:
    """Appends JSON records to one file; safe from any thread."""

    def __init__(self, path: Path, instance: str) -> None:
        self.path = path
        self.instance = instance
        self.pid = os.getpid()

    def __call__(self, event: str, **fields: Any) -> None:
        record = {
            "event": event,
            "wall": time.time(),
            "mono": time.monotonic(),
            "instance": self.instance,
            "pid": self.pid,
            **fields,
        }
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


class LogRecorder(logging.Handler):
    """Turns the scheduler's log records that name an ``action`` into ``log`` records."""

    def __init__(self, record: Recorder) -> None:
        super().__init__(logging.INFO)
        self._record = record

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action is None:
            return
        fields = {k: getattr(record, k) for k in LOG_FIELDS if hasattr(record, k)}
        if "slot" in fields and isinstance(fields["slot"], str) and fields["slot"].isdigit():
            fields["slot"] = int(fields["slot"])
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break the worker
            message = str(record.msg)
        self._record("log", action=action, level=record.levelname, message=message[:500], **fields)


def _base(ctx: RunContext) -> dict[str, Any]:
    return {
        "job": ctx.job,
        "slot": round(ctx.slot.timestamp() * 1000) if ctx.slot else None,
        "run_id": ctx.run_id,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
        "trigger": ctx.trigger.value,
    }


Handler = Callable[[RunContext], Any]


def make_handler(spec: dict[str, Any], record: Recorder) -> Handler:  # noqa: C901 - one table
    """The handler of one job of the spec."""
    behaviour = spec.get("behaviour", "normal")
    step_ms = int(spec.get("step_ms", 1000))
    first_ms = int(spec.get("duration_ms", step_ms))
    # Attempts after the first (takeovers, hand-overs) may be shorter, to keep trials short.
    retry_ms = int(spec.get("retry_duration_ms", first_ms))
    block_ms = int(spec.get("block_ms", 20_000))

    def steps_of(ctx: RunContext) -> int:
        return max(1, (first_ms if ctx.attempt <= 1 else retry_ms) // step_ms)

    async def normal(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        try:
            for i in range(steps_of(ctx)):
                ctx.check_lease()
                record("step", i=i, ms=step_ms, **base)
                try:
                    await asyncio.sleep(step_ms / 1000)
                finally:
                    record("step_end", i=i, **base)
        except LeaseLost as exc:
            record("lost", how="check_lease", error=str(exc)[:300], **base)
            raise
        except asyncio.CancelledError:
            record("cancelled", lost=ctx.lease_lost, **base)
            raise
        record("end", outcome="ok", lost=ctx.lease_lost, **base)

    def plain(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        try:
            for i in range(steps_of(ctx)):
                ctx.check_lease()
                record("step", i=i, ms=step_ms, **base)
                try:
                    time.sleep(step_ms / 1000)
                finally:
                    record("step_end", i=i, **base)
        except LeaseLost as exc:
            record("lost", how="check_lease", error=str(exc)[:300], **base)
            raise
        record("end", outcome="ok", lost=ctx.lease_lost, **base)

    async def exits(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        ctx.check_lease()
        record("step", i=0, ms=step_ms, **base)
        await asyncio.sleep(step_ms / 1000)
        record("step_end", i=0, **base)
        record("end", outcome="exit", lost=ctx.lease_lost, **base)
        sys.exit(3)

    def hangs(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        ctx.check_lease()
        record("step", i=0, ms=step_ms, **base)
        time.sleep(step_ms / 1000)
        record("step_end", i=0, **base)
        record("hang", **base)
        threading.Event().wait()  # forever: a lock never released, a socket never answered

    async def ignores_cancel(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        for i in range(steps_of(ctx)):
            record("step", i=i, ms=step_ms, **base)
            try:
                await asyncio.sleep(step_ms / 1000)
            except asyncio.CancelledError:
                record("cancel_ignored", i=i, lost=ctx.lease_lost, **base)
            record("step_end", i=i, **base)
        record("end", outcome="ok", lost=ctx.lease_lost, **base)

    async def blocks_loop(ctx: RunContext) -> None:
        base = _base(ctx)
        record("start", **base)
        try:
            ctx.check_lease()
            record("step", i=0, ms=block_ms, **base)
            time.sleep(block_ms / 1000)  # noqa: ASYNC251 - the fault: a blocking call in async def
            record("step_end", i=0, **base)
            for i in range(1, steps_of(ctx) + 1):
                ctx.check_lease()
                record("step", i=i, ms=step_ms, **base)
                try:
                    await asyncio.sleep(step_ms / 1000)
                finally:
                    record("step_end", i=i, **base)
        except LeaseLost as exc:
            record("lost", how="check_lease", error=str(exc)[:300], **base)
            raise
        except asyncio.CancelledError:
            record("cancelled", lost=ctx.lease_lost, **base)
            raise
        record("end", outcome="ok", lost=ctx.lease_lost, **base)

    handlers: dict[str, Handler] = {
        "normal": normal,
        "sync": plain,
        "exit": exits,
        "hang": hangs,
        "ignore_cancel": ignores_cancel,
        "block_loop": blocks_loop,
    }
    if behaviour not in handlers:
        raise SystemExit(f"unknown behaviour {behaviour!r}; one of {sorted(handlers)}")
    return handlers[behaviour]


def build(spec: dict[str, Any], record: Recorder) -> Scheduler:
    """The scheduler of the spec: only the options the spec names, the rest at their defaults."""
    scheduler = Scheduler(
        backend_from_url(spec["url"]), instance_id=spec["instance"], **spec.get("scheduler", {})
    )
    for job in spec["jobs"]:
        scheduler.add(
            job["name"], job["schedule"], make_handler(job, record), **job.get("options", {})
        )
    return scheduler


def wait_for_spec(go: Path) -> dict[str, Any]:
    while not go.exists():  # the harness renames it into place: complete once it exists
        time.sleep(0.05)
    spec: dict[str, Any] = json.loads(go.read_text())
    return spec


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--name", required=True)
    args = p.parse_args(argv)
    record = Recorder(args.dir / f"{args.name}.jsonl", args.name)
    record("loaded", faked=bool(os.environ.get("FAKETIME_TIMESTAMP_FILE")))
    spec = wait_for_spec(args.dir / f"{args.name}.go")
    console = logging.StreamHandler()
    console.setLevel(spec.get("log_level", "WARNING"))
    console.setFormatter(
        logging.Formatter(f"%(asctime)s {args.name} %(name)s %(levelname)s %(message)s")
    )
    logging.getLogger().addHandler(console)
    anarchon_logger = logging.getLogger("anarchon")
    anarchon_logger.setLevel(logging.INFO)
    anarchon_logger.addHandler(LogRecorder(record))
    scheduler = build(spec, record)
    record("go", jobs=[j["name"] for j in spec["jobs"]])
    try:
        scheduler.run()
    except BaseException as exc:
        record("crash", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    record("exit", metrics=scheduler.metrics().as_dict())


if __name__ == "__main__":
    main()
