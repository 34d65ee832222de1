"""``NatsBackend.stop()`` ends within seconds, whatever the server and nats-py do: an
application's shutdown must never hang on it.

Two ways it hung: the cancellation of its guard (or upkeep) loop swallowed (nats-py's request
waits in ``asyncio.wait_for``, which on Python 3.11 returns an answer read in the event-loop
turn the cancellation came, the cancellation lost), and nats-py's close waiting for the bytes it
wrote to reach a server that reads nothing more (here a paused process: SIGSTOP).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from anarchon.backends.nats import NatsBackend
from tests.nats.servers import NatsServer

Make = Callable[..., Awaitable[NatsBackend]]

#: stop() is bounded by seconds: its background tasks' cancellation (5 s at most), its
#: subscriptions' end (15 s) and the close (5 s, then 2 s once the socket is dropped).
STOP_WITHIN_S = 30.0


def _write_buffer(backend: NatsBackend) -> int:
    """Bytes asyncio holds for the backend's socket, not taken by the kernel yet."""
    nc: Any = backend._conn.nc
    assert nc is not None
    return int(nc._transport._io_writer.transport.get_write_buffer_size())


async def test_stop_returns_when_the_server_reads_nothing_more(
    private_server: Callable[..., NatsServer],
) -> None:
    server = private_server()
    backend = NatsBackend(server.url)  # every option at its default
    await backend.start()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        # Core messages the paused server never reads: the kernel's buffers fill, then asyncio's.
        payload = b"x" * 512 * 1024
        for _ in range(400):
            await backend._conn.send("stop.test.filler", payload)
            await asyncio.sleep(0)  # the turn's writes go out (Writer)
            if _write_buffer(backend) > 4 * len(payload):
                break
        assert _write_buffer(backend) > 0, "the socket took everything: nothing left to wait for"
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with asyncio.timeout(STOP_WITHIN_S):
            await backend.stop()
        assert loop.time() - began < STOP_WITHIN_S
        assert backend._conn.nc is None
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_stop_ends_a_loop_that_swallowed_its_cancellation(make: Make) -> None:
    backend = await make()  # every option at its default but the test's stream and prefix
    looking = asyncio.Event()

    async def look() -> None:
        """As the guard's look does when its request's answer is read in the turn stop()
        cancels it (``asyncio.wait_for`` on Python 3.11): the cancellation is lost and the
        look returns as if answered; the guard's loop goes on."""
        looking.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)

    guard: Any = backend._guard
    guard.look = look
    async with asyncio.timeout(10):
        while not looking.is_set():
            backend._conn.failures += 1  # the guard looks again within seconds after a failure
            await asyncio.sleep(0.5)
    guarding = backend._guarding
    assert guarding is not None
    async with asyncio.timeout(STOP_WITHIN_S):
        await backend.stop()
    assert guarding.done()
    assert backend._conn.nc is None
