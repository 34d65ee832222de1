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
from .._readable import iso
from .._times import check_until_ms, parse_time_ms
from ..backend import Backend
from ..control import ALL_JOBS, RunRequest
from ..errors import ConfigurationError
from ..explain import SlotFate
from ..explain import explain as explain_slot
from ..registry import ClusterView, build_view, carrier_warning, read_instances
from .cluster import pause_json
from .common import EXIT_NO_DATA, EXIT_OK, EXIT_USAGE, Exit, opened
from .output import say, shown


async def _view(backend: Backend, now_ms: int) -> ClusterView:
    store = backend.registry()
    assert store is not None  # opened(registry=True) checked it
    return build_view(await read_instances(store, now_ms), now_ms)


def _warn(text: str) -> None:
    say(f"anarchon: warning: {text}", file=sys.stderr)


async def _carried_or_warn(backend: Backend, job: str, action: str) -> None:
    if job == ALL_JOBS:
        return
    view = await _view(backend, await steering.backend_now_ms(backend))
    warning = carrier_warning(view, job, action)
    if warning is not None:
        _warn(warning)


async def explain(args: argparse.Namespace) -> int:
    """``anarchon explain JOB SLOT [--json]``."""
    _check_job(args.job, "explain")
    _check_time(args.slot, "explain", what="SLOT")
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
        slot_ms = parse_time_ms(args.slot, definitions[0].zone, what="SLOT")
        fate = await explain_slot(backend, args.job, slot_ms, view=view, now_ms=now_ms)
    if args.json:
        print(json.dumps(fate.to_dict(), indent=2))
    else:
        say(_shown_fate(fate).describe())
    return EXIT_OK


def _shown_fate(fate: SlotFate) -> SlotFate:
    """``fate`` with every text read from the backend shown safely (:func:`.output.shown`), so
    :meth:`~anarchon.explain.SlotFate.describe` keeps an attempt to its row and a newline in
    an error visible."""

    def maybe(text: str | None) -> str | None:
        return None if text is None else shown(text)

    attempts = tuple(
        replace(
            a,
            instance=shown(a.instance),
            error=maybe(a.error),
            reason=maybe(a.reason),
            requested_by=maybe(a.requested_by),
        )
        for a in fate.attempts
    )
    pause = None if fate.pause is None else replace(fate.pause, by=shown(fate.pause.by))
    return replace(
        fate,
        definition=replace(fate.definition, zone=shown(fate.definition.zone)),
        reason=maybe(fate.reason),
        attempts=attempts,
        instances=tuple(map(shown, fate.instances)),
        pause=pause,
        notes=tuple(map(shown, fate.notes)),
    )


async def pause(args: argparse.Namespace) -> int:
    """``anarchon pause JOB|--all [--until TIME] [--by WHO]``."""
    job = _job_or_all(args, "pause")
    by = _by(args, "pause")
    if args.until is not None and args.until.strip().startswith("-"):
        # Checked before the backend is opened: no end before now is a pause's end.
        raise Exit(
            EXIT_USAGE,
            f"anarchon pause: --until {args.until!r} is in the past: a pause ends at a later "
            "time, a duration counts from now without a sign (30m, 2h, 1d, 1h30m), or leave "
            "--until out to pause until resumed",
        )
    if args.until is not None:
        _check_time(args.until, "pause", what="--until", durations=True)
    async with opened(args.backend, registry=True) as backend:
        until_ms = None
        if args.until is not None:
            now = await steering.backend_now_ms(backend)
            until_ms = parse_time_ms(args.until, what="--until", now_ms=now)
            until_ms = check_until_ms(until_ms, now, what=f"--until {args.until!r}")
        stored = await steering.pause(backend, job, until_ms=until_ms, by=by)
        await _carried_or_warn(backend, job, "pause")
    if args.json:
        print(json.dumps(pause_json(stored), indent=2))
        return EXIT_OK
    what = "every job" if job == ALL_JOBS else f"job {job!r}"
    until = "until resumed" if stored.until_ms is None else f"until {iso(stored.until_ms)}"
    say(f"paused {what} on every instance, {until} (by {shown(stored.by)})")
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
        say(f"{what} was not paused: its pause by {shown(taken.by)} ended at {iso(taken.until_ms)}")
    elif ended is None:
        say(f"{what} was not paused")
    elif job == ALL_JOBS:
        say(f"ended the whole-cluster pause (paused by {shown(ended.by)} since {iso(ended.at_ms)})")
    else:
        say(f"resumed {what} (paused by {shown(ended.by)} since {iso(ended.at_ms)})")
    for other in held:
        scope = "the whole cluster" if other.job == ALL_JOBS else f"job {other.job!r}"
        command = "anarchon resume " + ("--all" if other.job == ALL_JOBS else shown(other.job))
        say(f"note: {scope} is still paused by {shown(other.by)} ('{command}' ends it)")
    return EXIT_OK


async def trigger(args: argparse.Namespace) -> int:
    """``anarchon trigger JOB [--by WHO]``: print the request id (the run's id)."""
    _check_job(args.job, "trigger")
    by = _by(args, "trigger")
    async with opened(args.backend, registry=True) as backend:
        request: RunRequest = await steering.trigger(backend, args.job, by=by)
        await _carried_or_warn(backend, args.job, "trigger")
    if args.json:
        print(json.dumps(request.to_dict(), indent=2))
    else:
        say(request.id)
    return EXIT_OK


def _by(args: argparse.Namespace, command: str) -> str:
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
    _check_job(job, command)
    return job


#: The time zones at the ends of the offsets from UTC: a time read in neither is in no zone.
_EXTREME_ZONES: Final = ("Etc/GMT+12", "Etc/GMT-14")


def _check_time(text: str, command: str, *, what: str, durations: bool = False) -> None:
    """A time the command could read in no zone (``notatime``, a date the calendar lacks, one
    out of range whatever the zone) is a bad command line (exit 2, naming the value and the
    rule), told before the backend is opened: not "no live instance carries the job" (exit 3)
    nor an unreachable backend (exit 4). The zone of the job and the backend's clock are read
    later; what only they decide is checked then."""
    now_ms = int(time.time() * 1000) if durations else None
    errors: list[ConfigurationError] = []
    for zone in ("UTC", *_EXTREME_ZONES):
        try:
            parse_time_ms(text, zone, what=what, now_ms=now_ms)
        except ConfigurationError as exc:
            errors.append(exc)
        else:
            return
    raise Exit(EXIT_USAGE, f"anarchon {command}: {errors[0]}") from None


def _check_job(job: str, command: str) -> None:
    """A bad job name is a bad command line (exit 2, naming the rule), told before the backend
    is opened: not "no live instance carries it" (exit 3) nor "no anarchon data"."""
    try:
        check_name(job)
    except ConfigurationError as exc:
        raise Exit(EXIT_USAGE, f"anarchon {command}: {exc}") from None
