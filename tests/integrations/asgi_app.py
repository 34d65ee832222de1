"""The FastAPI guide's application (docs/examples/fastapi_app.py) plus a job whose run lasts
``SLOW_S`` seconds, for the tests of a stop during a run, and an endpoint that answers after
``seconds``, for a stop during a request. ``anarchon run asgi_app:scheduler``
runs the same jobs outside the web server (a backup instance)."""

from __future__ import annotations

import asyncio
import os

from fastapi_app import app, scheduler  # docs/examples is on PYTHONPATH

from anarchon import RunContext

SLOW_S = float(os.environ.get("SLOW_S", "3"))


@scheduler.job("slow", "*/2 * * * * *")
async def slow(ctx: RunContext) -> None:
    assert ctx.slot is not None
    where = f"slot={ctx.slot.isoformat()} instance={ctx.instance} attempt={ctx.attempt}"
    ctx.logger.info("slow began %s", where)
    await asyncio.sleep(SLOW_S)
    ctx.logger.info("slow ended %s", where)


@app.get("/slow-request")
async def slow_request(seconds: float = 6) -> dict[str, float]:
    """Answers after ``seconds``."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


__all__ = ["app", "scheduler"]
