"""A client whose server is paused with its socket's buffer full reconnects to another server.

nats-py's reconnect waits, unbounded, for the lost connection to send what it holds before it
tries another server: a paused server (SIGSTOP) whose kernel still acknowledges keeps that wait
for as long as it stays paused, and the instance runs nothing. The guard drops that connection
after ``CLOSE_WAIT_S`` (``ReconnectWatch``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats import _timings as timings
from tests.nats.servers import NatsServer
from tests.nats.test_stop import _pause, _write_buffer

#: Stale after 2 unanswered pings 1 s apart (a few s), the old connection dropped 5 s into the
#: reconnect, the other server answering within a second: 30 s is generous.
RECONNECT_WITHIN_S = 30.0


# nats-py leaves the socket of a failed reconnect attempt unclosed (one to the paused server:
# its kernel accepts, nothing answers INFO): garbage-collected later, with a ResourceWarning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_reconnect_stuck_closing_a_paused_server_moves_to_the_other_server(
    private_server: Callable[..., NatsServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = private_server(), private_server()
    # Only the pings are quicker (the default notices a dead connection in about 30 s).
    monkeypatch.setattr(timings, "PING_INTERVAL_S", 1)
    monkeypatch.setattr(timings, "MAX_OUTSTANDING_PINGS", 2)
    backend = NatsBackend([first.url, second.url])  # every other option at its default
    paused: list[int] = []
    try:
        await backend.start()
        nc: Any = backend._conn.nc
        assert nc.connected_url.port in (first.port, second.port)
        stuck = first if nc.connected_url.port == first.port else second
        other = second if stuck is first else first
        assert stuck.pid is not None
        _pause(stuck.pid)
        paused.append(stuck.pid)
        # Core messages the paused server never reads: the kernel's buffers fill, then asyncio's.
        payload = b"x" * 512 * 1024
        for _ in range(400):
            await backend._conn.send("watch.test.filler", payload)
            await asyncio.sleep(0)
            if _write_buffer(backend) > 4 * len(payload):
                break
        assert _write_buffer(backend) > 0, "the socket took everything: nothing left to wait for"
        async with asyncio.timeout(RECONNECT_WITHIN_S):
            while True:
                if nc.is_connected and nc.connected_url.port == other.port:
                    break
                await asyncio.sleep(0.2)
            # A call answered through the other server.
            info = await backend._conn.api("$JS.API.INFO", {})
        assert "error" not in info
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        await backend.stop()
        # That socket is collected here, under this test's filter, rather than in whichever
        # later test the collector would next run in (where `filterwarnings = error` fails it).
        gc.collect()
