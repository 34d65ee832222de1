"""A secret in a URL of a handler's error is masked wherever the error goes (history, the run
returned, the run span, the log lines and their tracebacks), whichever way the handler failed:
an exception, a BaseException of its own, its own CancelledError, SystemExit, a timeout, from
an async handler or a plain one. The masking is done where an outcome becomes a result
(``anarchon._results``), not at each way of failing."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anarchon import RunContext, RunStatus, Scheduler
from tests.conformance.conftest import _load
from tests.harness import Harness, Namespace

NEVER = "0 0 1 1 *"  # slots nobody waits for: the runs below are manual
SECRET = "Hunter2pw"
URL = f"postgresql://app:{SECRET}@db.internal/x"
SHOWN = "postgresql://app:***@db.internal/x"


@pytest.fixture(params=["sqlite", "redis"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """SQLite and Redis: a file and a server backend (the masking is the core's)."""
    return _load(request.param)


class Boom(BaseException):
    """A BaseException of the handler's own."""


async def _exception(ctx: RunContext) -> None:
    raise RuntimeError(f"cannot reach {URL}")


def _plain_exception(ctx: RunContext) -> None:
    raise RuntimeError(f"cannot reach {URL}")


async def _cause(ctx: RunContext) -> None:
    try:
        raise ConnectionError(f"cannot reach {URL}")
    except ConnectionError as exc:
        raise RuntimeError("the sync failed") from exc  # the secret only in the traceback


async def _base(ctx: RunContext) -> None:
    raise Boom(f"cannot reach {URL}")


def _plain_base(ctx: RunContext) -> None:
    raise Boom(f"cannot reach {URL}")


async def _own_cancelled(ctx: RunContext) -> None:
    raise asyncio.CancelledError(f"gave up on {URL}")  # its own, not the scheduler's


async def _exit(ctx: RunContext) -> None:
    sys.exit(f"cannot reach {URL}")


def _plain_exit(ctx: RunContext) -> None:
    sys.exit(f"cannot reach {URL}")


async def _timeout_then_raise(ctx: RunContext) -> None:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:  # timed out; its clean-up fails, naming the URL
        raise RuntimeError(f"clean-up could not reach {URL}") from None


async def _own_timeout(ctx: RunContext) -> None:
    raise TimeoutError(f"{URL} did not answer")  # its own, within its timeout_ms


def _plain_timeout(ctx: RunContext) -> None:
    time.sleep(1.0)  # past timeout_ms; what it raises then is not its result
    raise RuntimeError(f"late: cannot reach {URL}")


# name: (handler, job options, what the recorded error contains)
CASES: dict[str, tuple[Callable[[RunContext], Any], dict[str, Any], str]] = {
    "exception": (_exception, {}, f"RuntimeError: cannot reach {SHOWN}"),
    "plain-exception": (_plain_exception, {}, f"RuntimeError: cannot reach {SHOWN}"),
    "cause": (_cause, {}, "RuntimeError: the sync failed"),
    "base": (_base, {}, f"Boom: cannot reach {SHOWN}"),
    "plain-base": (_plain_base, {}, f"Boom: cannot reach {SHOWN}"),
    "own-cancelled": (_own_cancelled, {}, f"CancelledError: gave up on {SHOWN}"),
    "exit": (_exit, {}, f"SystemExit('cannot reach {SHOWN}')"),
    "plain-exit": (_plain_exit, {}, f"SystemExit('cannot reach {SHOWN}')"),
    "timeout": (_timeout_then_raise, {"timeout_ms": 200}, f"clean-up could not reach {SHOWN}"),
    "own-timeout": (_own_timeout, {"timeout_ms": 30_000}, f"TimeoutError: {SHOWN} did not"),
    "plain-timeout": (_plain_timeout, {"timeout_ms": 200}, "timed out after timeout_ms=200"),
}


def _span_texts(spans: InMemorySpanExporter, job: str) -> list[str]:
    """Every text the run span of ``job`` exports: attributes, status, events' attributes."""
    [span] = [s for s in spans.get_finished_spans() if s.name == f"run {job}"]
    texts = [str(v) for v in (span.attributes or {}).values()]
    texts.append(str(span.status.description))
    for event in span.events:
        texts += [event.name, *(str(v) for v in (event.attributes or {}).values())]
    return texts


async def test_a_secret_in_a_handlers_error_is_masked_whichever_way_it_failed(
    harness: Harness,
    ns: Namespace,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "anarchon")
    async with Scheduler(ns.make(), instance_id="leaky") as scheduler:
        for name, (handler, options, _) in CASES.items():
            scheduler.add(name, NEVER, handler, **options)
        runs = {name: await scheduler.run_now(name) for name in CASES}
        stored = {name: (await scheduler.history(name))[0] for name in CASES}
    plain = logging.Formatter("%(levelname)s %(name)s %(message)s")
    logged = "\n".join(plain.format(record) for record in caplog.records) + caplog.text
    failures = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "run_failed"]

    leaks: dict[str, list[str]] = {}
    for name, (_, _, shown) in CASES.items():
        run = runs[name]
        assert run.status is RunStatus.FAILED, (name, run)
        assert run.error == stored[name].error, (name, run.error, stored[name].error)
        assert shown in (run.error or ""), (name, run.error)
        assert any(f"job {name} failed" in message for message in failures), (name, failures)
        places = {"history": run.error or "", "span": "\n".join(_span_texts(spans, name))}
        leaks[name] = [place for place, text in places.items() if SECRET in text]
    if SECRET in logged:
        leaks["logs"] = [line for line in logged.splitlines() if SECRET in line]
    assert not any(leaks.values()), leaks
    assert SHOWN in logged  # the tracebacks are there, masked
