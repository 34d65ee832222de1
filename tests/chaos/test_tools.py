"""The fault suite's tools: the link proxy holds and delays, a faked process's wall clock steps
while its monotonic clock and ``time.sleep`` keep working."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.faketime import FakeClockFile, ensure_installed
from tests.chaos.proxy import LinkProxy, ProxyLoop
from tests.chaos.servers import PORTS


@pytest.fixture
def echo() -> Iterator[int]:
    """A loopback echo server; yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.close()


def _roundtrip(sock: socket.socket, payload: bytes, timeout: float) -> tuple[bytes, float]:
    began = time.monotonic()
    sock.settimeout(timeout)
    sock.sendall(payload)
    try:
        return sock.recv(4096), time.monotonic() - began
    except TimeoutError:
        return b"", time.monotonic() - began


def test_the_proxy_passes_holds_and_delays(echo: int) -> None:
    loop = ProxyLoop()
    port = PORTS.take_one()
    proxy = LinkProxy(loop, port, ("127.0.0.1", echo)).start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            assert _roundtrip(sock, b"one", 5)[0] == b"one"
            proxy.set("hold")
            time.sleep(0.1)
            assert _roundtrip(sock, b"two", 1.0)[0] == b""  # a black hole, the connection open
            proxy.set("pass")
            sock.settimeout(5)
            assert sock.recv(4096) == b"two"  # delivered when the link heals
            proxy.set("delay", delay_s=0.8)
            time.sleep(0.1)
            data, took = _roundtrip(sock, b"three", 5)
            assert data == b"three" and took >= 1.5  # 0.8 s each way
    finally:
        proxy.close()
        loop.close()
        PORTS.give_back(port)


def test_a_faked_process_steps_its_wall_clock_only(tmp_path: Path) -> None:
    if why := ensure_installed():
        pytest.skip(why)
    clock = FakeClockFile(tmp_path / "clock")
    script = (
        "import time, sys\n"
        "w0, m0 = time.time(), time.monotonic()\n"
        "time.sleep(0.3)\n"  # broken by libfaketime 0.9.10 without the sitecustomize
        "open(sys.argv[1], 'w').close()\n"
        "while time.time() - w0 > -30: time.sleep(0.05)\n"  # until the clock steps back
        "print(round(time.time() - w0), round(time.monotonic() - m0))\n"
    )
    flag = tmp_path / "slept"
    env = {**clock.env(), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(flag)], env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    clock.set(-60)
    out, _ = proc.communicate(timeout=20)
    wall_moved, mono_moved = (int(x) for x in out.split())
    assert -61 <= wall_moved <= -58 and 0 <= mono_moved <= 5, out
