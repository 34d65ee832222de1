"""Handlers whose body would never run: generator functions are refused when the job is added,
and a plain handler that returns a coroutine (or generator) fails its run, saying why, with no
"never awaited" warning, instead of being recorded ``succeeded``."""

from __future__ import annotations

import asyncio
import functools
import gc
import time
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest

from anarchon import ConfigurationError, InvalidOption, RunContext, RunStatus, Scheduler
from anarchon.testing import MemoryBackend

DAILY = "0 0 * * *"


def _gen(ctx: RunContext) -> Iterator[int]:
    yield 1


async def _agen(ctx: RunContext) -> AsyncIterator[int]:
    yield 1


async def _gen_with_extra(ctx: RunContext, extra: int) -> AsyncIterator[int]:
    yield extra


class _Steps:
    def __call__(self, ctx: RunContext) -> Iterator[int]:
        yield 1

    def step(self, ctx: RunContext) -> Iterator[int]:
        yield 1


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (_gen, "is a generator function"),
        (_agen, "is an async generator function"),
        (functools.partial(_gen_with_extra, extra=1), "is an async generator function"),
        (_Steps(), "is a generator function"),
        (_Steps().step, "is a generator function"),
    ],
    ids=["generator", "async-generator", "partial", "__call__", "bound-method"],
)
def test_a_generator_handler_is_refused_when_the_job_is_added(
    handler: Callable[[RunContext], Any], kind: str
) -> None:
    scheduler = Scheduler(MemoryBackend())
    with pytest.raises(InvalidOption) as added:
        scheduler.add("steps", DAILY, handler)
    with pytest.raises(InvalidOption) as decorated:
        scheduler.job("steps", DAILY)(handler)
    for caught in (added, decorated):
        text = str(caught.value)
        assert "job 'steps'" in text and kind in text, text
        assert "body would never run" in text and "without 'yield'" in text, text
        assert isinstance(caught.value, ConfigurationError)
    assert scheduler.jobs == {}


async def _work(done: list[str]) -> None:
    done.append("ran")


def _plain_decorator(
    func: Callable[[RunContext], Coroutine[Any, Any, None]],
) -> Callable[[RunContext], Any]:
    """A decorator written for plain functions, put on an async one: it returns the coroutine."""

    @functools.wraps(func)
    def wrapper(ctx: RunContext) -> Any:
        return func(ctx)

    return wrapper


def _returners(done: list[str]) -> dict[str, tuple[Callable[[RunContext], Any], str]]:
    @_plain_decorator
    async def decorated(ctx: RunContext) -> None:
        done.append("ran")

    def gen() -> Iterator[None]:
        done.append("ran")
        yield

    async def agen() -> AsyncIterator[None]:
        done.append("ran")
        yield

    return {
        "decorated": (decorated, "a coroutine "),
        "lambda": (lambda ctx: _work(done), "a coroutine '_work'"),
        "generator": (lambda ctx: gen(), "a generator "),
        "async-generator": (lambda ctx: agen(), "an async generator "),
    }


@pytest.mark.parametrize("case", ["decorated", "lambda", "generator", "async-generator"])
async def test_a_plain_handler_that_returns_a_coroutine_fails_its_run(case: str) -> None:
    done: list[str] = []
    handler, returned = _returners(done)[case]
    scheduler = Scheduler(MemoryBackend())  # every option at its default
    scheduler.add("returns", DAILY, handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with scheduler:
            run = await scheduler.run_now("returns")
            history = await scheduler.history("returns")
        gc.collect()
    assert run.status is RunStatus.FAILED, run
    assert run.error is not None and run.error.startswith("TypeError: the plain handler returned")
    assert returned in run.error and "make the handler 'async def'" in run.error.lower()
    assert [r.status for r in history] == [RunStatus.FAILED]
    assert done == [], "the returned work ran after all"
    assert not [w for w in caught if "never awaited" in str(w.message)], [
        str(w.message) for w in caught
    ]


async def test_a_coroutine_returned_past_the_timeout_is_closed_too() -> None:
    def late(ctx: RunContext) -> Any:
        time.sleep(0.5)
        return _work([])

    scheduler = Scheduler(MemoryBackend())
    scheduler.add("late", DAILY, late, timeout_ms=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with scheduler:
            run = await scheduler.run_now("late")
        gc.collect()
    assert run.status is RunStatus.FAILED and run.error == "timed out after timeout_ms=100"
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_plain_handlers_that_return_values_or_run_their_coroutine_succeed() -> None:
    done: list[str] = []

    def runs_it(ctx: RunContext) -> None:
        asyncio.run(_work(done))  # a plain handler may run async code on its own thread

    scheduler = Scheduler(MemoryBackend())
    scheduler.add("value", DAILY, lambda ctx: 42)
    scheduler.add("runs_it", DAILY, runs_it)
    scheduler.add("items", DAILY, lambda ctx: [1, 2])
    async with scheduler:
        runs = [await scheduler.run_now(name) for name in ("value", "runs_it", "items")]
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 3, [r.error for r in runs]
    assert done == ["ran"]
