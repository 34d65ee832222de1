"""Fixtures of the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.nats.servers import hold_shared_account, release_shared_account

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


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
