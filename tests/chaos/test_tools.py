"""The fault suite's tools: the link proxy holds and delays, a faked process's wall clock steps
while its monotonic clock and ``time.sleep`` keep working."""

from __future__ import annotations

import shutil
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


# Two threads read the wall clock as fast as they can for argv[1] seconds; prints the readings
# and those more than an hour below the first (the real time, with the clock stepped +2 h).
TWO_READERS_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static time_t first;
static volatile int stop;
static long reads[2], real[2];
static void *loop(void *arg) {
  long i = (long)arg;
  struct timespec ts;
  while (!stop) {
    clock_gettime(CLOCK_REALTIME, &ts);
    reads[i]++;
    real[i] += ts.tv_sec < first - 3600;
  }
  return NULL;
}
int main(int argc, char **argv) {
  struct timespec ts, run = {atoi(argv[1]), 0};
  pthread_t threads[2];
  clock_gettime(CLOCK_REALTIME, &ts);
  first = ts.tv_sec;
  for (long i = 0; i < 2; i++) pthread_create(&threads[i], NULL, loop, (void *)i);
  nanosleep(&run, NULL);
  stop = 1;
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  printf("%ld %ld\n", reads[0] + reads[1], real[0] + real[1]);
  return 0;
}
"""


def test_every_thread_of_a_faked_process_reads_the_stepped_clock(tmp_path: Path) -> None:
    """After a step of +2 h no thread of a faked process reads the real time, not once. Two
    threads reading at once are what every worker does (its event loop, SQLite's thread, the
    lease keeper's); with the plain build (libfaketime.so.1) this probe read the real time 29
    to 92 times in 5 s (about once in 10 000 readings), with ``LIBRARY`` never."""
    if why := ensure_installed():
        pytest.skip(why)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the two-thread probe")
    source, probe = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(TWO_READERS_C)
    subprocess.run([compiler, "-O2", "-pthread", "-o", str(probe), str(source)], check=True)
    clock = FakeClockFile(tmp_path / "clock")
    clock.set(7200)
    done = subprocess.run(
        [str(probe), "3"],
        env={**clock.env(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    reads, real = (int(x) for x in done.stdout.split())
    assert reads > 10_000, done.stdout
    assert real == 0, f"{real} of {reads} readings on the real clock after a step of +2 h"
