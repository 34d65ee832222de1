"""Fixtures of the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.nats.servers import hold_shared_account, release_shared_account, sweep_stale_holds

pytest_plugins = ["tests.hangs"]

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def pytest_sessionstart(session: pytest.Session) -> None:
    """In the run's controller (pytest-xdist's, or the one process without ``-n``), before any
    test process holds its stream: delete the hold streams that processes killed before their
    release left on the shared NATS server (:func:`tests.nats.servers.sweep_stale_holds`)."""
    if not hasattr(session.config, "workerinput"):
        sweep_stale_holds()


@pytest.fixture(scope="session", autouse=True)
def _shared_nats_account_held() -> Iterator[None]:
    """Each test process holds a stream on the shared NATS server while it runs (see
    :func:`tests.nats.servers.hold_shared_account`: a nats-server 2.9 race)."""
    held = hold_shared_account()
    yield
    if held is not None:
        release_shared_account(held)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """anarchon's spans, recorded by the OpenTelemetry SDK's in-memory exporter for the test."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from anarchon import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.configure(provider)
    try:
        yield exporter
    finally:
        otel.configure()
        provider.shutdown()


# How `pytest -n N` (make test: four workers) hands out the tests. pytest-xdist's default, `--dist
# load`, sends each worker long runs of tests in collection order (at first a quarter of its
# share, ~150 tests), so a long test can start near the end and keep the run going while the other
# workers are idle. Here each test is sent alone, in the order below, to the first worker with
# fewer than three waiting; the modules of SHARED_MODULES go whole to one worker.

# The longest tests and shared modules (25 s and more on four workers, `--durations`), longest
# first: they are collected first, so they start at once. A node id prefix matches every
# parameter of a test; a prefix no longer collected is ignored.
LONGEST_FIRST = (
    "tests/package/test_package.py::",  # one worker: 4-6 minutes loaded (wheel, sdist, 3 venvs)
    "tests/docs/test_site.py::",  # one worker: the site's build, 1-2 minutes loaded
    "tests/unit/test_dst_oracle.py::",  # CPU: 1-2 minutes
    "tests/redis/test_outage_takeover.py::",
    "tests/integrations/test_instance_identity.py::",
    "tests/conformance/test_lost_runs.py::",
    "tests/conformance/test_skewed_start.py::",
    "tests/sqlite/test_clock_steps.py::",
    # Shared modules of the last directory: whole, at the end of the order, one of them kept a
    # worker busy for a minute after the others had run out of tests.
    "tests/web/test_browser.py::",
    "tests/web/test_refresh.py::",
)

# Modules whose tests share something costly set up once per worker (a module fixture: a build of
# the site or the package, a private server, a seeded database, Chromium's check) or wait for one
# thing together (the short fault runs): one worker takes each whole, as with `--dist load`.
SHARED_MODULES = frozenset(
    {
        "tests/chaos/test_chaos.py",
        "tests/docs/test_site.py",
        "tests/package/test_package.py",
        "tests/postgres/test_tls.py",
        "tests/unit/test_cli_output.py",
        "tests/web/test_browser.py",
        "tests/web/test_refresh.py",
    }
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests of :data:`LONGEST_FIRST` first, in its order; the rest keep theirs."""

    def rank(item: pytest.Item) -> int:
        return next(
            (n for n, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: within a rank, the collection's order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``-n`` and ``--dist load`` (its default): one test at a time, in collection order,
    but for the modules of :data:`SHARED_MODULES` (see above)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class OneTestAtATime(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_MODULES else nodeid

        def remove_node(self, node: Any) -> str | None:
            # As the base class, but the test a crashed worker was running is reported as
            # crashed and not handed out again (the base class re-queues it, and a test that
            # kills its worker then takes down every replacement until xdist gives up).
            workload = self.assigned_work.pop(node)
            pending = [n for unit in workload.values() for n, done in unit.items() if not done]
            if not pending:
                return None
            crashed: str = pending[0]
            for scope, unit in workload.items():
                if crashed in unit:
                    unit[crashed] = True
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node: Any) -> None:
            # A worker that replaces a crashed one joins before its collection is in: the
            # base class would look that collection up (KeyError, INTERNALERROR: the whole
            # run ends). It gets its work when its collection arrives (schedule() again).
            if node in self.registered_collections:
                super()._reschedule(node)

    # Units in collection order (pytest-xdist 3.8+; before, the shared modules go first).
    config.option.loadscopereorder = False
    return OneTestAtATime(config, log)
