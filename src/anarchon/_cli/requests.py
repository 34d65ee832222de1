"""``anarchon requests`` and ``anarchon cancel``: the run requests (triggers and retries) that
wait for an instance to claim them, and cancelling them (:mod:`anarchon.steering`)."""

from __future__ import annotations

import argparse
import json
from typing import Final

from .. import steering
from .._readable import iso, span
from .._redact import redact_url
from ..control import RunRequest
from ..errors import ConfigurationError
from ..steering import Cancellation, request_dict
from .common import EXIT_FAILED, EXIT_NO_DATA, EXIT_OK, EXIT_USAGE, Exit, opened
from .output import say, shown, table
from .steer import by_of, check_job

REQUEST_FLOORS: Final = (10, 7, 32, 20, 12, 8)
"""How narrow each column of ``anarchon requests`` may be cut (job, kind, id, requested, by,
due): the id and the times whole."""


def _due(request: RunRequest, now_ms: int) -> str:
    """When it is due, short: ``in 9m``, ``now``, or ``late 2m`` (due and not claimed for
    more than 5 s: no live instance carries the job, or none has a free thread)."""
    if request.due_ms > now_ms:
        return f"in {span(request.due_ms - now_ms)}"
    late = now_ms - request.due_ms
    return f"late {span(late)}" if late > 5_000 else "now"


async def requests(args: argparse.Namespace) -> int:
    """``anarchon requests [--job JOB] [--json]``: the pending run requests, due first."""
    if args.job is not None:
        check_job(args.job, "requests")
    async with opened(args.backend, registry=True) as backend:
        now = await steering.backend_now_ms(backend)
        found = await steering.pending_requests(backend, args.job)
        name = redact_url(repr(backend))
    if args.json:
        shape = {"backend": name, "now_ms": now, "requests": [request_dict(r) for r in found]}
        print(json.dumps(shape, indent=2))
        return EXIT_OK
    if not found:
        of = "" if args.job is None else f" of job {args.job!r}"
        say(f"no pending run requests{of} in {name}")
        return EXIT_OK
    header = ["job", "kind", "id", "requested (UTC)", "by / why", "due"]
    rows = [
        [r.job, r.kind, r.id, iso(r.requested_at_ms), r.requested_by, _due(r, now)] for r in found
    ]
    say("\n".join(table(header, rows, REQUEST_FLOORS)))
    say("\n'anarchon cancel ID' cancels one; 'anarchon cancel --job JOB' every one of a job")
    return EXIT_OK


def _said(done: Cancellation) -> str:
    request, run = done.request, done.run
    what = f"{request.kind} {request.id} of job {shown(request.job)!r}"
    if done.cancelled:
        return f"cancelled {what} (asked by {shown(request.requested_by)})"
    return (
        f"too late to cancel {what}: instance {shown(run.instance)} claimed it first (run "
        f"{run.run_id}, {run.status.value}; 'anarchon history {shown(request.job)}' shows it)"
    )


async def cancel(args: argparse.Namespace) -> int:
    """``anarchon cancel ID|--job JOB [--by WHO] [--json]``: exit 0 when every request named is
    cancelled, 1 when one had been claimed first (it runs), 3 when no pending request has the
    ID."""
    if (args.request is None) == (args.job is None):
        raise Exit(EXIT_USAGE, "anarchon cancel: give a request ID or --job JOB, one of the two")
    if args.request is not None:
        try:
            steering.check_request_id(args.request)
        except ConfigurationError as exc:
            raise Exit(EXIT_USAGE, f"anarchon cancel: {exc}") from None
    if args.job is not None:
        check_job(args.job, "cancel")
    by = by_of(args, "cancel")
    async with opened(args.backend, registry=True) as backend:
        pending = await steering.pending_requests(backend, args.job)
        chosen = pending if args.job is not None else [r for r in pending if r.id == args.request]
        if not chosen and args.request is not None:
            raise Exit(
                EXIT_NO_DATA,
                f"anarchon cancel: no pending run request {args.request}: it was claimed "
                "already (the run has its id), cancelled, or never stored; 'anarchon requests' "
                "lists the pending ones",
            )
        done = await steering.cancel_requests(backend, chosen, by=by)
        name = redact_url(repr(backend))
    code = EXIT_OK if all(c.cancelled for c in done) else EXIT_FAILED
    if args.json:
        shape = {"backend": name, "requests": [c.to_dict() for c in done]}
        print(json.dumps(shape, indent=2))
        return code
    if not done:
        say(f"no pending run requests of job {args.job!r} in {name}")
    for each in done:
        say(_said(each))
    return code
