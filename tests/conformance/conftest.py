"""The conformance suite's fixtures: every test runs once per backend, on the real service.

A backend joins by adding ``tests/backends/<name>.py`` with a ``HARNESS`` and its name below.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon import Backend, Scheduler
from tests.conformance.procs import Fleet
from tests.harness import Harness, Namespace

BACKENDS = ["memory", "sqlite", "redis", "postgres", "nats", "nats_current"]


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
    async with harness.namespace(tmp_path) as namespace:
        yield namespace


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
        await instance.stop()


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
            await scheduler.stop()
