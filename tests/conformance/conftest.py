"""The conformance suite's fixtures: every test runs once per backend, on the real service.

A backend joins by adding ``tests/backends/<name>.py`` with a ``HARNESS`` and its name below.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon import Backend, Scheduler
from tests.conformance.cli import Shell, populate
from tests.conformance.procs import Fleet
from tests.harness import Harness, Namespace

BACKENDS = ["memory", "sqlite", "redis", "postgres", "nats", "nats_current"]

#: The bounds of the fixtures' teardown steps: a step past its bound fails the test, naming the
#: step, long before pytest-timeout's bound (300 s) would end the worker with no word of where.
STOP_BOUND_S = 60.0
CLEAN_UP_BOUND_S = 150.0


async def bounded_step(step: Awaitable[object], bound_s: float, what: str) -> None:
    """Await a teardown step for at most ``bound_s``; past it fail with "``what`` did not return
    within N s". The step runs in a task of its own, so one that swallows its cancellation
    cannot hold the teardown (it is cancelled and left behind)."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=bound_s)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        pytest.fail(f"{what} did not return within {bound_s:.0f} s", pytrace=False)
    task.result()


def _load(name: str) -> Harness:
    try:
        module = importlib.import_module(f"tests.backends.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"tests.backends.{name}":
            pytest.skip(f"the {name} backend has no harness yet")
        raise
    harness: Harness = module.HARNESS
    return harness


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest) -> Harness:
    return _load(request.param)


@pytest.fixture
def lease_harness(harness: Harness) -> Harness:
    """The harness, for tests of lease features; brokers skip them by design."""
    if not harness.lease:
        pytest.skip(f"{harness.name} is a broker: no leases, backups, overlap, catch-up, hand-over")
    return harness


@pytest.fixture
async def ns(harness: Harness, tmp_path: Path) -> AsyncIterator[Namespace]:
    manager = harness.namespace(tmp_path)
    namespace = await manager.__aenter__()
    try:
        yield namespace
    finally:
        await bounded_step(
            manager.__aexit__(None, None, None),
            CLEAN_UP_BOUND_S,
            f"the {harness.name} namespace's clean-up (deleting what the test stored)",
        )


@pytest.fixture
def fleet(harness: Harness, ns: Namespace, tmp_path: Path) -> Iterator[Fleet]:
    """Worker processes on the test's namespace; stopped (SIGTERM, then SIGKILL) afterwards."""
    if not harness.multiprocess or ns.url is None:
        pytest.skip(f"{harness.name} serves one process only")
    fleet = Fleet(ns.url, tmp_path)
    try:
        yield fleet
    finally:
        fleet.stop_all()


@pytest.fixture
async def backend(ns: Namespace) -> AsyncIterator[Backend]:
    """One started backend on the test's namespace, for contract-level tests."""
    instance = ns.make()
    await instance.start()
    try:
        yield instance
    finally:
        await bounded_step(instance.stop(), STOP_BOUND_S, f"{instance!r}.stop()")


@pytest.fixture
async def shell(ns: Namespace, backend: Backend) -> Shell:
    """For tests of the ``anarchon`` commands: the namespace's URL and its started backend,
    holding an instance record that carries the job ``sync`` and the records of three of its
    slots (:func:`tests.conformance.cli.populate`)."""
    assert ns.url is not None
    return Shell(ns.url, backend, await populate(backend))


@pytest.fixture
async def schedulers(ns: Namespace) -> AsyncIterator[Callable[..., list[Scheduler]]]:
    """Make n schedulers ("instances" in one event loop) on the namespace; all stopped after."""
    made: list[Scheduler] = []

    def make(count: int, **options: Any) -> list[Scheduler]:
        fresh = [
            Scheduler(ns.make(), instance_id=f"i{len(made) + n}", **options) for n in range(count)
        ]
        made.extend(fresh)
        return fresh

    try:
        yield make
    finally:
        for scheduler in made:
            # Its running handlers may take grace_ms, then its backend stops.
            await bounded_step(
                scheduler.stop(),
                scheduler.grace_ms / 1000 + STOP_BOUND_S,
                f"the scheduler {scheduler.instance_id}'s stop()",
            )
