"""nats-server processes for the NATS tests: private servers, a loopback cluster, the shared one.

Private servers listen on loopback ports of the NATS helper's range (14200-14299) with a
temporary store, and are stopped by their pid. Each is started with PR_SET_PDEATHSIG so it dies
with the test process even if that is killed. Port sub-ranges: 14200-14219 the session server of
the ``nats_current`` harness, 14220-14259 single servers of tests, 14260-14299 clusters.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.ports import PortRange, worker_share

SHARED_URL = "nats://127.0.0.1:4222"
DEBIAN_BINARY = "/usr/sbin/nats-server"
CURRENT_BINARY = str(Path(sys.executable).parent / "nats-server")
BINARIES = {"2.9": DEBIAN_BINARY, "current": CURRENT_BINARY}

# The NATS tests' range (see tests/ports.py), in three parts, each split between pytest's workers:
# a server a test kills and starts again leaves its client and route ports free meanwhile, and a
# server of another worker started on them would answer this test's clients (a cluster then
# reports its own peers offline). Within a worker's share a port is probed free, not handed out
# once; a server that loses a race anyway is started again elsewhere.
SESSION_PORTS = PortRange(worker_share(range(14200, 14220)), once=False, spread=True)
SINGLE_PORTS = PortRange(worker_share(range(14220, 14260)), once=False, spread=True)
CLUSTER_PORTS = PortRange(worker_share(range(14260, 14300)), once=False, spread=True)


def unique_names() -> tuple[str, str]:
    """A fresh stream name and subject prefix for one test."""
    token = uuid.uuid4().hex[:12]
    return f"T_{token}", f"t{token}."


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def wait_port(
    port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


@dataclass
class NatsServer:
    """One nats-server process on a loopback port, started from a config file or flags."""

    binary: str
    port: int
    directory: Path
    jetstream: bool = True
    config: str | None = None
    name: str = "n"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, wait: bool = True) -> NatsServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.config is not None:
            conf = self.directory / f"{self.name}.conf"
            conf.write_text(self.config)
            args = [self.binary, "-c", str(conf)]
        else:
            args = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name]
            if self.jetstream:
                args += ["-js", "-sd", str(self.directory / "store")]
        self.starts += 1
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        if wait:
            wait_port(self.port, proc=self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process by its pid (SIGKILL after 10 s)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.stop(signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def single_server(directory: Path, binary: str, *, jetstream: bool = True) -> NatsServer:
    """A private server on a free port of the tests' range (not started)."""
    port = SINGLE_PORTS.take_one()
    return NatsServer(binary=binary, port=port, directory=directory, jetstream=jetstream)


def configured_server(directory: Path, binary: str, body: str) -> NatsServer:
    """A private JetStream server on a free port, with ``body`` added to its configuration
    (an ``authorization {...}`` or ``tls {...}`` block); not started."""
    port = SINGLE_PORTS.take_one()
    config = (
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{\n  store_dir: "{directory / "store"}"\n}}\n'
        f"{body}\n"
    )
    return NatsServer(binary=binary, port=port, directory=directory, config=config, name="conf")


@dataclass
class Cluster:
    """Three JetStream servers forming one cluster on loopback (see the research notes, §4)."""

    binary: str
    directory: Path
    nodes: list[NatsServer] = field(default_factory=list)

    @classmethod
    def create(cls, binary: str, directory: Path) -> Cluster:
        ports = CLUSTER_PORTS.take(6)
        client, routes = ports[:3], ports[3:]
        cluster = cls(binary=binary, directory=directory)
        route_list = ", ".join(f"nats://127.0.0.1:{p}" for p in routes)
        for n in range(3):
            name = f"n{n + 1}"
            store = directory / name
            config = (
                f"server_name: {name}\n"
                f"listen: 127.0.0.1:{client[n]}\n"
                f'jetstream {{\n  store_dir: "{store}"\n  max_memory_store: 64MB\n'
                "  max_file_store: 256MB\n}\n"
                "cluster {\n"
                "  name: anarchon-test\n"
                f"  listen: 127.0.0.1:{routes[n]}\n"
                f"  routes: [ {route_list} ]\n"
                "}\n"
            )
            cluster.nodes.append(
                NatsServer(
                    binary=binary, port=client[n], directory=directory, config=config, name=name
                )
            )
        return cluster

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            wait_port(node.port, proc=node.proc)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, name: str) -> NatsServer:
        return next(n for n in self.nodes if n.name == name)


