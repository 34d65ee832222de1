"""``pytest -p tests.on_uvloop``: every asyncio test and fixture on a uvloop event loop.

uvicorn (and gunicorn's UvicornWorker) run the application on uvloop whenever it is installed,
as ``uvicorn[standard]`` and ``fastapi[standard]`` install it, so the backends' paths (NATS's on
nats-py's transports among them) must hold there too. ``make uvloop-quick`` (part of
``make test``) and ``make test-uvloop`` load this plugin;
``tests/unit/test_event_loop.py`` checks that it took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio's hook (1.4+): one factory, so test names stay as they are."""
    return {"uvloop": uvloop.new_event_loop}
