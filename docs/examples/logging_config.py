"""Logging configuration for anarchon with the standard library: ``dictConfig``, one JSON object
per line on stdout, with the fields anarchon puts on its records (``job``, ``slot``, ``action``
...). ``python logging_config.py`` runs one job that succeeds and one that fails."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
from typing import Any

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's extra fields and,
    for a failure, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in STANDARD})
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonFormatter}},
    "handlers": {
        "stdout": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {
        # The scheduler's decisions (claims, runs, hand-overs) at INFO; DEBUG adds lost claims.
        "anarchon": {"level": "INFO"},
        # Your handlers' ctx.logger ("anarchon.job.<job>") is below "anarchon": same settings.
    },
    "root": {"handlers": ["stdout"], "level": "WARNING"},
}


async def main() -> None:
    from anarchon import RunContext, Scheduler
    from anarchon.testing import MemoryBackend

    scheduler = Scheduler(MemoryBackend(), instance_id="example")

    @scheduler.job("report", "0 6 * * *")
    async def report(ctx: RunContext) -> None:
        ctx.logger.info("report written", extra={"rows": 42})

    @scheduler.job("export", "0 7 * * *")
    async def export(ctx: RunContext) -> None:
        raise ConnectionError("the export server closed the connection")

    async with scheduler:
        await scheduler.run_now("report")
        await scheduler.run_now("export")


if __name__ == "__main__":
    logging.config.dictConfig(LOGGING)
    asyncio.run(main())
