"""Fixtures of the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nats.servers import hold_shared_account, release_shared_account


@pytest.fixture(scope="session", autouse=True)
def _shared_nats_account_held() -> Iterator[None]:
    """Each test process holds a stream on the shared NATS server while it runs (see
    :func:`tests.nats.servers.hold_shared_account`: a nats-server 2.9 race)."""
    held = hold_shared_account()
    yield
    if held is not None:
        release_shared_account(held)
