"""anarchon.logs.JsonFormatter: one JSON object a line with the logging contract's fields, from
``anarchon run --log-format json`` or a ``dictConfig``; a failed run once, at ERROR, with its
traceback."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from anarchon import RunContext, RunStatus, Scheduler, Trigger
from anarchon.backend import Ticket
from anarchon.cli import _parser
from anarchon.logs import JSON_FIELDS, Action, JsonFormatter, log_fields
from anarchon.testing import FakeClock, MemoryBackend
from tests.docs.blocks import block
from tests.unit.core_helpers import START

TICKET = Ticket(
    job="report",
    slot=START,
    slot_key=str(START),
    run_id="r1",
    token="t",
    instance="host-1",
    trigger=Trigger.SCHEDULE,
    attempt=2,
    fence=7,
    started_at_ms=START + 1,
)


def record(msg: str, *args: Any, level: int = logging.INFO, **extra: Any) -> logging.LogRecord:
    made = logging.getLogger("anarchon.scheduler").makeRecord(
        "anarchon.scheduler", level, __file__, 1, msg, args, None, extra=extra
    )
    return made


def test_a_run_record_gives_the_contract_fields_first() -> None:
    line = JsonFormatter(instance="host-1").format(
        record("job %s ran", "report", **log_fields(Action.RUN_SUCCEEDED, ticket=TICKET))
    )
    assert "\n" not in line
    out = json.loads(line)
    assert list(out)[:4] == ["time", "level", "logger", "message"]
    assert [k for k in out if k in JSON_FIELDS] == list(JSON_FIELDS)
    assert out["time"].endswith("+00:00") and len(out["time"].split(".")[1]) == 9  # ms + zone
    assert out["message"] == "job report ran"
    assert out["action"] == "run_succeeded" and out["job"] == "report"
    assert out["slot"] == START and out["slot_iso"] == "2026-01-01T00:00:00.000+00:00"
    assert (out["run_id"], out["attempt"], out["fence"]) == ("r1", 2, 7)
    assert out["instance"] == "host-1"


def test_extra_fields_follow_and_secrets_are_masked() -> None:
    secret = "postgresql://app:s3cret@db/x"
    out = json.loads(
        JsonFormatter().format(
            record(
                "cannot reach %s", secret, **log_fields(Action.CLAIM_SKIPPED, "r", 5, reason=secret)
            )
        )
    )
    assert out["message"] == "cannot reach postgresql://app:***@db/x"
    assert out["reason"] == "postgresql://app:***@db/x"
    assert list(out)[-1] == "reason"


def test_an_exception_is_one_traceback_field() -> None:
    try:
        raise ConnectionError("to redis://:hunter2@cache:6379/0")
    except ConnectionError:
        made = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    out = json.loads(JsonFormatter().format(made))
    assert out["traceback"].startswith("Traceback (most recent call last):")
    assert "ConnectionError: to redis://:***@cache:6379/0" in out["traceback"]
    assert "hunter2" not in out["traceback"]


def test_instance_must_be_a_string() -> None:
    with pytest.raises(TypeError, match=r"instance=3 must be a string or None"):
        JsonFormatter(instance=3)  # type: ignore[arg-type]


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """``dictConfig`` with the formatter named by its class path, as the docs show."""
    stream = io.StringIO()
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"json": {"()": "anarchon.logs.JsonFormatter"}},
            "handlers": {
                "lines": {"class": "logging.StreamHandler", "formatter": "json", "stream": stream}
            },
            "loggers": {"anarchon": {"level": "INFO", "handlers": ["lines"]}},
        }
    )
    logger = logging.getLogger("anarchon")
    try:
        yield stream
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_through_dictconfig_each_scheduler_names_its_instance_and_a_failure_is_logged_once(
    json_lines: io.StringIO,
) -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    first = Scheduler(backend, clock=clock, instance_id="first")
    second = Scheduler(backend, clock=clock, instance_id="second")

    async def report(ctx: RunContext) -> None:
        ctx.logger.info("report written", extra={"rows": 42})

    async def broken(ctx: RunContext) -> None:
        raise ValueError("async handler failed")

    def plain_broken(ctx: RunContext) -> None:
        raise KeyError("plain handler failed")

    for scheduler in (first, second):
        scheduler.add("report", "0 0 1 1 *", report)
        scheduler.add("broken", "0 0 1 1 *", broken)
        scheduler.add("plain", "0 0 1 1 *", plain_broken)
    async with first, second:
        assert (await first.run_now("report")).status is RunStatus.SUCCEEDED
        assert (await second.run_now("report")).status is RunStatus.SUCCEEDED
        assert (await first.run_now("broken")).status is RunStatus.FAILED
        assert (await second.run_now("plain")).status is RunStatus.FAILED
    records = lines_of(json_lines)
    written = [r for r in records if r["logger"] == "anarchon.job.report"]
    assert sorted(r["instance"] for r in written) == ["first", "second"]
    for line in written:
        assert line["rows"] == 42 and line["slot"] is None and line["attempt"] == 1
    runs = [r for r in records if r.get("action") == "run_started"]
    assert {(r["job"], r["instance"]) for r in runs} >= {("report", "first"), ("plain", "second")}
    # Each failure: one ERROR line with the traceback; no other line carries a traceback.
    errors = [r for r in records if r["level"] == "ERROR"]
    assert [(r["job"], r["instance"], r["action"]) for r in errors] == [
        ("broken", "first", "run_failed"),
        ("plain", "second", "run_failed"),
    ]
    assert "ValueError: async handler failed" in errors[0]["traceback"]
    assert "KeyError: 'plain handler failed'" in errors[1]["traceback"]
    assert [r for r in records if "traceback" in r] == errors


def test_the_ctx_logger_slot_is_given_in_ms_and_iso_too() -> None:
    made = record("x", job="report", slot="2026-01-01T00:00:00+00:00", run_id="r", attempt=1)
    out = json.loads(JsonFormatter().format(made))
    assert out["slot"] == START and out["slot_iso"] == "2026-01-01T00:00:00.000+00:00"


def test_run_takes_a_log_format() -> None:
    assert _parser().parse_args(["run", "--log-format", "json", "app:s"]).log_format == "json"
    assert _parser().parse_args(["run", "app:s"]).log_format == "text"
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["run", "--log-format", "xml", "app:s"])
    assert exited.value.code == 2


PAGE_RUN = """
import asyncio
from anarchon import Scheduler
from anarchon.testing import MemoryBackend

async def main():
    scheduler = Scheduler(MemoryBackend(), instance_id="docs")

    async def broken(ctx):
        raise ValueError("no")

    scheduler.add("broken", "0 0 1 1 *", broken)
    async with scheduler:
        await scheduler.run_now("broken")

asyncio.run(main())
"""


def test_the_observability_page_config_writes_json_lines() -> None:
    """The block of docs/observability.md marked observability-json-config, then a run."""
    config = block("docs/observability.md", "observability-json-config")
    out = subprocess.run(
        [sys.executable, "-c", config + PAGE_RUN], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    [failed] = [r for r in records if r["level"] == "ERROR"]
    assert failed["action"] == "run_failed" and failed["instance"] == "docs"
    assert "ValueError: no" in failed["traceback"]
