"""``anarchon explain``, ``pause``, ``resume`` and ``trigger``: one slot's fate, and steering the
cluster through the backend's control store (:mod:`anarchon.steering`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Final

from .. import steering
from .._job import check_name
from .._readable import DAY_MS
from .._redact import redact_url
from .._times import (
    ANY_ZONE,
    EVERY_ZONE,
    PAUSE_HORIZON_MS,
    Written,
    check_readable,
    check_until_ms,
    no_carrier,
    parse_time,
)
from ..backend import Backend
from ..control import ALL_JOBS, RunRequest
from ..errors import ConfigurationError
from ..explain import SlotFate
from ..explain import explain as explain_slot
from ..registry import (
    ClusterView,
    build_view,
    carrier_warning,
    read_instances,
    trigger_refusal,
)
from .cluster import moment, pause_json
from .common import EXIT_NO_DATA, EXIT_OK, EXIT_USAGE, Exit, opened
from .output import say, shown


async def _view(backend: Backend, now_ms: int) -> ClusterView:
    store = backend.registry()
    assert store is not None  # opened(registry=True) checked it
    return build_view(await read_instances(store, now_ms), now_ms)


def _warn(text: str) -> None:
    say(f"anarchon: warning: {text}", file=sys.stderr)


def _warn_uncarried(view: ClusterView, job: str, action: str) -> None:
    warning = carrier_warning(view, job, action)
    if warning is not None:
        _warn(warning)


async def _carried_or_warn(backend: Backend, job: str, action: str) -> None:
    if job != ALL_JOBS:
        _warn_uncarried(await _view(backend, await steering.backend_now_ms(backend)), job, action)


async def explain(args: argparse.Namespace) -> int:
    """``anarchon explain JOB SLOT [--json]``."""
    check_job(args.job, "explain")
    written = _check_time(args.slot, "explain", what="SLOT")
    async with opened(args.backend, registry=True) as backend:
        now_ms = await steering.backend_now_ms(backend)
        view = await _view(backend, now_ms)
        definitions = view.definitions.get(args.job)
        if not definitions:
            raise Exit(
                EXIT_NO_DATA,
                f"anarchon explain: no live instance carries job {args.job!r}, so its schedule "
                f"is unknown (live jobs: {', '.join(view.definitions) or 'none'}); "
                f"'anarchon history {args.job}' shows its records",
            )
        slot = written.read(definitions[0].zone)
        fate = await explain_slot(backend, args.job, slot.ms, view=view, now_ms=now_ms)
    if slot.note is not None:
        fate = replace(fate, notes=(slot.note, *fate.notes))
    if args.json:
        print(json.dumps(fate.to_dict(), indent=2))
    else:
        say(_shown_fate(fate).describe())
    return EXIT_OK


def _shown_fate(fate: SlotFate) -> SlotFate:
    """``fate`` with every text read from the backend shown safely (:func:`.output.shown`), so
    :meth:`~anarchon.explain.SlotFate.describe` keeps an attempt to its row and a newline in
    an error visible; errors and reasons with every secret in a URL masked, as ``--json``
    shows them."""

    def maybe(text: str | None) -> str | None:
        return None if text is None else shown(text)

    def masked(text: str | None) -> str | None:
        return None if text is None else shown(redact_url(text))

    attempts = tuple(
        replace(
            a,
            instance=shown(a.instance),
            error=masked(a.error),
            reason=masked(a.reason),
            requested_by=maybe(a.requested_by),
        )
        for a in fate.attempts
    )
    pause = None if fate.pause is None else replace(fate.pause, by=shown(fate.pause.by))
    return replace(
        fate,
        definition=replace(fate.definition, zone=shown(fate.definition.zone)),
        reason=masked(fate.reason),
        attempts=attempts,
        instances=tuple(map(shown, fate.instances)),
        pause=pause,
        notes=tuple(map(shown, fate.notes)),
    )


async def pause(args: argparse.Namespace) -> int:
    """``anarchon pause JOB|--all [--until TIME] [--by WHO]``: ``--until`` is parsed once,
    checked before the backend is opened, and read in the job's zone on the backend's clock
    from the one registry read that also tells whether an instance carries the job."""
    job = _job_or_all(args, "pause")
    by = by_of(args, "pause")
    until = None if args.until is None else _until_of(args.until, job)
    async with opened(args.backend, registry=True) as backend:
        now = await steering.backend_now_ms(backend)
        view = None if job == ALL_JOBS else await _view(backend, now)
        until_ms = None if until is None else _until_ms(until, job, view, now)
        stored = await steering.pause(backend, job, until_ms=until_ms, by=by)
    if view is not None:
        _warn_uncarried(view, job, "pause")
    if args.json:
        print(json.dumps(pause_json(stored), indent=2))
        return EXIT_OK
    what = "every job" if job == ALL_JOBS else f"job {job!r}"
    end = "until resumed" if stored.until_ms is None else f"until {moment(stored.until_ms)}"
    say(f"paused {what} on every instance, {end} (by {shown(stored.by)})")
    return EXIT_OK


async def resume(args: argparse.Namespace) -> int:
    """``anarchon resume JOB|--all``: end the job's pause, or (``--all``) the whole-cluster
    pause; a job paused on its own stays paused then, and each such job is named."""
    job = _job_or_all(args, "resume")
    async with opened(args.backend, registry=True) as backend:
        taken, now = await steering.take_pause(backend, job)
        held = [
            p for p in await steering.pauses(backend) if job == ALL_JOBS or p.job in (ALL_JOBS, job)
        ]
    ended = taken if taken is not None and taken.active(now) else None
    if args.json:
        print(
            json.dumps(
                {"resumed": pause_json(ended), "still_paused": [pause_json(p) for p in held]},
                indent=2,
            )
        )
        return EXIT_OK
    what = "the whole cluster" if job == ALL_JOBS else f"job {job!r}"
    if taken is not None and ended is None:
        ended_at = moment(taken.until_ms)
        say(f"{what} was not paused: its pause by {shown(taken.by)} ended at {ended_at}")
    elif ended is None:
        say(f"{what} was not paused")
    elif job == ALL_JOBS:
        since = moment(ended.at_ms)
        say(f"ended the whole-cluster pause (paused by {shown(ended.by)} since {since})")
    else:
        say(f"resumed {what} (paused by {shown(ended.by)} since {moment(ended.at_ms)})")
    for other in held:
        scope = "the whole cluster" if other.job == ALL_JOBS else f"job {other.job!r}"
        command = "anarchon resume " + ("--all" if other.job == ALL_JOBS else shown(other.job))
        say(f"note: {scope} is still paused by {shown(other.by)} ('{command}' ends it)")
    return EXIT_OK


async def trigger(args: argparse.Namespace) -> int:
    """``anarchon trigger JOB [--by WHO] [--force]``: print the request id (the run's id). A
    job that no instance in the registry carries, live or silent, is refused (exit 2) unless
    ``--force``: the request would wait until such a job is deployed."""
    check_job(args.job, "trigger")
    by = by_of(args, "trigger")
    async with opened(args.backend, registry=True) as backend:
        if not args.force:
            await _known_or_refuse(backend, args.job)
        request: RunRequest = await steering.trigger(backend, args.job, by=by)
        await _carried_or_warn(backend, args.job, "trigger")
    if args.json:
        print(json.dumps(request.to_dict(), indent=2))
    else:
        say(request.id)
    return EXIT_OK


async def _known_or_refuse(backend: Backend, job: str) -> None:
    """Exit 2 unless an instance recorded in the registry carries ``job``
    (:func:`anarchon.registry.trigger_refusal`, the dashboard's rule too)."""
    store = backend.registry()
    assert store is not None  # opened(registry=True) checked it
    refusal = await trigger_refusal(store, job)
    if refusal is not None:
        raise Exit(EXIT_USAGE, f"anarchon trigger: {refusal}; --force stores it anyway")


def by_of(args: argparse.Namespace, command: str) -> str:
    """``--by`` (or its default) by :func:`anarchon.steering.check_by`'s rule, checked before
    the backend is opened: a bad one is a bad command line (exit 2)."""
    try:
        return steering.check_by(args.by)
    except ConfigurationError as exc:
        flag = "--" if args.by is not None else ""
        raise Exit(EXIT_USAGE, f"anarchon {command}: {flag}{exc}") from None


def _job_or_all(args: argparse.Namespace, command: str) -> str:
    if args.all and args.job:
        raise Exit(EXIT_USAGE, f"anarchon {command}: give a JOB or --all, not both")
    if not args.all and not args.job:
        raise Exit(EXIT_USAGE, f"anarchon {command}: give a JOB, or --all for every job")
    if args.all:
        return ALL_JOBS
    job: str = args.job
    if job == ALL_JOBS:
        raise Exit(EXIT_USAGE, f"anarchon {command}: use --all, not '*', for every job")
    check_job(job, command)
    return job


def _until_of(text: str, job: str) -> Written:
    """``--until`` parsed once, and refused (exit 2, naming the value and the rule) before the
    backend is opened when it is no time, plainly past or more than 10 years ahead
    (:func:`_check_until_here`), or, for ``--all``, a time without an offset."""
    if text.strip().startswith("-"):
        # No end before now is a pause's end.
        raise Exit(
            EXIT_USAGE,
            f"anarchon pause: --until {text!r} is in the past: a pause ends at a later "
            "time, a duration counts from now without a sign (30m, 2h, 1d, 1h30m), or leave "
            "--until out to pause until resumed",
        )
    zones = (None,) if job == ALL_JOBS else ANY_ZONE
    until = _check_time(text, "pause", what="--until", durations=True, zones=zones)
    _check_until_here(until)
    return until


def _until_ms(until: Written, job: str, view: ClusterView | None, now_ms: int) -> int:
    """The pause's end: ``until`` read in the zone of the definition most live instances in
    ``view`` carry (none for ``--all`` or a job no one carries: a time without an offset is
    refused then) on the backend's clock ``now_ms``."""
    definitions = None if view is None else view.definitions.get(job)
    zone = definitions[0].zone if definitions else None
    no_zone = EVERY_ZONE if job == ALL_JOBS else no_carrier(job)
    until_ms = until.read(zone, now_ms=now_ms, no_zone=no_zone).ms
    return check_until_ms(until_ms, now_ms, what=f"--until {until.text!r}")


def _check_time(
    text: str,
    command: str,
    *,
    what: str,
    durations: bool = False,
    zones: tuple[str | None, ...] = ANY_ZONE,
) -> Written:
    """``text`` parsed (:func:`~anarchon._times.parse_time`). A time the command could read in
    no zone (``notatime``, a date the calendar lacks, one out of range whatever the zone) is a
    bad command line (exit 2, naming the value and the rule), told before the backend is
    opened: not "no live instance carries the job" (exit 3) nor an unreachable backend (exit
    4). The zone of the job and the backend's clock are read later; what only they decide is
    checked then."""
    now_ms = int(time.time() * 1000) if durations else None
    try:
        written = parse_time(text, what=what, durations=durations)
        check_readable(written, what=what, now_ms=now_ms, zones=zones)
    except ConfigurationError as exc:
        raise Exit(EXIT_USAGE, f"anarchon {command}: {exc}") from None
    return written


def check_job(job: str, command: str) -> None:
    """A bad job name is a bad command line (exit 2, naming the rule), told before the backend
    is opened: not "no live instance carries it" (exit 3) nor "no anarchon data"."""
    try:
        check_name(job)
    except ConfigurationError as exc:
        raise Exit(EXIT_USAGE, f"anarchon {command}: {exc}") from None


#: How far apart this host's clock and the backend's may be: a ``--until`` that is past, or
#: beyond the 10-year horizon, by more than this on this host's clock is a bad command line told
#: before the backend is opened; one within it is judged on the backend's clock, once read.
CLOCK_MARGIN_MS: Final = DAY_MS


def _check_until_here(until: Written) -> None:
    """A pause end plainly past or more than 10 years ahead (on this host's clock, give or take
    :data:`CLOCK_MARGIN_MS`) is a bad command line (exit 2, naming the value and the rule), told
    before the backend is opened: not an unreachable backend (exit 4)."""
    now_ms = int(time.time() * 1000)
    try:
        # Without an offset the time is the job's zone's, not yet known here (the registry is
        # read once the backend is open): read in UTC, it is at most 14 h off, inside the margin.
        until_ms = until.read("UTC", now_ms=now_ms).ms
    except ConfigurationError:
        return  # _check_time told it
    if now_ms - CLOCK_MARGIN_MS < until_ms <= now_ms + PAUSE_HORIZON_MS + CLOCK_MARGIN_MS:
        return
    try:
        check_until_ms(until_ms, now_ms, what=f"--until {until.text!r}", clock="this host's clock")
    except ConfigurationError as exc:
        raise Exit(EXIT_USAGE, f"anarchon pause: {exc}") from None