_session: NatsServer | None = None


def session_server() -> NatsServer:
    """The current-version server shared by one test session (started on first use)."""
    global _session
    if _session is None or not _session.running:
        directory = Path(tempfile.mkdtemp(prefix="anarchon-nats-"))
        for attempt in range(5):
            port = SESSION_PORTS.take_one()
            server = NatsServer(
                binary=CURRENT_BINARY, port=port, directory=directory, name="session"
            )
            try:
                server.start()
                break
            except RuntimeError:  # another worker took the port between the check and bind
                server.stop()
                if attempt == 4:
                    raise
        _session = server
        atexit.register(_stop_session, server)
    return _session


def _stop_session(server: NatsServer) -> None:
    server.stop()
    shutil.rmtree(server.directory, ignore_errors=True)


async def connect(url: str | list[str], **options: Any) -> Any:
    """A plain nats-py connection for test set-up and inspection (fails fast, stays quiet)."""
    import nats

    async def quiet(exc: Exception) -> None:
        pass

    settings: dict[str, Any] = {
        "connect_timeout": 2,
        "max_reconnect_attempts": 2,
        "reconnect_time_wait": 0.2,
        "error_cb": quiet,
    }
    settings.update(options)
    return await nats.connect(servers=url if isinstance(url, list) else [url], **settings)


async def delete_stream(url: str | list[str], stream: str) -> None:
    """Delete a test's stream and its key-value buckets (registry, definitions, control), those
    that exist: a fleet's instances record themselves, so a stream deleted alone leaves two or
    three buckets on the shared server for good."""
    import nats.errors
    import nats.js.errors

    from anarchon.backends.nats._client import close_client
    from anarchon.backends.nats._registry import bucket_streams

    nc = await connect(url)
    try:
        # A generous limit and two more tries: on a three-node test cluster sharing two busy
        # cores a deletion's answer can take over nats-py's 5 s (it failed CI of 69a098c in
        # this clean-up, after the test's own checks). A deletion that went through before its
        # answer was lost is answered "not found" the next time.
        js = nc.jetstream(timeout=20)
        for name in (stream, *bucket_streams(stream)):
            for attempt in range(3):
                try:
                    await js.delete_stream(name)
                except nats.js.errors.NotFoundError:
                    pass
                except nats.errors.TimeoutError:
                    if attempt == 2:
                        raise
                    continue
                break
    finally:
        await close_client(nc)  # within seconds, even if the server stopped reading


async def started_backend(make: Callable[[], Any], within_s: float = 30.0) -> Any:
    """A backend of ``make()`` started; a start refused because a peer of the test's cluster is
    not back in JetStream yet (10005, "peer offline": seen in a CI run), or unanswered past its
    own retries (BackendUnavailable: a server of the cluster was just killed and the survivors
    are electing leaders), is tried again, for ``within_s`` at most."""
    from anarchon.errors import BackendError, BackendUnavailable

    deadline = time.monotonic() + within_s
    while True:
        backend = make()
        try:
            await backend.start()
            return backend
        except BackendError as exc:
            await backend.stop()
            transient = isinstance(exc, BackendUnavailable) or "peer offline" in str(exc)
            if not transient or time.monotonic() > deadline:
                raise
        await asyncio.sleep(1.0)


def hold_shared_account() -> str | None:
    """Keep one empty stream of this test process on the shared 2.9 server until
    :func:`release_shared_account`; None when that server does not answer.

    nats-server 2.9.10 removes an account's store directory when its last stream is deleted; a
    stream another test process creates at that moment fails with "error creating store for
    stream" (err_code 10049; seen in CI, and 3 to 5 creates in 600 with four processes creating
    and deleting streams, none with such a stream held). While every process holds one, the
    account never runs out of streams in the middle of the suite.
    """
    import nats.errors

    name = f"HOLD_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        nc = await connect(SHARED_URL)
        try:
            await nc.jetstream().add_stream(name=name, subjects=[f"{name.lower()}.>"])
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(create(), 10))
    except (OSError, TimeoutError, nats.errors.Error):
        return None
    return name


