"""Run a scheduler inside a Starlette or FastAPI application, started and stopped with it.

::

    from fastapi import FastAPI
    from anarchon import Scheduler
    from anarchon.integrations.starlette import lifespan

    scheduler = Scheduler(...)
    app = FastAPI(lifespan=lifespan(scheduler))

Every worker process of the application (``uvicorn --workers N``, ``gunicorn -w N -k
uvicorn_worker.UvicornWorker``, with or without ``--preload``) runs the lifespan, so every
worker is an instance; the backend picks one of them for each slot. The scheduler starts after
the application's own lifespan has entered (its database pools are ready when the first handler
runs) and stops, draining running handlers for up to ``grace_ms``, before that lifespan exits.

A backend that cannot be reached when the application starts does not stop the application:
the web workers serve, the scheduler's start is retried in the background (logged
``start_failed``, then ``started``), and ``scheduler.running`` stays false until it starts. A
failing start of a web worker would end the whole server (uvicorn exits; gunicorn's master halts
on a worker that fails to boot), so a blip of the cron store during a deploy or a worker
recycled by ``max_requests`` would take the site down.

The scheduler's stop begins when the server is told to stop (SIGINT or SIGTERM, as uvicorn and
gunicorn's UvicornWorker take them), not when the server has finished its open requests and
runs the lifespan's shutdown: a worker waiting for a slow request (or a long-lived connection)
claims no more slots, and its running handlers drain meanwhile, within ``grace_ms`` of the
signal, as the server's own stop timeout counts. A start still being retried then is tried no
more (one under way is stopped as soon as it ends).

Starlette is not imported here: the lifespan is the plain ASGI shape that Starlette, FastAPI and
any framework taking ``lifespan=`` accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import Any, Final

from anarchon import BackendUnavailable, InvalidOption, Scheduler
from anarchon._redact import redact_url
from anarchon.logs import Action, log_fields

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "lifespan"]

logger = logging.getLogger("anarchon.scheduler")

RETRY_MIN_S: Final = 1.0
"""The first wait before the start of a scheduler whose backend could not be reached is tried
again (s); each failure doubles it, up to :data:`RETRY_MAX_S`."""
RETRY_MAX_S: Final = 30.0
"""The longest wait between two tries of the start (s)."""


def lifespan(
    scheduler: Scheduler | Callable[[], Scheduler],
    app_lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """A lifespan that runs ``scheduler`` while the application runs.

    If the backend cannot be reached when the application starts
    (:class:`~anarchon.BackendUnavailable`), the application starts anyway and the scheduler's
    start is retried in the background, every :data:`RETRY_MIN_S` doubling to
    :data:`RETRY_MAX_S`, until it starts, the server's stop signal (SIGINT, SIGTERM) or the
    application stops. Any other error of the start (a bad option, a backend that refuses)
    stops the application's start, as before.

    :param scheduler: the :class:`~anarchon.Scheduler` to run, or a function that makes one.
        A scheduler starts only once, so pass a function when the application's lifespan may
        run more than once in one process (tests that enter ``TestClient(app)`` repeatedly):
        each run then gets a new scheduler.
    :param app_lifespan: the application's own lifespan, if it has one. It is entered first
        and exited last, so what it sets up is there for every handler; whatever it yields
        (the lifespan state) is passed on unchanged.
    :returns: a function of the application, for ``FastAPI(lifespan=...)`` or
        ``Starlette(lifespan=...)``.
    """
    if not isinstance(scheduler, Scheduler) and not callable(scheduler):
        raise InvalidOption(
            f"scheduler={scheduler!r} must be an anarchon Scheduler or a function that makes one"
        )
    if app_lifespan is not None and not callable(app_lifespan):
        raise InvalidOption(
            f"app_lifespan={app_lifespan!r} must be a lifespan: a function of the application "
            "that returns an async context manager"
        )

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[Any]:
        instance = _scheduler_of(scheduler)
        async with contextlib.AsyncExitStack() as stack:
            state = None
            if app_lifespan is not None:
                state = await stack.enter_async_context(app_lifespan(app))
            retrying = None
            try:
                await instance.start()
            except BackendUnavailable as exc:
                _log_failed(instance, exc, RETRY_MIN_S)
                retrying = _Retrying(instance)
                stack.push_async_callback(retrying.close)
            else:
                stack.push_async_callback(instance.stop)
            stack.callback(_EarlyStop(instance, retrying).restore)
            yield state

    return run


class _Retrying:
    """Tries the start of a scheduler whose backend could not be reached again, in a task of
    its own, until it starts or :meth:`close` (the application stops), which then stops it."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._closing = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._retry(), name=f"anarchon start of {scheduler.instance_id}"
        )

    @property
    def given_up(self) -> bool:
        """Whether the start is tried no more (the application stops, or its server does)."""
        return self._closing.is_set()

    def give_up(self) -> None:
        """Try no more (the server's stop signal): a start under way is let finish, then
        stopped at once rather than claiming until the application's shutdown."""
        self._closing.set()

    async def _retry(self) -> None:
        wait = RETRY_MIN_S
        while True:
            # Woken at once by close() or give_up(): a start already under way is let finish,
            # then stopped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), wait)
            if self._closing.is_set():
                return
            try:
                await self.scheduler.start()
            except BackendUnavailable as exc:
                wait = min(wait * 2, RETRY_MAX_S)
                _log_failed(self.scheduler, exc, wait)
                continue
            except Exception:
                # Not a backend out of reach (the start got further, then failed): a scheduler
                # starts once, so nothing is left to try; the application goes on without it.
                logger.exception(
                    "scheduler %s could not start; the application goes on without it",
                    self.scheduler.instance_id,
                    extra=log_fields(Action.START_FAILED),
                )
            else:
                if self._closing.is_set():  # the server's stop signal came during the start
                    await self.scheduler.stop()
            return

    async def close(self) -> None:
        """Stop retrying, and stop the scheduler if it started (draining as ``stop()`` does)."""
        self._closing.set()
        await asyncio.wait([self._task])
        await self.scheduler.stop()


