"""One application instance for the dashboard's browser tests: three jobs until SIGTERM.

    python -m tests.web.worker --url URL --instance w0 --ready PATH

``tick`` runs every second (and takes 50 ms), ``flaky`` every 5 s and raises, ``minutely``
every minute. History is the record the tests read; ``--ready`` is created once started.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from anarchon import RunContext, Scheduler, backend_from_url
from tests.conformance.procs import serve_until_signalled

JOBS = {"tick": "* * * * * *", "flaky": "*/5 * * * * *", "minutely": "* * * * *"}


async def main(args: argparse.Namespace) -> None:
    scheduler = Scheduler(backend_from_url(args.url), instance_id=args.instance, heartbeat_ms=500)

    async def tick(ctx: RunContext) -> None:
        await asyncio.sleep(0.05)

    async def flaky(ctx: RunContext) -> None:
        raise RuntimeError(f"flaky failed on purpose at slot {ctx.slot}")

    async def minutely(ctx: RunContext) -> None:
        pass

    handlers = {"tick": tick, "flaky": flaky, "minutely": minutely}
    for name, expression in JOBS.items():
        scheduler.add(name, expression, handlers[name])
    await serve_until_signalled(scheduler, args.ready)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--ready", required=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    asyncio.run(main(parser.parse_args()))
