"""The tiny HTTP server of ``anarchon run --metrics-port``: GET routes from a table, served on
threads of their own (a scrape or a probe is answered while the event loop is busy or blocked).

:data:`ROUTES` maps a path to a factory that is given the scheduler and returns the handler of
that path; a handler takes the :class:`Request` and returns a :class:`Response`. ``/metrics``
(the Prometheus exposition, :class:`anarchon.prometheus.Exposition`) and ``/healthz`` (200 when
healthy, 503 otherwise, :func:`anarchon.health.healthz`; ``/healthz?live=1`` for a liveness
probe) are there; other modules may add theirs before the server starts. GET and HEAD are
answered. No ASGI or WSGI framework: the standard library's ``http.server``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs, urlsplit

from ._options import Bound, check_int
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["BACKLOG", "LIVE_OFF", "LIVE_ON", "PORT", "ROUTES", "HttpServer", "Request", "Response"]

logger = logging.getLogger("anarchon.http")

PORT: Final = Bound(0, 65_535)
"""The range of the port (0: any free port)."""
TEXT: Final = "text/plain; charset=utf-8"
BACKLOG: Final = 128
"""Connections the listening socket queues before they are accepted (the standard library's
default, 5, made 8 parallel scrapes wait up to a second and refused some of 400)."""
LIVE_ON: Final = ("1", "true", "yes", "on")
"""The values of ``/healthz?live=`` that ask for the liveness probe (any case)."""
LIVE_OFF: Final = ("", "0", "false", "no", "off")
"""The values of ``/healthz?live=`` that ask for the readiness probe (any case; the default)."""


@dataclass(frozen=True, slots=True)
class Request:
    """A GET request: its path, its query (each name to its values) and the scheduler served."""

    path: str
    query: Mapping[str, list[str]]
    scheduler: Scheduler


@dataclass(frozen=True, slots=True)
class Response:
    """What a route answers: status, body and content type (and any more headers)."""

    status: int
    body: bytes
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]
"""Answers one request to a route; called on the server's thread (not the event loop)."""
RouteFactory = Callable[["Scheduler"], Handler]
"""Given the scheduler when the server starts, returns the handler of a route."""


def metrics_route(scheduler: Scheduler, job_histograms: bool = False) -> Handler:
    """The handler of ``/metrics``: :class:`anarchon.prometheus.Exposition` (raises
    :class:`~anarchon.errors.MissingDependency` without ``prometheus-client``)."""
    from .prometheus import Exposition

    exposition = Exposition(scheduler, job_histograms=job_histograms)

    def metrics(request: Request) -> Response:
        return Response(200, exposition.render(), exposition.content_type)

    return metrics


def _healthz_route(scheduler: Scheduler) -> Handler:
    from .health import healthz

    def probe(request: Request) -> Response:
        asked = request.query.get("live", ["0"])[-1]
        if asked.lower() not in LIVE_ON + LIVE_OFF:
            return Response(
                400,
                f"live={asked!r} is not a switch: give one of {', '.join(LIVE_ON)} for the "
                f"liveness probe, or {', '.join(v for v in LIVE_OFF if v)} (or nothing) for "
                "readiness (any case)\n".encode(),
            )
        status, body = healthz(scheduler, live=asked.lower() in LIVE_ON)
        return Response(status, body, "application/json")

    return probe


ROUTES: dict[str, RouteFactory] = {"/metrics": metrics_route, "/healthz": _healthz_route}
"""The server's routes: path to :data:`RouteFactory`; add to it before a server starts."""


class _Server(ThreadingHTTPServer):
    request_queue_size = BACKLOG
    daemon_threads = True


class HttpServer:
    """Serves :data:`ROUTES` for one scheduler on ``host:port`` from :meth:`start` to
    :meth:`stop`; a path not in the table answers 404, a handler's error 500 (logged)."""

    def __init__(
        self,
        scheduler: Scheduler,
        port: int,
        host: str = "0.0.0.0",
        routes: Mapping[str, RouteFactory] | None = None,
    ) -> None:
        self.port = check_int("port", port, PORT, "the metrics server")
        self.host = host
        table = ROUTES if routes is None else routes
        self.handlers: dict[str, Handler] = {path: make(scheduler) for path, make in table.items()}
        self.scheduler = scheduler
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # When the latest answered request of each path arrived (time.monotonic()).
        self._answered: dict[str, float] = {}
        self._changed = threading.Condition()
        self._enough = False

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` listened on (the port chosen when 0 was asked for)."""
        if self._server is None:
            return self.host, self.port
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Listen and serve on a daemon thread. Raises :class:`OSError` if the address cannot
        be bound (the port is taken, the host is not this machine's)."""
        server = _Server((self.host, self.port), _handler_class(self))
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="anarchon http", daemon=True
        )
        self._thread.start()
        host, port = self.address
        logger.info(
            "serving %s on http://%s:%d",
            ", ".join(sorted(self.handlers)),
            host,
            port,
            extra=log_fields(Action.HTTP_SERVING, address=f"http://{host}:{port}"),
        )

    def stop(self) -> None:
        """Stop serving and close the socket."""
        host, port = self.address
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            logger.info(
                "stopped serving on http://%s:%d",
                host,
                port,
                extra=log_fields(Action.HTTP_STOPPED, address=f"http://{host}:{port}"),
            )
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def linger(self, seconds: float, path: str = "/metrics") -> bool:
        """Go on serving until a request of ``path`` that arrived from now on has been
        answered (the scrape that sees the final counts), :meth:`enough` is called, or
        ``seconds`` pass. True if such a request was answered."""
        since = time.monotonic()
        deadline = since + seconds
        with self._changed:
            self._enough = False
            while self._answered.get(path, -1.0) < since and not self._enough:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.1))  # short waits: enough() sets a flag only
            return self._answered.get(path, -1.0) >= since

    def enough(self) -> None:
        """End a :meth:`linger` now (a signal handler may call it)."""
        self._enough = True  # no lock: a signal handler may run while this thread holds it

    def _served(self, path: str, arrived: float) -> None:
        with self._changed:
            if arrived > self._answered.get(path, -1.0):
                self._answered[path] = arrived
            self._changed.notify_all()

    def answer(self, target: str) -> Response:
        """The response to a GET of ``target`` (a path with its query)."""
        parts = urlsplit(target)
        handler = self.handlers.get(parts.path)
        if handler is None:
            known = ", ".join(sorted(self.handlers))
            return Response(404, f"no route {parts.path!r}; routes: {known}\n".encode())
        try:
            return handler(Request(parts.path, parse_qs(parts.query), self.scheduler))
        except Exception as exc:
            logger.exception(
                "GET %s failed", parts.path, extra=log_fields(Action.HTTP_ROUTE_FAILED)
            )
            return Response(500, f"{type(exc).__name__}: {exc}\n".encode())


def _handler_class(server: HttpServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        server_version = "anarchon"

        def do_GET(self) -> None:
            self._respond(body=True)

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def _respond(self, body: bool) -> None:
            arrived = time.monotonic()
            response = server.answer(self.path)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(response.body)
                self.wfile.flush()
            server._served(urlsplit(self.path).path, arrived)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug(format, *args)

    return _Handler
