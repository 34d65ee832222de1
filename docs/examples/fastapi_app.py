"""FastAPI with anarchon: every worker runs the scheduler, and each slot runs on one of them.

    ANARCHON_BACKEND=postgresql://app@db/app uvicorn fastapi_app:app --workers 4
    ANARCHON_BACKEND=postgresql://app@db/app gunicorn fastapi_app:app -c gunicorn.conf.py

The backend comes from ``ANARCHON_BACKEND`` (the URL the ``anarchon`` command reads too), so the
web workers and ``anarchon history`` look at the same store. Without it: a SQLite file beside
this module, one absolute path for every worker whatever folder they start in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from anarchon import RunContext, Scheduler, backend_from_url
from anarchon.integrations.starlette import lifespan

logging.basicConfig(
    level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
)

BACKEND = os.environ.get("ANARCHON_BACKEND", f"sqlite:///{Path(__file__).parent / 'anarchon.db'}")
# One number for both sides of the stop: gunicorn.conf.py reads it too (graceful_timeout).
GRACE_MS = int(os.environ.get("GRACE_MS", "30000"))

scheduler = Scheduler(backend_from_url(BACKEND), grace_ms=GRACE_MS)


@scheduler.job("tick", "* * * * * *")  # every second
async def tick(ctx: RunContext) -> None:
    assert ctx.slot is not None
    ctx.logger.info(
        "tick slot=%s instance=%s fence=%s", ctx.slot.isoformat(), ctx.instance, ctx.fence
    )


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """The application's own lifespan: open pools here; handlers can use them."""
    yield {"started_by": os.getpid()}


app = FastAPI(lifespan=lifespan(scheduler, resources))


@app.get("/runs/{job}")
async def runs(job: str, limit: int = 20) -> list[dict[str, Any]]:
    """The job's newest runs, as every instance recorded them."""
    return [
        {
            "slot": run.slot.isoformat() if run.slot else None,
            "status": run.status.value,
            "instance": run.instance,
            "attempt": run.attempt,
        }
        for run in await scheduler.history(job, limit=limit)
    ]
