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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

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


def _pause(pid: int) -> None:
    """SIGSTOP process ``pid`` and return once every thread of it has stopped (``kill()``
    returns before they do), within 10 s. Blocks: nothing else is written meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    until = time.monotonic() + 10
    while time.monotonic() < until:
        # The state follows the command's parenthesised name in /proc/<pid>/task/<tid>/stat.
        states = [
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in Path(f"/proc/{pid}/task").iterdir()
        ]
        if all(state in "Tt" for state in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"nats-server {pid} not stopped 10 s after SIGSTOP")


async def _history(url: str, stream: str, prefix: str, names: list[str], at_least: int) -> Any:
    """The jobs' runs read by a fresh backend, once at least ``at_least`` are there and none
    is ``running`` (or what is there after 30 s)."""
    from anarchon import RunStatus

    reader = NatsBackend(url, stream=stream, prefix=prefix)
    await reader.start()
    try:
        runs: list[Any] = []
        loop = asyncio.get_running_loop()
        until = loop.time() + 30
        while loop.time() < until:
            runs = [run for name in names for run in await reader.history(name)]
            if len(runs) >= at_least and all(r.status is not RunStatus.RUNNING for r in runs):
                break
            await asyncio.sleep(0.5)
        return runs
    finally:
        await reader.stop()


@pytest.mark.parametrize("jobs", [1, 2], ids=["one-claim", "batch"])
async def test_a_claim_unanswered_when_the_scheduler_stops_is_not_left_running(
    private_server: Callable[..., NatsServer], jobs: int
) -> None:
    """A claim whose publish the server took but had not answered when ``stop()`` gave up on it
    (the scheduler lets claims in flight come back for 5 s, then cancels them). The cancelled
    claim was forgotten: the server stored it once it ran again, nobody ran it or settled it,
    and history showed the slot ``running`` for good. Now the stop settles it (here the server
    runs again while the stop goes on): the claim stored as ours is closed ``skipped``, saying
    why. One job, every option at its default but the stream and prefix; or two jobs whose
    claims go out together (``jitter_ms=0``), in one batch."""
    from anarchon import RunStatus, Scheduler
    from tests.nats.servers import unique_names

    server = private_server()
    pid = server.pid
    assert pid is not None
    stream, prefix = unique_names()
    backend = NatsBackend(server.url, stream=stream, prefix=prefix)
    scheduler = Scheduler(backend)
    ran: list[Any] = []

    async def handler(ctx: Any) -> None:
        ran.append(ctx.slot)

    names = [f"flight{n}" for n in range(jobs)]
    for name in names:
        if jobs == 1:
            scheduler.add(name, "* * * * * *", handler)
        else:
            scheduler.add(name, "* * * * * *", handler, jitter_ms=0)
    paused = asyncio.Event()
    publish = backend._conn.publish

    async def pause_the_server_first(
        subject: str, payload: bytes, msg_id: str | None, wait_s: float
    ) -> Any:
        """The server stops reading just before the job's first claim is written: the claim
        goes out and stays unanswered until SIGCONT."""
        if subject.endswith(".claims") and not paused.is_set():
            _pause(pid)
            paused.set()
        return await publish(subject, payload, msg_id, wait_s)

    backend._conn.publish = pause_the_server_first  # type: ignore[method-assign]
    claim = backend.claim
    claims_ended: list[tuple[int, BaseException]] = []
    claim_ended = asyncio.Event()

    async def watched_claim(requests: Any) -> Any:
        try:
            return await claim(requests)
        except BaseException as exc:
            claims_ended.append((len(requests), exc))
            claim_ended.set()
            raise

    backend.claim = watched_claim  # type: ignore[method-assign]
    resumed = False
    stopping: asyncio.Future[None] | None = None
    try:
        await scheduler.start()
        async with asyncio.timeout(30):
            await paused.wait()
        stopping = asyncio.ensure_future(scheduler.stop())
        # The stop lets the claim come back for 5 s, then cancels it.
        async with asyncio.timeout(30):
            await claim_ended.wait()
        [(sent, ended)] = claims_ended
        assert isinstance(ended, asyncio.CancelledError), claims_ended
        assert sent == jobs, "one claim, or the jobs' claims in one batch"
        os.kill(pid, signal.SIGCONT)
        resumed = True
        async with asyncio.timeout(STOP_WITHIN_S + 30):
            await stopping
    finally:
        if not resumed:
            os.kill(pid, signal.SIGCONT)
            if stopping is not None:
                await stopping
    assert ran == [], "nothing was answered: nothing ran"
    runs = await _history(server.url, stream, prefix, names, jobs)
    assert len(runs) >= jobs, ("the claims the server took are in history", runs)
    assert all(r.status is not RunStatus.RUNNING for r in runs), runs
    for run in runs:
        assert run.status is RunStatus.SKIPPED, run
        assert "before it stopped" in (run.reason or ""), run
