"""``anarchon history`` and ``anarchon next``: a job's runs as the backend recorded them, newest
first, and the fire times a cron expression has ahead (no backend needed)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from .._job import check_name
from .._json import run_json
from .._models import Run
from .._readable import iso, ms_of
from .._redact import redact_url
from .._schedule import CronSchedule
from .._times import LATEST_MS
from .common import EXIT_OK, no_data, opened, storage_checked
from .output import say, table


def _row(run: Run) -> list[str]:
    """One run as a row of ``anarchon history``'s table (its header: :func:`history`)."""

    def when(moment: datetime | None) -> str:
        """A moment in UTC to the millisecond, or ``-`` for none."""
        if moment is None:
            return "-"
        # With its offset (Z), as one word: a slot copied from here into explain reads back
        # as the same instant (a time without an offset would be read in the job's zone).
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    # Masked as --json masks it: a secret in a URL (stored by an earlier version or another
    # writer: the scheduler masks its own) is not printed.
    note = redact_url(run.error or run.reason or "")
    if run.requested_by:
        note = f"{note} (asked by {run.requested_by})".lstrip()
    duration = f"{run.duration:.3f}s" if run.duration is not None else "-"
    return [
        when(run.started_at),
        when(run.slot) if run.slot else "manual",
        run.status.value,
        run.trigger.value,
        str(run.attempt),
        str(run.fence or "-"),
        run.instance,
        duration,
        note,
    ]


async def history(args: argparse.Namespace) -> int:
    """``anarchon history JOB``: the job's last ``-n`` runs, newest first, as a table or JSON."""
    check_name(args.job)  # as Scheduler.history does: one answer whatever the backend
    async with opened(args.backend, registry=False) as backend:
        runs = await backend.history(args.job, limit=args.n)
        if not runs and not storage_checked(backend):
            store = backend.registry()
            if store is not None and not await store.exists():
                raise no_data(backend, ": no scheduler recorded itself and no runs are recorded")
        name = redact_url(repr(backend))
    if args.json:
        print(
            json.dumps(
                {"backend": name, "job": args.job, "runs": [run_json(r) for r in runs]}, indent=2
            )
        )
        return EXIT_OK
    if not runs:
        say(f"no runs of {args.job!r} recorded in {name}")
        return EXIT_OK
    header = [
        "started (UTC)",
        "slot (UTC)",
        "status",
        "trigger",
        "attempt",
        "fence",
        "instance",
        "took",
        "error / reason",
    ]
    # Nothing cut: the error or reason, last, runs on past 100 columns; one line per run.
    say("\n".join(table(header, [_row(run) for run in runs], floors=None)))
    return EXIT_OK


def next_times(args: argparse.Namespace) -> int:
    """Print the next ``-n`` fire times, each as soon as it is found; those past the times
    anarchon handles (9998) are left out, and a line on stderr says so."""
    schedule = CronSchedule(args.expression, args.tz)
    slot = ms_of(datetime.now(UTC))
    for count in range(args.n):
        try:
            slot = schedule.next_slot(slot)
        except (OverflowError, StopIteration):  # the walk ran past the end of the calendar
            slot = LATEST_MS + 1
        if slot > LATEST_MS:
            say(
                f"anarchon next: printed {count} of the {args.n} fire times asked: the times "
                f"anarchon handles end at {iso(LATEST_MS + 1)}",
                file=sys.stderr,
            )
            break
        say(datetime.fromtimestamp(slot / 1000, schedule.zone).isoformat())
    return EXIT_OK
