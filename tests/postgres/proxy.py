"""A TCP proxy in front of the shared PostgreSQL that a test can cut and restore.

The shared server must never be stopped, so "PostgreSQL is unreachable" is simulated here: the
worker's URL points at the proxy, and the test cuts it (every connection closed, new ones
refused, as when the server is down), or holds it (connections stay open but nothing gets
through, as in a network partition that drops packets), and restores it. The proxy runs its
own event loop in a thread so that tests which sleep synchronously do not stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

from tests.ports import PortRange, worker_share

T = TypeVar("T")

#: The PostgreSQL proxies' range (see tests/ports.py): this worker's share of it, each port held
#: until its proxy ends. A cut proxy's port is free for the kernel, and a proxy another worker
#: opened on it would let this test's client reconnect "through the outage".
PORTS: Final = PortRange(worker_share(range(15500, 15600)))


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target``; :meth:`cut` and :meth:`restore` it at will."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.target = target
        self.port = PORTS.take_one()
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        PORTS.give_back(self.port)

    def _do(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def cut(self) -> None:
        """Refuse new connections and close every open one, as a server that went down."""
        self._do(self._cut())

    def hold(self) -> None:
        """Keep every connection open but forward nothing, in either direction."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def restore(self) -> None:
        """Accept and forward connections again, on the same port."""
        self._do(self._listen())

    async def _listen(self) -> None:
        self._flowing.set()
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        if self._pipes:
            await asyncio.wait(list(self._pipes), timeout=5)
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        writers = [writer]
        try:
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            writers.append(up_writer)
            await asyncio.gather(
                _pump(reader, up_writer, self._flowing), _pump(up_reader, writer, self._flowing)
            )
        except (OSError, asyncio.CancelledError):
            # Cut: end quietly (asyncio logs a client task that ends cancelled as an error).
            pass
        finally:
            for w in writers:
                # A reset, not a polite close: the client sees its connection die.
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._pipes.discard(task)


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    try:
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.transport.abort()
