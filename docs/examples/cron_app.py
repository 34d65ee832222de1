"""A scheduler in a process of its own: ``anarchon run cron_app:scheduler``.

The systemd and Kubernetes guides run it. The backend URL comes from ``ANARCHON_BACKEND`` (which
the ``anarchon`` command reads too) and the grace from ``GRACE_MS`` (a variable of this example,
which the unit file and the Deployment set beside their own stop timeouts).
"""

from __future__ import annotations

import os

from anarchon import RunContext, Scheduler, backend_from_url

scheduler = Scheduler(
    backend_from_url(os.environ["ANARCHON_BACKEND"]),
    grace_ms=int(os.environ.get("GRACE_MS", "30000")),
)


@scheduler.job("sync", "* * * * * *")  # every second
async def sync(ctx: RunContext) -> None:
    assert ctx.slot is not None
    ctx.logger.info(
        "tick slot=%s instance=%s fence=%s", ctx.slot.isoformat(), ctx.instance, ctx.fence
    )
