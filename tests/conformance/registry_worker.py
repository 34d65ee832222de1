"""One application instance for the registry's process tests: one job, no work, until SIGTERM.

    python -m tests.conformance.registry_worker --url sqlite:////tmp/x.db --instance w0 \
        --schedule "0 0 1 1 *" [--heartbeat-ms 300]

Logs go to stderr (the test reads them for the drift warning); ``--ready`` is created once the
scheduler has started.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from anarchon import RunContext, Scheduler, backend_from_url
from tests.conformance.procs import serve_until_signalled


async def main(args: argparse.Namespace) -> None:
    options: dict[str, Any] = {}
    if args.heartbeat_ms is not None:
        options["heartbeat_ms"] = args.heartbeat_ms  # else the default
    scheduler = Scheduler(backend_from_url(args.url), instance_id=args.instance, **options)

    async def handler(ctx: RunContext) -> None:
        pass

    scheduler.add("sync", args.schedule, handler)
    await serve_until_signalled(scheduler, args.ready)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--heartbeat-ms", type=int)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    asyncio.run(main(parser.parse_args()))
