"""A TCP proxy per instance, so the suite can slow down or cut off the link of ONE instance.

Each instance of a trial reaches the backend through its own :class:`LinkProxy`; the fault picks
the runner's proxy and switches it to ``hold`` (a black hole: connections stay open, nothing gets
through in either direction, as when packets are dropped; what was sent is delivered when the link
heals, as TCP would retransmit it) or ``delay`` (every byte arrives ``delay_s`` late), then back to
``pass``. All proxies of a trial share one event loop in a thread of the harness, so a harness
that waits synchronously does not stall them. Modelled on ``tests/postgres/proxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ProxyLoop:
    """One event loop in a daemon thread for a trial's proxies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def do(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class LinkProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``, in mode ``pass``, ``hold`` or ``delay``."""

    def __init__(self, loop: ProxyLoop, port: int, target: tuple[str, int]) -> None:
        self._loop = loop
        self.port = port
        self.target = target
        self.mode = "pass"
        self.delay_s = 0.0
        self._changed: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    def start(self) -> LinkProxy:
        self._loop.do(self._start())
        return self

    async def _start(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )

    def set(self, mode: str, delay_s: float = 0.0) -> None:
        """Switch to ``pass``, ``hold`` or ``delay`` (by ``delay_s``) from now on."""
        if mode not in ("pass", "hold", "delay"):
            raise ValueError(f"mode {mode!r} must be 'pass', 'hold' or 'delay'")

        def apply() -> None:
            self.mode, self.delay_s = mode, delay_s
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        self._loop.loop.call_soon_threadsafe(apply)

    def close(self) -> None:
        self._loop.do(self._close())

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        writers = [writer]
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            writers.append(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in writers:
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._conns.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read into a queue stamped with when each chunk may go; a sender obeys the mode."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, writer))
        try:
            while not sender.done() and (data := await reader.read(65536)):
                delay = self.delay_s if self.mode == "delay" else 0.0
                queue.put_nowait((time.monotonic() + delay, data))
            queue.put_nowait(None)  # end of stream: the sender flushes what is queued, then ends
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            while True:
                assert self._changed is not None
                changed = self._changed
                if self.mode == "hold":
                    await changed.wait()  # until the link heals (or changes mode)
                    continue
                wait = due - time.monotonic()
                if wait <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
            writer.write(data)
            await writer.drain()
