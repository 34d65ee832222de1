"""The operators' actions, what the dashboard changes in the cluster: pause, resume, trigger (a
manual run, refused for a job no instance carries unless forced) and cancel (pending run
requests). Each says what it did in the words the page shows; the message returns to the page
the action came from, sealed in its address (:data:`MESSAGE`).

Who may act (an operator, with the page's CSRF token) is the route's to check (``_app``), and
``_auth``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request

from .. import steering
from ..backend import Backend
from ..control import ALL_JOBS, RunRequest
from ..registry import trigger_refusal
from ._replies import client_of

__all__ = [
    "FORCE_TEXT",
    "MESSAGE",
    "MESSAGES",
    "Refused",
    "cancelled",
    "forced",
    "job_words",
    "paused",
    "refusal_of",
    "resumed",
    "triggered",
    "without_messages",
]

logger = logging.getLogger("anarchon.web")

#: How the refusal of a Trigger names its force: the job page's button, and the form field.
FORCE_TEXT: Final = "'Trigger anyway' (the form field force=1)"
#: The query parameter that carries an action's sealed message to the page it returns to.
MESSAGE: Final = "msg"
#: Dropped from a page's address when an action returns to it: the sealed message, and the
#: plain ``flash`` and ``warn`` of earlier versions.
MESSAGES: Final = (MESSAGE, "flash", "warn")


class Refused(Exception):
    """An action the cluster's state refuses (409): a Trigger of a job no instance carries."""


def job_words(job: str) -> str:
    """``job`` as an action's message names it: ``every job`` for the whole cluster."""
    return "every job" if job == ALL_JOBS else job


async def paused(backend: Backend, job: str, minutes: int, by: str) -> str:
    """Pause ``job`` (or the whole cluster) for ``minutes`` of the backend's clock (0: until
    resumed) and say so."""
    until = None
    if minutes:
        until = await steering.backend_now_ms(backend) + minutes * 60_000
    await steering.pause(backend, job, until_ms=until, by=by)
    return f"paused {job_words(job)}" + (f" for {minutes} min" if minutes else "")


async def resumed(backend: Backend, job: str) -> str:
    """Resume ``job`` (or the whole cluster) and say so; after the whole-cluster pause ends,
    each job paused on its own (still paused) is named."""
    ended = await steering.resume(backend, job)
    held = await steering.pauses(backend)
    if job != ALL_JOBS:
        done = f"resumed {job}" if ended else f"{job} was not paused on its own"
        cluster = next((p for p in held if p.job == ALL_JOBS), None)
        if cluster is None:
            return done if ended else f"{job} was not paused"
        # As 'anarchon resume JOB' notes: the job's slots stay skipped until the whole-cluster
        # pause ends too; saying only "resumed" would read as if it ran again.
        return f"{done}; it is still paused with every job by {cluster.by} ('Resume all' ends it)"
    done = "ended the whole-cluster pause" if ended else "the whole cluster was not paused"
    own = [p.job for p in held if p.job != ALL_JOBS]
    return done + (f"; still paused on their own: {', '.join(own)}" if own else "")


def forced(form: Mapping[str, str]) -> bool:
    """The Trigger form asks to store the request even for a job no instance carries."""
    return form.get("force", "").strip().lower() in ("1", "true", "on", "yes")


async def refusal_of(backend: Backend, job: str) -> str | None:
    """Why a Trigger of ``job`` is refused (:func:`~anarchon.registry.trigger_refusal`);
    None when it is not, or the backend keeps no registry to tell."""
    store = backend.registry()
    return None if store is None else await trigger_refusal(store, job)


async def triggered(
    request: Request, backend: Backend, job: str, form: Mapping[str, str], by: str
) -> RunRequest:
    """Store a request to run ``job`` once, unless :func:`~anarchon.registry.trigger_refusal`
    refuses it and the form does not force it: :class:`Refused` (409) then, in the words of
    ``anarchon trigger`` (exit 2 there), naming this page's force."""
    refusal = None if forced(form) else await refusal_of(backend, job)
    if refusal is not None:
        message = f"{refusal}; {FORCE_TEXT} stores it anyway"
        logger.warning(
            "dashboard: refused trigger by %s from %s: %s", by, client_of(request), message
        )
        raise Refused(message)
    return await steering.trigger(backend, job, by=by)


async def cancelled(
    backend: Backend, job: str, request_id: str | None, by: str
) -> tuple[str, str | None]:
    """Cancel the pending run request ``request_id`` of ``job`` (None: every one of the job);
    say what was cancelled, and warn about each that an instance had claimed first (it runs)."""
    if request_id is not None:
        steering.check_request_id(request_id)
    pending = await steering.pending_requests(backend, job)
    chosen = [r for r in pending if request_id is None or r.id == request_id]
    if request_id is not None and not chosen:
        gone = f"request {request_id[:8]} of {job} is no longer pending: claimed or cancelled"
        return "nothing cancelled", gone
    outcome = await steering.cancel_requests(backend, chosen, by=by)
    late = [c for c in outcome if not c.cancelled]
    if request_id is None:
        done = f"cancelled {len(outcome) - len(late)} pending request(s) of {job}"
    elif late:
        done = f"could not cancel request {request_id[:8]} of {job}"
    else:
        done = f"cancelled the {chosen[0].kind} request {request_id[:8]} of {job}"
    warning = None
    if late:
        warning = "too late: " + "; ".join(
            f"request {c.request.id[:8]} was claimed first by {c.run.instance} "
            f"(run {c.run.status.value})"
            for c in late
        )
    return done, warning


def without_messages(path: str, query: str) -> str:
    """``path?query`` without an earlier action's message: a form returns to the page it was
    on, and the page's address kept the last action's message, so a warning (``no live
    instance carries job 'x'``) came back under every later action's message."""
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in MESSAGES]
    return path + (f"?{urlencode(kept)}" if kept else "")
