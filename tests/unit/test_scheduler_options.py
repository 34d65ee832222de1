"""Scheduler(...) refuses bad values with errors that name the value and the rule, and makes a
backend from its URL; the default instance id is made when the scheduler starts; run() inside an
event loop says what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anarchon import InvalidOption, RunContext, Scheduler, SchedulerStateError, SQLiteBackend
from anarchon.testing import FakeClock, MemoryBackend


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_workers": 0}, ["max_workers=0", "from 1 to 1024"]),
        ({"max_workers": 10**6}, ["max_workers=1000000", "from 1 to 1024"]),
        ({"max_workers": "8"}, ["max_workers='8'", "integer"]),
        ({"max_workers": True}, ["max_workers=True", "integer"]),
        ({"grace_ms": -1}, ["grace_ms=-1", "from 0 to 86400000"]),
        ({"grace_ms": 10**12}, ["grace_ms=1000000000000", "from 0 to 86400000"]),
        ({"grace_ms": 1.5}, ["grace_ms=1.5", "integer"]),
        ({"clock": object()}, ["clock=<object", "now_ms", "monotonic_ms", "sleep"]),
        ({"instance_id": ""}, ["instance_id=''", "non-empty"]),
        ({"instance_id": "a\nb"}, ["instance_id='a\\nb'", "printable", "newline"]),
        ({"instance_id": "tab\there"}, ["printable"]),
        ({"instance_id": "x" * 300}, ["at most 256"]),
        ({"instance_id": 42}, ["instance_id=42", "string"]),
    ],
)
def test_bad_scheduler_options_are_refused_naming_value_and_rule(
    options: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(InvalidOption) as caught:
        Scheduler(MemoryBackend(), **options)  # type: ignore[arg-type]
    for word in words:
        assert word in str(caught.value), str(caught.value)


def test_a_clock_of_the_old_protocol_is_refused() -> None:
    class WallOnly:
        def now_ms(self) -> int:
            return 0

        async def sleep(self, seconds: float) -> None:
            pass

        async def sleep_until(self, wall_ms: int, precise: bool = False) -> None:
            pass

    with pytest.raises(InvalidOption, match="lacks monotonic_ms"):
        Scheduler(MemoryBackend(), clock=WallOnly())  # type: ignore[arg-type]


def test_good_options_are_kept() -> None:
    clock = FakeClock()
    scheduler = Scheduler(
        MemoryBackend(), instance_id="pod-7 (eu)", grace_ms=0, max_workers=1, clock=clock
    )
    assert scheduler.instance_id == "pod-7 (eu)"
    assert scheduler.grace_ms == 0 and scheduler.max_workers == 1


async def test_a_backend_url_makes_its_backend(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/by-url.db?history_size=7"
    scheduler = Scheduler(url)
    assert isinstance(scheduler.backend, SQLiteBackend)
    assert scheduler.backend.path == tmp_path / "by-url.db"
    assert scheduler.backend.history_size == 7 and scheduler.backend_url == url
    async with scheduler:
        ran_on = await _run_once(scheduler)
    reader = SQLiteBackend(tmp_path / "by-url.db")
    await reader.start_reader()
    try:
        assert [run.instance for run in await reader.history("once")] == [ran_on]
    finally:
        await reader.stop()


@pytest.mark.parametrize(
    ("backend", "words"),
    [
        ("mysql://db/app", ["'mysql://db/app'", "unknown scheme 'mysql'", "sqlite://"]),
        ("sqlite:///x.db?nope=1", ["unknown option 'nope'", "history_size"]),
        (object(), ["backend=<object", "neither an anarchon Backend nor a backend URL"]),
        (MemoryBackend, ["backend=<class", "neither an anarchon Backend"]),
    ],
)
def test_a_backend_that_is_neither_a_backend_nor_a_good_url_is_refused(
    backend: object, words: list[str]
) -> None:
    with pytest.raises(InvalidOption) as caught:
        Scheduler(backend)  # type: ignore[arg-type]
    for word in words:
        assert word in str(caught.value), str(caught.value)


async def test_the_default_instance_id_is_made_at_start_with_the_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler = Scheduler(MemoryBackend())
    made_before_fork = scheduler.instance_id
    assert f"-{os.getpid()}-" in made_before_fork
    # As in a worker forked from a parent that made the scheduler (gunicorn --preload).
    monkeypatch.setattr(os, "getpid", lambda: 424242)
    async with scheduler:
        started_as = scheduler.instance_id
        assert "-424242-" in started_as and started_as != made_before_fork
        run = await _run_once(scheduler)
    assert run == started_as
    assert scheduler.instance_id == started_as, "the id changed after start"


async def test_an_explicit_instance_id_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = Scheduler(MemoryBackend(), instance_id="web-1")
    monkeypatch.setattr(os, "getpid", lambda: 424242)
    async with scheduler:
        assert scheduler.instance_id == "web-1"
        assert await _run_once(scheduler) == "web-1"


async def _run_once(scheduler: Scheduler) -> str:
    async def job(ctx: RunContext) -> None:
        pass

    scheduler.add("once", "@daily", job)
    run = await scheduler.run_now("once")
    return run.instance


async def test_run_inside_an_event_loop_says_to_use_async_with() -> None:
    scheduler = Scheduler(MemoryBackend())
    with pytest.raises(SchedulerStateError) as caught:
        scheduler.run()
    assert "async with scheduler" in str(caught.value)
    assert "await scheduler.serve()" in str(caught.value)
    assert not scheduler.running
