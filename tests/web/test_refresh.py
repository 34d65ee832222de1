"""The page's refresh in a real browser (Debian's chromium): a refresh that fails says so above the
figures it could not renew, and what the reader opened (a traceback) stays open across one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn

from anarchon import MemoryBackend, RunContext, Scheduler
from anarchon.web import dashboard
from anarchon.web._app import PARTIAL_HEADER
from tests.ports import any_free
from tests.web import browser as chromium

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
REFRESH_MS = 400
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@pytest.fixture(scope="module")
def installed() -> None:
    problem = chromium.ensure_installed()
    if problem is not None:
        pytest.skip(problem)


class Outage:
    """The dashboard's ASGI application, answering its refreshes 503 while ``down`` is set, as
    it does while the backend does not answer (``BackendUnavailable``: 503 with its message)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.down = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        if self.down and scope["type"] == "http" and headers.get(PARTIAL_HEADER.encode()):
            body = b'<p class="banner error">BackendUnavailable: no answer within 5 s</p>'
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


@asynccontextmanager
async def _served() -> AsyncIterator[tuple[str, Outage]]:
    scheduler = Scheduler(MemoryBackend(), instance_id="w0", heartbeat_ms=200)

    async def broken(ctx: RunContext) -> None:
        raise RuntimeError("broken on purpose\nsecond line of the error")

    scheduler.add("broken", "* * * * * *", broken)
    outage = Outage(dashboard(scheduler, refresh_ms=REFRESH_MS))
    port = any_free()
    server = uvicorn.Server(uvicorn.Config(outage, host="127.0.0.1", port=port, log_level="error"))
    async with scheduler:
        task = asyncio.create_task(server.serve())
        for _ in range(200):
            if server.started and await scheduler.history("broken", 1):
                break
            await asyncio.sleep(0.05)
        assert server.started
        try:
            yield f"http://127.0.0.1:{port}", outage
        finally:
            server.should_exit = True
            await task


def _until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.1)
    return found


def _banner(driver: Any) -> str | None:
    found: str | None = driver.execute_script(
        "var b = document.querySelector('[data-stale]'); return b ? b.textContent : null;"
    )
    return found


def _open(driver: Any) -> bool:
    return bool(driver.execute_script("return !!document.querySelector('details[open]');"))


async def test_a_traceback_opened_stays_open_across_refreshes(installed: None) -> None:
    def look(base: str) -> None:
        with chromium.browser() as driver:
            driver.get(base + "/jobs/broken")
            # An error opened to read its traceback: each refresh closed it (every 5 s).
            driver.execute_script("document.querySelector('table.history details').open = true")
            time.sleep(6 * REFRESH_MS / 1000)
            assert _open(driver), "a refresh closed the traceback the reader opened"
            assert _banner(driver) is None

    async with _served() as (base, _):
        await asyncio.to_thread(look, base)


async def test_a_failed_refresh_says_the_page_is_stale(installed: None) -> None:
    def look(base: str, outage: Outage) -> None:
        with chromium.browser() as driver:
            driver.get(base + "/")
            time.sleep(3 * REFRESH_MS / 1000)
            assert _banner(driver) is None
            # The backend stops answering: the figures stayed as they were, silently.
            outage.down = True
            text = _until(lambda: _banner(driver), "the stale banner")
            assert "Not refreshed since" in text and "503" in text, text
            assert "BackendUnavailable: no answer within 5 s" in text, text
            assert driver.find_elements("css selector", "tr.job[data-job=broken]")
            # It answers again: the banner goes at the next refresh.
            outage.down = False
            _until(lambda: _banner(driver) is None, "the stale banner to go")

    async with _served() as (base, outage):
        await asyncio.to_thread(look, base, outage)
