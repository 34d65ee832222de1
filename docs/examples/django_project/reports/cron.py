"""The app's jobs: ``manage.py anarchon run`` finds this module in every installed app."""

from __future__ import annotations

from anarchon import RunContext
from anarchon.integrations.django import job

from .models import Tick


@job("tick", "* * * * * *")  # every second
def tick(ctx: RunContext) -> None:
    """A plain function: runs in a worker thread and uses the ORM as a view does."""
    Tick.objects.create(job=ctx.job, slot=ctx.slot, instance=ctx.instance, fence=ctx.fence or 0)


@job("atick", "* * * * * *")
async def atick(ctx: RunContext) -> None:
    """An async function: Django's async ORM."""
    await Tick.objects.acreate(
        job=ctx.job, slot=ctx.slot, instance=ctx.instance, fence=ctx.fence or 0
    )
