"""Loopback ports for the servers and proxies the tests start: the one place that picks them.

A server a test starts and keeps until it ends takes the kernel's choice (:func:`any_free`). A
server that is killed and started again on the same port, or whose port must be known before
it starts (a cluster's routes, a URL written into a worker's command line), takes one from a
fixed range of its own kind, so that pytest's workers and the short fault run ``make test``
starts beside them never hand out the same port:

=============  =====================================================================
14200-14299    private nats-server processes, a share per pytest worker in each of its three
               parts (tests/nats/servers.py; a cluster takes 6 ports: up to 6 workers)
15500-15599    TCP proxies in front of the shared PostgreSQL, a share per pytest worker
               (tests/postgres/proxy.py)
15600-15615    the PostgreSQL TLS server, one per pytest worker (tests/postgres/test_tls.py)
16400-16799    private redis-server processes, a share per pytest worker (tests/redis/servers.py)
17300-17399    the fault runner's servers and proxies (tests/chaos/servers.py)
17600-17699    ``make bench``'s private redis-server (bench/services.py, its own probe:
               the benchmarks do not import the tests)
=============  =====================================================================
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterable, Iterator


def any_free() -> int:
    """A port nothing listens on now, the kernel's choice."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def is_free(port: int) -> bool:
    """Whether ``port`` can be bound on the loopback address now (nothing listens on it; one a
    server just left in TIME_WAIT counts as free, as the servers set SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def worker_share(ports: range) -> range:
    """This pytest worker's share of ``ports`` (all of it outside pytest-xdist): a worker then
    never takes a port another worker's test just freed by killing its server, whose client
    would reach the wrong server."""
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    index = _worker_index() % count
    share = len(ports) // count
    return range(ports.start + index * share, ports.start + (index + 1) * share)


def worker_port(ports: range) -> int:
    """One port of ``ports`` for this pytest worker, the same for all its tests."""
    return ports[_worker_index() % len(ports)]


def _worker_index() -> int:
    """This pytest-xdist worker's number (``gw3``: 3); 0 outside pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(worker) if worker.isdigit() else 0


class PortRange:
    """Hands out ports of ``ports`` that nothing listens on; with ``once``, never the same one
    twice in this process until it is given back (:meth:`give_back`). ``spread`` starts each
    process's search at its own place in the range, so processes that do not share a range
    rarely probe the same port at the same moment."""

    def __init__(self, ports: range, *, once: bool = True, spread: bool = False) -> None:
        self.ports = ports
        self._once = once
        self._spread = spread
        self._handed: set[int] = set()
        self._lock = threading.Lock()

    def take(self, count: int = 1) -> list[int]:
        """``count`` free ports of the range (RuntimeError when there are not that many)."""
        with self._lock:
            found: list[int] = []
            for port in self._order():
                if port not in self._handed and is_free(port):
                    found.append(port)
                    if len(found) == count:
                        if self._once:
                            self._handed.update(found)
                        return found
        raise RuntimeError(f"no {count} free ports in {self.ports.start}-{self.ports[-1]}")

    def take_one(self) -> int:
        """One free port of the range."""
        [port] = self.take()
        return port

    def give_back(self, port: int) -> None:
        """Let ``port`` be handed out again."""
        with self._lock:
            self._handed.discard(port)

    def _order(self) -> Iterable[int]:
        start = os.getpid() % len(self.ports) if self._spread else 0
        return [*self.ports[start:], *self.ports[:start]]


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[int, threading.Event]]:
    """A loopback server that accepts connections and never answers (a backend that hangs):
    its port, and an event set once it accepted one. Closed, with its connections, on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])
                accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()
        for conn in held:
            conn.close()
