"""Steer the cluster from anywhere with the backend's URL: pause, resume and trigger jobs.

These functions need no scheduler and no handler in the calling process: they write to the
backend's :class:`~anarchon.control.ControlStore`, and every instance that carries the job acts
on it (a pause inside its next claim, a trigger within about a second).
:class:`~anarchon.Scheduler`'s ``pause``, ``resume`` and ``trigger`` and the ``anarchon pause``,
``resume`` and ``trigger`` commands call them. The backend must be started.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from typing import Final

from ._job import check_name
from ._models import Trigger
from ._options import check_label
from ._times import check_until_ms
from .backend import Backend
from .control import ALL_JOBS, ControlStore, Pause, RunRequest
from .errors import UnsupportedFeature

__all__ = [
    "MAX_BY",
    "backend_now_ms",
    "check_by",
    "control_of",
    "pause",
    "pauses",
    "requester",
    "resume",
    "take_pause",
    "trigger",
]


MAX_BY: Final = 256
"""The longest ``by`` (who paused or asked), as the longest ``instance_id``."""


def requester() -> str:
    """Who is asking, as recorded by default: ``user@host`` (``$ANARCHON_REQUESTER`` if set,
    which must follow :func:`check_by`'s rule)."""
    named = os.environ.get("ANARCHON_REQUESTER")
    if named:
        return check_label("$ANARCHON_REQUESTER", named, MAX_BY)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's random user)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def check_by(by: object) -> str:
    """``by`` if it is a non-empty, printable string of at most :data:`MAX_BY` characters;
    :func:`requester` when it is None; else :class:`~anarchon.errors.InvalidOption` naming it
    (an empty one is refused, not replaced)."""
    if by is None:
        return requester()
    return check_label("by", by, MAX_BY)


def control_of(backend: Backend) -> ControlStore:
    """The backend's control store; :class:`~anarchon.errors.UnsupportedFeature` if it has
    none."""
    store = backend.control()
    if store is None:
        raise UnsupportedFeature(
            f"the {backend.name} backend keeps no pauses or run requests (its control() is "
            "None): its jobs cannot be paused, resumed, triggered or retried from outside"
        )
    return store


async def backend_now_ms(backend: Backend) -> int:
    """The backend's clock now (epoch ms), or this host's when the backend cannot tell."""
    now = await backend.server_time_ms()
    return now if now is not None else int(time.time() * 1000)


def _check_job(job: str) -> None:
    if job != ALL_JOBS:
        check_name(job)


async def pause(
    backend: Backend, job: str, *, until_ms: int | None = None, by: str | None = None
) -> Pause:
    """Pause ``job`` (or every job: :data:`~anarchon.control.ALL_JOBS`) on every instance until
    :func:`resume`, or until ``until_ms`` (epoch ms, in the future and at most ten years ahead)
    passes; return the stored pause. Runs already running are not touched; manual runs still
    run. A bad ``until_ms`` raises :class:`~anarchon.errors.InvalidOption` and stores
    nothing."""
    _check_job(job)
    who = check_by(by)
    now = await backend_now_ms(backend)
    if until_ms is not None:
        until_ms = check_until_ms(until_ms, now)
    stored = Pause(job=job, by=who, at_ms=now, until_ms=until_ms)
    await control_of(backend).pause(stored)
    return stored


async def take_pause(backend: Backend, job: str) -> tuple[Pause | None, int]:
    """Remove the stored pause of ``job`` (or of :data:`~anarchon.control.ALL_JOBS`), whether
    it still held or had ended by itself; return it (None: none was stored) and the backend's
    clock just before (:meth:`~anarchon.control.Pause.active` at that time tells which)."""
    _check_job(job)
    now = await backend_now_ms(backend)
    return await control_of(backend).resume(job), now


async def resume(backend: Backend, job: str) -> Pause | None:
    """End the pause of ``job`` (or of :data:`~anarchon.control.ALL_JOBS`); return it, or None
    if it was not paused: no pause was stored, or the stored one had ended by itself (it is
    removed all the same). A job paused on its own stays paused when the cluster is
    resumed."""
    taken, now = await take_pause(backend, job)
    return taken if taken is not None and taken.active(now) else None


async def pauses(backend: Backend) -> list[Pause]:
    """The pauses that hold now (expired ones left out), by job name."""
    now = await backend_now_ms(backend)
    held = [p for p in await control_of(backend).pauses() if p.active(now)]
    return sorted(held, key=lambda p: p.job)


async def trigger(backend: Backend, job: str, *, by: str | None = None) -> RunRequest:
    """Ask the cluster to run ``job`` once now; return the stored request. An instance that
    carries the job claims it within about a second and exactly one runs it; its history shows
    trigger ``manual``, the request's id as the run id, and ``by`` as ``requested_by``."""
    check_name(job)
    who = check_by(by)
    now = await backend_now_ms(backend)
    request_id = uuid.uuid4().hex
    request = RunRequest(
        id=request_id,
        job=job,
        trigger=Trigger.MANUAL,
        key=f"manual-{request_id}",
        slot=None,
        due_ms=now,
        requested_by=who,
        requested_at_ms=now,
    )
    await control_of(backend).request(request)
    return request
