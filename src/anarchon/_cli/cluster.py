"""``anarchon jobs`` and ``anarchon instances``: the registry, each job's last run, what runs
now and the pauses, as tables within 100 columns or one JSON object."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any, Final

from .._json import run_json
from .._models import Run, RunStatus
from .._readable import iso_exact, ms_of, span
from .._redact import redact_url
from ..control import ALL_JOBS, Pause
from ..registry import (
    SILENT_HEARTBEATS,
    ClusterView,
    InstanceRecord,
    JobView,
    build_view,
    describe_jobs,
    read_instances,
)
from ..steering import backend_now_ms
from .common import EXIT_OK, opened
from .output import WIDTH, column_widths, say, shown, table

INSTANCE_FLOORS: Final = (16, 8, 7, 7, 10, 7, 12)
"""How narrow each column of ``anarchon instances`` may be cut to fit a line in 100 columns
(id, host, pid, version, heartbeat, offset, jobs)."""
JOB_FLOORS: Final = (8, 10, 20, 9, 5, 21, 5, 8)
"""The same for ``anarchon jobs`` (job, schedule, next, last run, ago, where, took, running):
the next slot whole (``2026-12-07T08:00:00Z``: pasted into ``explain`` or ``pause --until``
it names that slot), a default instance id whole in ``where`` (``vm-10342-50d1``:
``<host>-<pid>-<4 hex>``), and in ``running`` each attempt and how long it has run
(``#1 59.9s``); the instance of each running attempt is on a line of its own below the
table, whole, and so is that of a last run whose longer id (a Kubernetes pod's) ``where``
cut."""
JOB_HEADER: Final = ("job", "schedule", "next", "last run", "ago", "where", "took", "running")


async def read_cluster(
    url: str | None, *, with_jobs: bool
) -> tuple[str, ClusterView, list[JobView]]:
    """The backend's redacted name, the registry and (``with_jobs``) each job's view."""
    async with opened(url, registry=True) as backend:
        store = backend.registry()
        assert store is not None  # opened() checked it
        now_ms = await backend_now_ms(backend)
        view = build_view(await read_instances(store, now_ms), now_ms)
        jobs = await describe_jobs(backend, view) if with_jobs else []
        return redact_url(repr(backend)), view, jobs


def _instance_json(record: InstanceRecord, now_ms: int) -> dict[str, Any]:
    return {**record.to_dict(), "heartbeat_age_ms": now_ms - record.heartbeat_ms}


async def instances(args: argparse.Namespace) -> int:
    """``anarchon instances [--json]``."""
    name, view, _ = await read_cluster(args.backend, with_jobs=False)
    now = view.now_ms
    if args.json:
        shape = {
            "backend": name,
            "now_ms": now,
            "instances": [_instance_json(i, now) for i in view.instances],
            "silent": [_instance_json(i, now) for i in view.silent],
        }
        print(json.dumps(shape, indent=2))
        return EXIT_OK
    if not view.instances:
        say(f"no live instances in {name}")
        _print_silent(view)
        return EXIT_OK
    header = ["instance", "host", "pid", "version", "heartbeat", "offset", "jobs"]
    rows = [
        [
            i.id,
            i.host,
            str(i.pid),
            i.version,
            span(now - i.heartbeat_ms) + " ago",
            "-" if i.clock_offset_ms is None else f"{i.clock_offset_ms:+d}ms",
            f"{i.carried}: " + ",".join(j.name for j in i.jobs) if i.carried else "0",
        ]
        for i in view.instances
    ]
    say("\n".join(table(header, rows, INSTANCE_FLOORS)))
    for i in view.instances:
        if i.shared_with is not None:
            line = (
                f"instance id {shown(i.id)} is used by two processes: {shown(i.host)} pid "
                f"{i.pid} and {shown(i.shared_with)} (give each its own instance_id)"
            )
            say(textwrap.fill(line, WIDTH, initial_indent="\n", subsequent_indent="  "))
    _print_silent(view)
    return EXIT_OK


def _print_silent(view: ClusterView) -> None:
    """The records that are not live, below the table: one line each."""
    if not view.silent:
        return
    say(
        f"\nnot live (silent for over {SILENT_HEARTBEATS} of their heartbeats; the next live "
        "instance's heartbeat removes them):"
    )
    for i in view.silent:
        age = span(view.now_ms - i.heartbeat_ms)
        line = f"{shown(i.id)} on {shown(i.host)} (pid {i.pid}): last heartbeat {age} ago"
        say(textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="    "))


def pause_json(pause: Pause | None) -> dict[str, Any] | None:
    """The documented JSON shape of a pause."""
    return None if pause is None else pause.to_dict()


def _job_json(job: JobView, now_ms: int) -> dict[str, Any]:
    return {
        "name": job.name,
        **{k: v for k, v in job.definition.to_dict().items() if k != "name"},
        "instances": list(job.instances),
        "next_slot_ms": job.next_slot_ms,
        "last_run": None if job.last_run is None else run_json(job.last_run),
        "running": [run_json(r, now_ms) for r in job.running],
        "paused": job.paused,
        "pause": pause_json(job.pause),
        "drift": None if job.drift is None else job.drift.to_dict(),
    }


_RAN = (RunStatus.SUCCEEDED, RunStatus.FAILED)


def moment(ms: int | None) -> str:
    """A slot or a pause's moment in UTC with its ``Z``, whole (milliseconds when it has some):
    a copy pasted into ``explain`` or ``pause --until`` names that moment (a time of day alone
    named no date and no zone; one to the second was up to 999 ms off); ``-`` for none."""
    return "-" if ms is None else iso_exact(ms)


def _job_row(job: JobView, now: int) -> list[str]:
    zone = job.definition.zone
    schedule = job.definition.expression + ("" if zone == "UTC" else f" {zone}")
    last = job.last_run
    took = last.duration if last is not None and last.status in _RAN else None
    running = ",".join(f"#{r.attempt} {_running_for(r, now)}" for r in job.running)
    return [
        job.name + ("*" if job.drift else ""),
        schedule,
        "paused" if job.paused else moment(job.next_slot_ms),
        last.status.value if last else "-",
        # How long ago the last attempt started: an age has no zone to misread (history and
        # --json give the instant).
        span(now - ms_of(last.started_at)) if last else "-",
        last.instance if last else "-",
        "-" if took is None else span(round(took * 1000)),
        running or "-",
    ]


def _running_for(run: Run, now: int) -> str:
    """How long a running attempt has run."""
    return span(now - ms_of(run.started_at))


def _running_line(run: Run, now: int) -> str:
    """A running attempt below the table: its job, attempt, whole instance id, how long it has
    run, and its slot (pasted into ``explain``, it names that slot) or its trigger."""
    return f"{run.job}: #{run.attempt} on {run.instance} for {_running_for(run, now)} ({_of(run)})"


def _last_run_line(run: Run) -> str:
    """A last run whose instance id the table cut, below it: its job, attempt, status, whole
    instance id, and its slot or its trigger."""
    return f"{run.job}: #{run.attempt} {run.status.value} on {run.instance} ({_of(run)})"


def _of(run: Run) -> str:
    """The slot of a run (pasted into ``explain``, it names that slot), or its trigger."""
    return f"slot {moment(run.slot_ms)}" if run.slot is not None else run.trigger.value


def _cut_last_runs(found: list[JobView], rows: list[list[str]]) -> list[Run]:
    """The last runs whose instance id (``where``) the table cuts to fit its line."""
    where = JOB_HEADER.index("where")
    width = column_widths(JOB_HEADER, rows, JOB_FLOORS)[where]
    return [
        job.last_run
        for job, row in zip(found, rows, strict=True)
        if job.last_run is not None and len(shown(row[where])) > width
    ]


def _pause_line(pause: Pause, jobs: list[str]) -> str:
    who = f"by {pause.by} since {moment(pause.at_ms)}"
    until = "until resumed" if pause.until_ms is None else f"until {moment(pause.until_ms)}"
    what = "every job (the whole cluster)" if pause.job == ALL_JOBS else ", ".join(jobs)
    return f"{what}: {who}, {until}"


async def jobs(args: argparse.Namespace) -> int:
    """``anarchon jobs [--json]``."""
    name, view, found = await read_cluster(args.backend, with_jobs=True)
    if args.json:
        shape = {
            "backend": name,
            "now_ms": view.now_ms,
            "jobs": [_job_json(j, view.now_ms) for j in found],
        }
        print(json.dumps(shape, indent=2))
        return EXIT_OK
    if not found:
        say(f"no live instance carries a job in {name}")
        return EXIT_OK
    rows = [_job_row(j, view.now_ms) for j in found]
    say("\n".join(table(JOB_HEADER, rows, JOB_FLOORS)))
    pauses: dict[Pause, list[str]] = {}
    for job in found:
        if job.pause is not None:
            pauses.setdefault(job.pause, []).append(job.name)
    cut_runs = _cut_last_runs(found, rows)
    if cut_runs:
        say("\nlast runs, their instance ids whole (cut above):")
        for run in cut_runs:
            say(_indented(_last_run_line(run)))
    running = [r for job in found for r in job.running]
    if running:
        say("\nrunning now:")
        for run in running:
            say(_indented(_running_line(run, view.now_ms)))
    if pauses:
        say("\npaused (instances skip their slots; manual triggers still run):")
        for pause, names in pauses.items():
            say(_indented(_pause_line(pause, names)))
    if view.drift:
        say("\n* definitions differ between instances (each fires its own schedule):")
        for drift in view.drift:
            say(_indented(drift.describe()))
    return EXIT_OK


def _indented(text: str) -> str:
    """``text`` (shown safely) in lines of :data:`WIDTH` columns, indented under the table;
    words are not broken, so a name or an instance id stays whole (one longer than a line runs
    past it)."""
    return textwrap.fill(
        shown(text),
        WIDTH,
        initial_indent="  ",
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
