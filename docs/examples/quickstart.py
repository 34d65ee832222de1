"""Quick start: two jobs on the embedded SQLite backend, run for a few seconds, then history.

python docs/examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from anarchon import RunContext, Scheduler, SQLiteBackend


async def main() -> None:
    path = os.path.join(tempfile.mkdtemp(), "quickstart.db")
    scheduler = Scheduler(SQLiteBackend(path), instance_id="quickstart")

    @scheduler.job("tick", "* * * * * *", jitter_ms=0)  # every second
    async def tick(ctx: RunContext) -> None:
        print(f"tick for slot {ctx.slot:%H:%M:%S}, fence {ctx.fence}")

    def report(ctx: RunContext) -> None:  # a plain function runs in a worker thread
        print(f"report ({ctx.trigger})")

    scheduler.add("report", "0 6 * * MON-FRI", report, timezone="Europe/Athens")

    async with scheduler:
        await asyncio.sleep(3.2)
        manual = await scheduler.run_now("report")
        runs = await scheduler.history("tick", limit=3)
    print(f"report: {manual.status} as {manual.trigger}")
    print("tick history:", ", ".join(f"{r.slot:%H:%M:%S} {r.status}" for r in runs))


if __name__ == "__main__":
    asyncio.run(main())