def release_shared_account(name: str) -> None:
    """Delete the stream :func:`hold_shared_account` made."""
    asyncio.run(delete_stream(SHARED_URL, name))


#: How old a hold stream must be before :func:`sweep_stale_holds` deletes it: a test process
#: holds its own for the session (``make test`` takes under half an hour, ``make chaos`` about
#: an hour); one older was left by a process killed before its release.
STALE_HOLD_S = 2 * 3600


def _created_s(stamp: str) -> float | None:
    """Seconds since the epoch of a stream's ``created`` (RFC 3339, nanoseconds, UTC); None if
    it does not read as one."""
    import re
    from datetime import datetime

    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)", stamp)
    if found is None:
        return None
    zone = "+00:00" if found[2] == "Z" else found[2]
    return datetime.fromisoformat(found[1] + zone).timestamp()


async def _stale_holds(nc: Any, max_age_s: float) -> list[str]:
    """The hold streams (``HOLD_`` names) on ``nc``'s account created over ``max_age_s`` ago,
    from the JetStream API's stream list, which gives each stream's creation time whatever
    nats-py's version; never every stream of the account (one is kept: see
    :func:`hold_shared_account`)."""
    import json

    streams: list[dict[str, Any]] = []
    while True:
        reply = await nc.request(
            "$JS.API.STREAM.LIST", json.dumps({"offset": len(streams)}).encode(), timeout=10
        )
        page = json.loads(reply.data)
        found = page.get("streams") or []
        streams += found
        if not found or len(streams) >= int(page.get("total", 0)):
            break
    now = time.time()
    stale = []
    for info in streams:
        name = str(info.get("config", {}).get("name", ""))
        created = _created_s(str(info.get("created", "")))
        if name.startswith("HOLD_") and created is not None and now - created > max_age_s:
            stale.append((created, name))
    stale.sort()
    if len(stale) == len(streams):
        stale.pop()  # the newest stays: the account is never left without a stream
    return [name for _, name in stale]


def sweep_stale_holds(max_age_s: float = STALE_HOLD_S, url: str = SHARED_URL) -> list[str]:
    """Delete the hold streams of :func:`hold_shared_account` created over ``max_age_s`` ago on
    the shared server (or ``url``), left by test processes killed before their release (a
    timeout); returns their names. Other streams are never touched, and a server that does not
    answer (or any error) ends the sweep quietly: the run goes on without it."""

    async def sweep() -> list[str]:
        import nats.js.errors

        nc = await connect(url)
        try:
            js = nc.jetstream(timeout=10)
            deleted = []
            for name in await _stale_holds(nc, max_age_s):
                with contextlib.suppress(nats.js.errors.NotFoundError):  # another sweep's
                    await js.delete_stream(name)
                    deleted.append(name)
            return deleted
        finally:
            await nc.close()

    try:
        return asyncio.run(asyncio.wait_for(sweep(), 15))
    except Exception:  # NATS down or slow: nothing swept, the run goes on
        return []


async def read_subject(
    url: str | list[str], stream: str, subject: str, within_s: float = 30.0
) -> list[Any]:
    """Every message on ``subject`` (nats-py ``RawStreamMsg``), oldest first. A read that gets
    no answer (nats-py's 5 s) or no responder is made again until ``within_s``: on a cluster
    that just lost a server the stream's new leader can take longer than one read to answer
    on a loaded host, and what a test reads back is the stream's content, not that speed."""
    import nats.errors
    import nats.js.errors

    nc = await connect(url)
    try:
        js = nc.jetstream()
        out: list[Any] = []
        seq = 1
        deadline = time.monotonic() + within_s
        while True:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return out
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
                continue
            out.append(msg)
            seq = msg.seq + 1
    finally:
        await nc.close()
