"""Steer the cluster from anywhere with the backend's URL: pause, resume and trigger jobs; list
and cancel pending run requests.

These functions need no scheduler and no handler in the calling process: they write to the
backend's :class:`~anarchon.control.ControlStore`, and every instance that carries the job acts
on it (a pause inside its next claim, a trigger within about a second).
:class:`~anarchon.Scheduler`'s ``pause``, ``resume`` and ``trigger`` and the ``anarchon pause``,
``resume`` and ``trigger`` commands call them. The backend must be started.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._job import check_name
from ._json import run_json
from ._models import Run, RunStatus, SkipCause, Trigger
from ._options import check_label
from ._readable import iso
from ._times import check_until_ms
from .backend import Backend, ClaimRequest
from .control import ALL_JOBS, ControlStore, Pause, RunRequest, cancelled_reason
from .errors import BackendError, InvalidOption, UnsupportedFeature

__all__ = [
    "MAX_BY",
    "Cancellation",
    "backend_now_ms",
    "cancel_requests",
    "check_by",
    "check_request_id",
    "control_of",
    "pause",
    "pauses",
    "pending_requests",
    "request_dict",
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


_REQUEST_ID: Final = re.compile(r"[0-9a-f]{32}")
_CANCEL_BATCH: Final = 1_000


def check_request_id(value: object) -> str:
    """``value`` if it is a run request's id (32 lowercase hex digits, as :func:`trigger` and
    retries make them); else :class:`~anarchon.errors.InvalidOption` naming it and the rule."""
    if isinstance(value, str) and _REQUEST_ID.fullmatch(value):
        return value
    raise InvalidOption(
        f"request id {value!r} is not 32 lowercase hex digits (the id 'anarchon trigger' "
        "printed, or that 'anarchon requests' lists)"
    )


async def pending_requests(backend: Backend, job: str | None = None) -> list[RunRequest]:
    """The run requests (triggers and retries) stored and not yet claimed, of ``job`` or of
    every job, due first. Requests of a job no instance carries are listed too: they wait."""
    if job is not None:
        check_name(job)
    return await control_of(backend).requests(None if job is None else [job])


def request_dict(request: RunRequest) -> dict[str, Any]:
    """A pending request as ``anarchon requests --json`` and the dashboard show it: its stored
    fields, its :attr:`~anarchon.control.RunRequest.kind`, and its times as ISO 8601 (UTC)
    beside the epoch ms (``requested_at``, ``due_at``)."""
    return {
        **request.to_dict(),
        "kind": request.kind,
        "requested_at": iso(request.requested_at_ms),
        "due_at": iso(request.due_ms),
    }


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What became of one run request :func:`cancel_requests` was asked to cancel."""

    request: RunRequest
    """The run request asked to be cancelled."""
    run: Run
    """The record of the request's key as the backend answered the cancellation: its own skip
    record (or an earlier cancellation's), or the run an instance had claimed first."""

    @property
    def cancelled(self) -> bool:
        """True when the request never runs: its key holds a record that is not a run (this
        cancellation's or an earlier one's skip); False when an instance claimed it first."""
        return self.run.status in (RunStatus.SKIPPED, RunStatus.MISSED)

    def to_dict(self) -> dict[str, Any]:
        """The request as :func:`request_dict` shows it, ``cancelled``, and the record of its
        key (``run``) as ``anarchon history --json`` shows a run."""
        return {
            **request_dict(self.request),
            "cancelled": self.cancelled,
            "run": run_json(self.run),
        }


async def cancel_requests(
    backend: Backend, requests: Sequence[RunRequest], *, by: str | None = None
) -> list[Cancellation]:
    """Cancel ``requests`` (read with :func:`pending_requests`): for each, claim its key as
    skipped with the reason ``cancelled by <by>`` (skip cause
    :attr:`~anarchon.SkipCause.CANCELLED`), all in one claim call, then remove the request.

    The backend decides the race with an instance that read the request just before as it
    decides any two claims of one key: a cancellation recorded first means no claim of the
    key ever runs; an instance's claim decided first runs, and its :class:`Cancellation` says
    ``cancelled`` False with that run. A request whose claim the backend could not decide stays
    stored, and the first such error is raised once the others are removed."""
    who = check_by(by)
    if not requests:
        return []
    reason = cancelled_reason(who)
    claims = [
        ClaimRequest(
            job=r.job,
            slot=r.slot,
            run_id=r.id,
            token=uuid.uuid4().hex,
            instance=who,
            trigger=r.trigger,
            key=r.key,
            skip_reason=reason,
            skip_cause=SkipCause.CANCELLED,
            skip_status=RunStatus.SKIPPED,
            requested_by=r.requested_by,
        )
        for r in requests
    ]
    store = control_of(backend)
    outcomes = []
    for at in range(0, len(claims), _CANCEL_BATCH):  # a backend takes up to 2 000 a call
        outcomes += await backend.claim(claims[at : at + _CANCEL_BATCH])
    out: list[Cancellation] = []
    failed: BackendError | None = None
    for request, outcome in zip(requests, outcomes, strict=True):
        if outcome.error is not None:
            failed = failed or outcome.error
            continue
        await store.done(request.id)
        out.append(Cancellation(request, outcome.run))
    if failed is not None:
        raise failed
    return out
