"""One scheduler process for test_clock_steps: job ``tick`` every 3 s with every option at its
default, on the SQLite file ``argv[1]``, as instance ``argv[2]``; writes one JSON line per
handler start and per log record of level WARNING or above to ``argv[3]``."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from anarchon import RunContext, Scheduler

path, instance, out_path = sys.argv[1:4]
out = open(out_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
lock = threading.Lock()


def record(kind: str, **fields: object) -> None:
    fields.update(kind=kind, inst=instance, wall=time.time(), mono=time.monotonic())
    with lock:
        out.write(json.dumps(fields, default=str) + "\n")


class Recorder(logging.Handler):
    """Keeps the warnings and errors, and the scheduler's "started"."""

    def emit(self, r: logging.LogRecord) -> None:
        action = getattr(r, "action", None)
        if r.levelno >= logging.WARNING or action == "started":
            step = getattr(r, "step_ms", None)
            record("log", level=r.levelname, action=action, step_ms=step, msg=r.getMessage())


logging.basicConfig(level=logging.INFO, handlers=[Recorder()])
scheduler = Scheduler(f"sqlite:///{path}", instance_id=instance)


async def tick(ctx: RunContext) -> None:
    record("start", slot=ctx.slot.timestamp() if ctx.slot else None, attempt=ctx.attempt)


scheduler.add("tick", "*/3 * * * * *", tick)
print("pid", os.getpid(), flush=True)
scheduler.run()