class _EarlyStop:
    """Begins the scheduler's stop at the server's stop signal (SIGINT, SIGTERM) by chaining
    the handler the server installed (uvicorn's, in the main thread, before the lifespan starts);
    the lifespan's shutdown then waits for that same stop. A scheduler whose start is still
    being retried (``retrying``) is not started after the signal. Nothing is taken where the
    server installed no handler of its own, nor outside the main thread (a test client's)."""

    def __init__(self, scheduler: Scheduler, retrying: _Retrying | None = None) -> None:
        self.scheduler = scheduler
        self._retrying = retrying
        self._loop = asyncio.get_running_loop()
        self._taken: dict[signal.Signals, Any] = {}
        self._mine: dict[signal.Signals, Any] = {}
        self._stopping: asyncio.Task[None] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if not callable(previous) or previous is signal.default_int_handler:
                continue  # the server stops on it in no graceful way of its own: leave it
            self._taken[sig] = previous
            self._mine[sig] = self._chained(previous)
            signal.signal(sig, self._mine[sig])

    def _chained(self, previous: Callable[[int, FrameType | None], Any]) -> Any:
        def handle(signum: int, frame: FrameType | None) -> None:
            # On the main thread, between two steps of the event loop it runs: the stop is
            # begun by the loop, the server's handler called as before.
            with contextlib.suppress(RuntimeError):  # the loop closed (a shutdown skipped)
                self._loop.call_soon_threadsafe(self._begin, signal.Signals(signum).name)
            previous(signum, frame)

        return handle

    def _begin(self, name: str) -> None:
        if self._stopping is not None:
            return
        if not self.scheduler.running:
            if self._retrying is not None and not self._retrying.given_up:
                logger.info(
                    "%s: the server stops; scheduler %s, whose start was being retried, "
                    "is not started",
                    name,
                    self.scheduler.instance_id,
                    extra=log_fields(Action.SIGNAL, signal=name),
                )
                self._retrying.give_up()
            return
        logger.info(
            "%s: the server stops; the scheduler stops claiming and drains now (grace_ms=%d)",
            name,
            self.scheduler.grace_ms,
            extra=log_fields(Action.SIGNAL, signal=name),
        )
        self._stopping = self._loop.create_task(self.scheduler.stop())
        # Its failure is raised to the lifespan's own stop() call and logged there.
        self._stopping.add_done_callback(lambda task: task.cancelled() or task.exception())

    def restore(self) -> None:
        """Give each signal back the server's handler (unless someone replaced ours since)."""
        for sig, previous in self._taken.items():
            if signal.getsignal(sig) is self._mine[sig]:
                signal.signal(sig, previous)


def _log_failed(scheduler: Scheduler, exc: BaseException, retry_s: float) -> None:
    logger.error(
        "scheduler %s could not start: %s; the application starts without it and the start "
        "is tried again in %g s",
        scheduler.instance_id,
        redact_url(str(exc)),
        retry_s,
        extra=log_fields(Action.START_FAILED, retry_s=retry_s),
    )


def _scheduler_of(given: Scheduler | Callable[[], Scheduler]) -> Scheduler:
    if isinstance(given, Scheduler):
        return given
    made = given()
    if not isinstance(made, Scheduler):
        raise InvalidOption(
            f"the scheduler function {given!r} returned {made!r}, not an anarchon Scheduler"
        )
    return made
