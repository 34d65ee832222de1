"""``anarchon run``: import the Scheduler that ``module:attribute`` names and run it until SIGINT
or SIGTERM, with its metrics server (``--metrics-port``, ``--metrics-linger``); once it stopped,
give the threads its handlers left a few seconds before the process exits without them.
:mod:`anarchon.cli` parses the command line, holds the early signals and calls
:func:`run_scheduler`, then :func:`leave_threads`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Final

from .._early import EarlySignals
from .._http import ROUTES, HttpServer, RouteFactory, metrics_route
from .._scheduler import Scheduler
from ..errors import BackendError, SchedulerStateError
from ..logs import Action, log_fields
from .common import ENV_BACKEND, EXIT_OK, EXIT_USAGE, Exit
from .output import one_line


def _load_scheduler(target: str) -> Scheduler:
    """The Scheduler ``module:attribute`` names (a function there is called to make it),
    imported with the current directory first on ``sys.path``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise Exit(
            EXIT_USAGE, f"anarchon run: {target!r} must be 'module:attribute', e.g. 'app:scheduler'"
        )
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Exit(EXIT_USAGE, f"anarchon run: cannot import {module_name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Exit(
                EXIT_USAGE, f"anarchon run: {module_name!r} has no attribute {attr!r}"
            ) from None
    if callable(obj) and not isinstance(obj, Scheduler):
        obj = obj()
    if not isinstance(obj, Scheduler):
        raise Exit(EXIT_USAGE, f"anarchon run: {target!r} is {obj!r}, not an anarchon Scheduler")
    return obj


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsOptions:
    """The metrics server of ``anarchon run --metrics-port``."""

    port: int
    """``--metrics-port``: serve Prometheus metrics on this port."""
    host: str = "0.0.0.0"
    """``--metrics-host``: the address the metrics server listens on."""
    job_histograms: bool = False
    """``--metrics-job-histograms``: histograms per job instead of the instance's."""
    linger: int = 0
    """``--metrics-linger``: seconds to serve on after the scheduler stopped (0: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What ``anarchon run`` was asked to do: which Scheduler to run, with which backend, and
    its metrics server. :meth:`of` reads them from the command line; the defaults are the
    command's."""

    target: str
    """``module:attribute`` of a Scheduler, or of a function that makes one."""
    backend_url: str | None = None
    """``--backend``: the URL a ``Scheduler()`` made without a backend uses."""
    metrics: MetricsOptions | None = None
    """The metrics server (None without ``--metrics-port``: no server)."""

    @classmethod
    def of(cls, args: argparse.Namespace) -> RunOptions:
        """The options of a parsed ``anarchon run`` command line."""
        metrics = None
        if args.metrics_port is not None:
            metrics = MetricsOptions(
                port=args.metrics_port,
                host=args.metrics_host,
                job_histograms=args.metrics_job_histograms,
                linger=args.metrics_linger,
            )
        return cls(target=args.target, backend_url=args.backend, metrics=metrics)


def run_scheduler(options: RunOptions, early: EarlySignals | None = None) -> int:
    """``anarchon run``: run the Scheduler ``options`` name until a signal stops it.
    ``early``: the signals caught since the process began (state, not an option): one that
    came before the scheduler started means it is not started, or (during its start) that the
    start is cancelled."""
    early = early or EarlySignals()
    stop = _Stop()  # set from the signal handler: binds no loop until waited
    early.on_signal(stop.set)
    target, backend_url = options.target, options.backend_url
    if backend_url is not None and not backend_url.strip():
        raise Exit(
            EXIT_USAGE,
            f"anarchon run: --backend {backend_url!r} is empty: give a backend URL such as "
            "sqlite:///anarchon.db, or leave --backend out",
        )
    if backend_url is not None:
        os.environ[ENV_BACKEND] = backend_url  # Scheduler() made without a backend reads it
    scheduler = _load_scheduler(target)
    if backend_url is not None and scheduler.backend_url != backend_url:
        raise Exit(
            EXIT_USAGE,
            f"anarchon run: --backend applies to a Scheduler() made without a backend, but "
            f"{target} was given its own ({scheduler.backend.name}); drop --backend or build "
            "the scheduler with Scheduler() and no backend",
        )
    module = target.partition(":")[0]
    guard = (
        f"guard the call with 'if __name__ == \"__main__\":' in {module!r} so that importing "
        "it only builds the scheduler"
    )
    if scheduler.running:
        raise Exit(
            EXIT_USAGE,
            f"anarchon run: {target} is already running: importing {module!r} started it; {guard}",
        )
    if early.caught:
        logging.getLogger("anarchon.scheduler").info(
            "%s before the scheduler started: not starting it", early.caught[0]
        )
        return EXIT_OK
    stop.scheduler = scheduler
    metrics = options.metrics
    server = None if metrics is None else _serve(scheduler, metrics)
    try:
        scheduler.run(stop)
        if server is not None and metrics is not None and metrics.linger:
            if stop.while_starting:
                # Nothing ran, so there are no final counts to wait for a scrape of: the
                # operator's stop is not held back by up to --metrics-linger seconds.
                logging.getLogger("anarchon.http").info(
                    "the start was cancelled: no final metrics to serve, not lingering",
                    extra=log_fields(Action.HTTP_LINGER, scraped=False),
                )
            else:
                _linger(server, metrics.linger)
    except BackendError as exc:
        if not stop.is_set():
            raise
        # The backend failed the start just as SIGINT or SIGTERM came (one that comes before
        # cancels the start: serve()): the operator stopped a scheduler that never started.
        logging.getLogger("anarchon.scheduler").warning(
            "stopped before the backend answered: the scheduler never started (%s)",
            one_line(str(exc)),
            extra=log_fields(Action.START_FAILED),
        )
        return EXIT_OK
    except SchedulerStateError:
        raise Exit(
            EXIT_USAGE,
            f"anarchon run: {target} had already run and stopped while {module!r} was imported "
            f"(it calls scheduler.run() at import time), so there is nothing left to run; {guard}",
        ) from None
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK


