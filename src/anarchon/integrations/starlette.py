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

Starlette is not imported here: the lifespan is the plain ASGI shape that Starlette, FastAPI and
any framework taking ``lifespan=`` accept.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from anarchon import InvalidOption, Scheduler

__all__ = ["lifespan"]


def lifespan(
    scheduler: Scheduler | Callable[[], Scheduler],
    app_lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """A lifespan that runs ``scheduler`` while the application runs.

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
            await instance.start()
            stack.push_async_callback(instance.stop)
            yield state

    return run


def _scheduler_of(given: Scheduler | Callable[[], Scheduler]) -> Scheduler:
    if isinstance(given, Scheduler):
        return given
    made = given()
    if not isinstance(made, Scheduler):
        raise InvalidOption(
            f"the scheduler function {given!r} returned {made!r}, not an anarchon Scheduler"
        )
    return made
