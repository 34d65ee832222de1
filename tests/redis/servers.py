"""Private redis-server processes for tests that kill, restart or cluster them.

Each runs on a loopback port of the Redis tests' range (16400-16799: a hundred ports for each
of four pytest workers, each port handed out once) with a temporary directory and no
persistence, and is stopped by its process id. The shared server on 6379 is never touched by
these.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.ports import PortRange, worker_share

REDIS_SERVER = "/usr/bin/redis-server"
RANGE = range(16400, 16800)
#: redis-py's major version: the compat venv (``make compat``) runs the lowest allowed, 5.
REDIS_MAJOR = int(redis.__version__.split(".")[0])


#: This process's share of the Redis tests' range (see tests/ports.py), each port handed out once.
PORTS = PortRange(worker_share(RANGE))
free_port = PORTS.take_one


def ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """One redis-server; ``start()`` again after ``kill()`` restarts it on the same port."""

    dir: Path
    port: int = field(default_factory=free_port)
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.dir / f"redis-{self.port}.log"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        command = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.log),
            *self.args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"redis-server on {self.port} did not start:\n{log}")
            time.sleep(0.02)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server (SIGKILL by default) and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip()


@contextlib.contextmanager
def redis_server(tmp: Path, *args: str) -> Iterator[RedisServer]:
    """A started private server, stopped by its pid afterwards."""
    server = RedisServer(tmp / "redis", args=args)
    try:
        yield server.start()
    finally:
        server.stop()