class _Stop(asyncio.Event):
    """The stop of ``anarchon run`` (a signal: early, or the loop's handler), noting whether it
    came while the scheduler was still starting (its start is then cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: Scheduler | None = None
        self.while_starting = False

    def set(self) -> None:
        """Set the event; the first time, note whether the scheduler's start had ended."""
        if not self.is_set() and self.scheduler is not None:
            # A stop before the start has ended cancels it (serve()), and nothing has run.
            self.while_starting = self.scheduler.state in ("new", "starting")
        super().set()


def _serve(scheduler: Scheduler, metrics: MetricsOptions) -> HttpServer:
    """Start the metrics server of ``anarchon run --metrics-port`` (see :mod:`._http`)."""
    routes: dict[str, RouteFactory] = {
        **ROUTES,
        "/metrics": partial(metrics_route, job_histograms=metrics.job_histograms),
    }
    port, host = metrics.port, metrics.host
    server = HttpServer(scheduler, port, host, routes)
    try:
        server.start()
    except OSError as exc:
        raise Exit(EXIT_USAGE, f"anarchon run: cannot listen on {host}:{port}: {exc}") from None
    return server


def _linger(server: HttpServer, seconds: int) -> None:
    """``--metrics-linger``: the scheduler has stopped; serve on until a scrape has seen the
    final counts, ``seconds`` pass, or SIGINT or SIGTERM comes."""
    logger = logging.getLogger("anarchon.http")
    logger.info(
        "the scheduler stopped: serving the final metrics until a scrape reads them, at most "
        "%d s (SIGINT or SIGTERM ends the wait)",
        seconds,
        extra=log_fields(Action.HTTP_LINGER),
    )
    taken = {sig: signal.signal(sig, lambda *_: server.enough()) for sig in _SIGNALS}
    try:
        scraped = server.linger(seconds)
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)
    logger.info(
        "%s",
        "a scrape read the final metrics" if scraped else "no scrape read the final metrics",
        extra=log_fields(Action.HTTP_LINGER, scraped=scraped),
    )


_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

#: ``anarchon run``: once the scheduler stopped, how long (s) the threads still running that are
#: not daemon threads (started by a handler) get to end before the process exits without them.
THREADS_WAIT_S: Final = 3.0


def leave_threads(code: int) -> None:
    """``anarchon run`` is over: wait up to :data:`THREADS_WAIT_S` for the non-daemon threads
    still running (a handler started them; Python's own exit would wait for them for ever),
    then, if some still run, log ``threads_left`` naming them and end the process now with
    ``code`` (``os._exit``, after flushing the logs and output: no atexit hooks run). Returns
    when none is left. Only the command does this: a Scheduler used as a library leaves the
    process to its owner."""
    deadline = time.monotonic() + THREADS_WAIT_S
    for thread in _running_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _running_threads()
    if not left:
        return
    logging.getLogger("anarchon.scheduler").warning(
        "the scheduler stopped, but %d thread(s) that are not daemon threads still run after "
        "%g s: %s; exiting without them (code %d)",
        len(left),
        THREADS_WAIT_S,
        ", ".join(repr(t.name) for t in left),
        code,
        extra=log_fields(Action.THREADS_LEFT, threads=len(left)),
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _running_threads() -> list[threading.Thread]:
    """The threads other than this one that Python's exit would wait for."""
    return [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.daemon and t.is_alive()
    ]
