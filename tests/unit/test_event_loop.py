"""Which event loop the async tests run on: asyncio's own, or uvloop under ``tests.on_uvloop``."""

from __future__ import annotations

import asyncio

import pytest
import uvloop


async def test_the_tests_run_on_uvloop_when_the_plugin_is_loaded(
    request: pytest.FixtureRequest,
) -> None:
    loop = asyncio.get_running_loop()
    if request.config.pluginmanager.has_plugin("tests.on_uvloop"):
        assert isinstance(loop, uvloop.Loop), type(loop)
    else:
        assert not isinstance(loop, uvloop.Loop), type(loop)
