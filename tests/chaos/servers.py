"""Private servers the suite may restart, and the loopback ports it hands out.

The shared services (PostgreSQL 5432, Redis 6379, NATS 4222) are never restarted: the "backend
restarted" fault runs on a server of its own, started here on a port of the suite's range
(17300-17399) with a temporary directory, and stopped by its process id.

* Redis: ``redis-server`` with an append-only file fsynced on every write, so a restart keeps what
  it acknowledged (a Redis that loses its data forgets which slots ran: documented, not tested).
* PostgreSQL: a cluster made with ``initdb`` (as the ``postgres`` user) in a temporary directory,
  the ``postgres`` binary run directly so its pid is the server's.
* NATS: ``nats-server`` (Debian's, as the shared service) with JetStream on a temporary store.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final, Protocol

from tests.nats.servers import DEBIAN_BINARY, NatsServer
from tests.ports import PortRange, worker_share
from tests.redis.servers import RedisServer, ping

#: The fault runner's range (see tests/ports.py): each port handed out once, until given back.
# Each pytest worker its own share: tests/postgres/test_tls.py and tests/sqlite/test_faults.py
# start these servers on other workers while the chaos tests run (CI of fd71391: two workers'
# postgres took port 17301 at once, 'Address already in use').
PORTS: Final = PortRange(worker_share(range(17300, 17400)))


class Restartable(Protocol):
    """A private server: its URL, and stop/start on the same port with the same data."""

    url: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


class PrivateRedis:
    """A redis-server whose data survives a restart (AOF, fsync always)."""

    def __init__(self, directory: Path) -> None:
        self.port = PORTS.take_one()
        self._server = RedisServer(
            directory / "redis",
            port=self.port,
            args=("--appendonly", "yes", "--appendfsync", "always"),
        )
        self.url = self._server.url

    def start(self) -> None:
        self._server.start(timeout=30)

    def stop(self) -> None:
        self._server.stop()  # SIGTERM: redis-server flushes its AOF and exits

    def close(self) -> None:
        self._server.stop()
        PORTS.give_back(self.port)

    @property
    def up(self) -> bool:
        return ping(self.port)


class PrivateNats:
    """A nats-server with JetStream on a temporary store; a restart keeps the stream."""

    def __init__(self, directory: Path) -> None:
        self.port = PORTS.take_one()
        self._server = NatsServer(
            binary=DEBIAN_BINARY, port=self.port, directory=directory / "nats", name="chaos"
        )
        self.url = self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()  # SIGTERM: a clean shutdown

    def close(self) -> None:
        self._server.stop()
        PORTS.give_back(self.port)


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_version)
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/*/bin/postgres: install postgresql")
    return Path(found[-1]).parent


def _version(path: str) -> int:
    part = Path(path).parts[-3]
    return int(part) if part.isdigit() else 0


class PrivatePostgres:
    """A PostgreSQL cluster of its own: ``initdb`` in a temporary directory, run as ``postgres``.

    ``stop()`` is a fast shutdown (SIGINT), ``start()`` starts it again on the same port and data.
    ``port``: one the caller reserved, instead of one of the suite's range.
    """

    def __init__(self, port: int | None = None) -> None:
        #: More ``name=value`` server settings (``-c``) for :meth:`start`, such as ``ssl=on``.
        self.settings: tuple[str, ...] = ()
        self.port = PORTS.take_one() if port is None else port
        self.bin = _postgres_bin()
        # Not under pytest's tmp_path: the postgres user must be able to reach it.
        self.root = Path(tempfile.mkdtemp(prefix="anarchon-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.proc: subprocess.Popen[bytes] | None = None
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        done = subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D", str(self.data),
                "-U", "postgres",
                "--auth=trust",
                "--no-sync",
                "-E", "UTF8",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            user=self._user.pw_uid if self._user else None,
        )  # fmt: skip
        if done.returncode != 0:
            self.close()
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")

    def start(self, timeout: float = 60) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D", str(self.data),
                    "-p", str(self.port),
                    "-k", str(self.root),
                    "-c", "listen_addresses=127.0.0.1",
                    "-c", "fsync=off",
                    "-c", "max_connections=60",
                    "-c", "shared_buffers=16MB",
                    *(arg for setting in self.settings for arg in ("-c", setting)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                user=self._user.pw_uid if self._user else None,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._accepting():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"postgres on {self.port} did not start:\n{log}")
            time.sleep(0.1)

    def _accepting(self) -> bool:
        done = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
            capture_output=True,
        )
        return done.returncode == 0

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGINT)  # fast shutdown: sessions are ended, data kept
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def close(self) -> None:
        self.stop()
        PORTS.give_back(self.port)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)
