"""The scheduler's reads (history, last_run) check their arguments in the core, so every backend
answers a bad limit or a name no job can have with the same error, naming the value and the
rule, instead of a driver's overflow or a backend's own refusal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from anarchon import InvalidJobName, InvalidOption, RunContext, RunStatus, Scheduler
from tests.harness import Harness

Make = Callable[..., list[Scheduler]]
BAD_LIMITS: list[Any] = [2**63, 2**65, 100_001, -1, 1.5, True, "5", None]
BAD_NAMES = ["no such/job", "", "a.b", "x" * 129, "*"]


async def _quick(ctx: RunContext) -> None:
    pass


async def test_history_and_last_run_refuse_bad_arguments_alike(
    harness: Harness, schedulers: Make
) -> None:
    [scheduler] = schedulers(1)
    scheduler.add("a", "0 0 1 1 *", _quick)
    async with scheduler:
        run = await scheduler.run_now("a")
        assert run.status is RunStatus.SUCCEEDED
        assert [r.run_id for r in await scheduler.history("a")] == [run.run_id]  # the default
        assert [r.run_id for r in await scheduler.history("a", 100_000)] == [run.run_id]
        assert await scheduler.history("a", 0) == []
        last = await scheduler.last_run("a")
        assert last is not None and last.run_id == run.run_id
        for limit in BAD_LIMITS:
            with pytest.raises(InvalidOption) as caught:
                await scheduler.history("a", limit)
            text = str(caught.value)
            assert f"limit={limit!r}" in text and "from 0 to 100000" in text, text
        for name in BAD_NAMES:
            with pytest.raises(InvalidJobName, match="letters, digits") as caught_name:
                await scheduler.history(name)
            assert repr(name) in str(caught_name.value)
            with pytest.raises(InvalidJobName, match="letters, digits"):
                await scheduler.last_run(name)
        # A good name with no records is no error, on every backend.
        assert await scheduler.history("never-ran") == []
        assert await scheduler.last_run("never-ran") is None
