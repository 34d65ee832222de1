"""The ``anarchon`` command: run a scheduler, list jobs and instances, read history, preview a
schedule, run the demo.

Every failure is one line on stderr and a documented exit code (README, "Command line"):

====  ==========================================================================================
0     done
1     ``demo`` saw a duplicate or a missed slot; any other anarchon error
2     bad command line or configuration: an unknown option, a bad number, a malformed or
      unknown backend URL, a bad cron expression, a ``run`` target that is not a Scheduler or
      that was already run (a module that calls ``scheduler.run()`` when imported)
3     ``history``, ``jobs`` or ``instances`` found no anarchon data where the backend points (no
      SQLite file, a file anarchon never wrote, no registry: no scheduler ever ran there)
4     the backend cannot be reached or refused the request
====  ==========================================================================================

No message and no log line shows a password or token: URLs pass through one redactor.

``jobs --json`` and ``instances --json`` print one JSON object whose shape is stable (fields are
only ever added), documented in docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, NoReturn
from urllib.parse import quote

from . import __version__
from ._models import Run
from ._redact import RedactingFormatter, redact_url
from ._schedule import CronSchedule
from ._scheduler import Scheduler
from ._urls import backend_from_url
from .backend import Backend
from .errors import (
    AnarchonError,
    BackendError,
    ConfigurationError,
    MissingDependency,
    SchedulerStateError,
)
from .registry import ClusterView, InstanceRecord, JobView, build_view, describe_jobs

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NO_DATA: Final = 3
EXIT_BACKEND: Final = 4
ENV_BACKEND: Final = "ANARCHON_BACKEND"
LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _Exit(Exception):
    """Leave the command with one line on stderr and an exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: <message>`` and a pointer to ``--help``; exit with code 2."""
        print(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be a whole number from {low} to {high}"
            )
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds, above 0, at most 3600"
        )
    return value


def _level(text: str) -> str:
    level = text.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a logging level; use one of {', '.join(LEVELS)}"
        )
    return level


def _load_scheduler(target: str) -> Scheduler:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise _Exit(
            EXIT_USAGE, f"anarchon run: {target!r} must be 'module:attribute', e.g. 'app:scheduler'"
        )
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _Exit(EXIT_USAGE, f"anarchon run: cannot import {module_name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _Exit(
                EXIT_USAGE, f"anarchon run: {module_name!r} has no attribute {attr!r}"
            ) from None
    if callable(obj) and not isinstance(obj, Scheduler):
        obj = obj()
    if not isinstance(obj, Scheduler):
        raise _Exit(EXIT_USAGE, f"anarchon run: {target!r} is {obj!r}, not an anarchon Scheduler")
    return obj


def _run(target: str) -> int:
    scheduler = _load_scheduler(target)
    module = target.partition(":")[0]
    guard = (
        f"guard the call with 'if __name__ == \"__main__\":' in {module!r} so that importing "
        "it only builds the scheduler"
    )
    if scheduler.running:
        raise _Exit(
            EXIT_USAGE,
            f"anarchon run: {target} is already running: importing {module!r} started it; {guard}",
        )
    try:
        scheduler.run()
    except SchedulerStateError:
        raise _Exit(
            EXIT_USAGE,
            f"anarchon run: {target} had already run and stopped while {module!r} was imported "
            f"(it calls scheduler.run() at import time), so there is nothing left to run; {guard}",
        ) from None
    return EXIT_OK


def _backend(url: str | None) -> Backend:
    """The backend to read: ``--backend``, else ``$ANARCHON_BACKEND``, else the SQLite file."""
    url = url or os.environ.get(ENV_BACKEND) or None
    if url is None:
        from .backends.sqlite import SQLiteBackend

        return SQLiteBackend()
    return backend_from_url(url)


def _require_sqlite_data(path: Path) -> None:
    """Exit with EXIT_NO_DATA unless ``path`` is a SQLite file that anarchon wrote; never
    create or change the file (opening it read-only)."""
    missing = _Exit(EXIT_NO_DATA, f"no anarchon data at {path}")
    if not path.is_file():
        raise missing
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'anarchon_schema'"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise _Exit(EXIT_NO_DATA, f"no anarchon data at {path}: {exc}") from None
    if found is None:
        raise missing


def _row(run: Run) -> list[str]:
    def when(moment: datetime | None) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if moment else "-"

    note = run.error or run.reason or ""
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


async def _history(args: argparse.Namespace) -> int:
    backend = _backend(args.backend)
    from .backends.sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        _require_sqlite_data(backend.path)
    await backend.start_reader()
    try:
        runs = await backend.history(args.job, limit=args.n)
    finally:
        await backend.stop()
    if not runs:
        print(f"no runs of {args.job!r} recorded in {redact_url(repr(backend))}")
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
    rows = [header, *map(_row, runs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return EXIT_OK


WIDTH: Final = 100
"""Every table line fits in this many columns."""


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _table(header: list[str], rows: list[list[str]], caps: list[int]) -> list[str]:
    """Columns padded to their widest cell, each cut to its cap (``~`` marks a cut)."""
    rows = [[_cut(c, cap) for c, cap in zip(row, caps, strict=True)] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _age(ms: int) -> str:
    """A duration as a person reads it at a glance: ``850ms``, ``4.2s``, ``3m``, ``5h``."""
    if ms < 1_000:
        return f"{max(ms, 0)}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m"
    return f"{ms // 3_600_000}h"


def _moment(ms: int | None, now_ms: int) -> str:
    """UTC time of day within a day of now, else month-day and minutes."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%H:%M:%S" if abs(ms - now_ms) < 86_400_000 else "%m-%d %H:%M")


def _run_json(run: Run | None) -> dict[str, Any] | None:
    if run is None:
        return None
    finished = run.finished_at
    return {
        "status": run.status.value,
        "trigger": run.trigger.value,
        "slot_ms": run.slot_ms,
        "started_ms": round(run.started_at.timestamp() * 1000),
        "finished_ms": None if finished is None else round(finished.timestamp() * 1000),
        "took_ms": None if run.duration is None else round(run.duration * 1000),
        "instance": run.instance,
        "attempt": run.attempt,
        "fence": run.fence,
        "error": run.error,
        "reason": run.reason,
    }


async def _require_postgres_data(backend: Backend) -> None:
    """Exit with EXIT_NO_DATA unless the registry table exists, checked on a connection of our
    own before the backend starts (starting it would create its tables)."""
    dsn = getattr(backend, "dsn", None)
    if dsn is None:
        return  # a pool or connection passed in: nothing to check without starting
    import psycopg

    name = f"{backend.schema}.{backend.table_prefix}registry"  # type: ignore[attr-defined]
    try:
        async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=5) as conn:
            cursor = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
            row = await cursor.fetchone()
    except psycopg.Error as exc:
        raise _Exit(EXIT_BACKEND, f"cannot reach {redact_url(repr(backend))}: {exc}") from None
    if not (row and row[0]):
        raise _Exit(EXIT_NO_DATA, f"no anarchon data at {redact_url(repr(backend))}")


async def _read_cluster(
    url: str | None, *, with_jobs: bool
) -> tuple[Backend, ClusterView, list[JobView]]:
    """Open the backend read-only, read the registry (and each job's recent history)."""
    backend = _backend(url)
    store = backend.registry()
    where = redact_url(repr(backend))
    if store is None:
        raise _Exit(EXIT_USAGE, f"the {backend.name} backend keeps no registry ({where})")
    from .backends.postgres import PostgresBackend
    from .backends.sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        _require_sqlite_data(backend.path)
    elif isinstance(backend, PostgresBackend):
        await _require_postgres_data(backend)
    await backend.start_reader()
    try:
        if not await store.exists():
            raise _Exit(EXIT_NO_DATA, f"no anarchon data at {where}: no scheduler recorded itself")
        server_ms = await backend.server_time_ms()
        now_ms = server_ms if server_ms is not None else int(time.time() * 1000)
        view = build_view(await store.instances(), now_ms)
        jobs = await describe_jobs(backend, view) if with_jobs else []
    finally:
        await backend.stop()
    return backend, view, jobs


def _instance_json(record: InstanceRecord, now_ms: int) -> dict[str, Any]:
    return {**record.to_dict(), "heartbeat_age_ms": now_ms - record.heartbeat_ms}


async def _instances(args: argparse.Namespace) -> int:
    backend, view, _ = await _read_cluster(args.backend, with_jobs=False)
    now = view.now_ms
    if args.json:
        print(
            json.dumps(
                {
                    "backend": redact_url(repr(backend)),
                    "now_ms": now,
                    "instances": [_instance_json(i, now) for i in view.instances],
                },
                indent=2,
            )
        )
        return EXIT_OK
    if not view.instances:
        print(f"no live instances in {redact_url(repr(backend))}")
        return EXIT_OK
    header = ["instance", "host", "pid", "version", "heartbeat", "offset", "jobs"]
    rows = [
        [
            i.id,
            i.host,
            str(i.pid),
            i.version,
            _age(now - i.heartbeat_ms) + " ago",
            "-" if i.clock_offset_ms is None else f"{i.clock_offset_ms:+d}ms",
            f"{len(i.jobs)}: " + ",".join(j.name for j in i.jobs) if i.jobs else "0",
        ]
        for i in view.instances
    ]
    print("\n".join(_table(header, rows, [24, 16, 7, 10, 10, 9, 30])))
    return EXIT_OK


def _job_json(job: JobView) -> dict[str, Any]:
    return {
        "name": job.name,
        **{k: v for k, v in job.definition.to_dict().items() if k != "name"},
        "instances": list(job.instances),
        "next_slot_ms": job.next_slot_ms,
        "last_run": _run_json(job.last_run),
        "running": [_run_json(r) for r in job.running],
        "paused": job.paused,
        "drift": None if job.drift is None else job.drift.to_dict(),
    }


def _job_row(job: JobView, now: int) -> list[str]:
    zone = job.definition.zone
    schedule = job.definition.expression + ("" if zone == "UTC" else f" {zone}")
    last = job.last_run
    took = last.duration if last is not None else None
    running = ",".join(f"{r.instance}#{r.attempt}" for r in job.running) or "-"
    return [
        job.name + ("*" if job.drift else ""),
        schedule,
        _moment(job.next_slot_ms, now),
        last.status.value if last else "-",
        _moment(round(last.started_at.timestamp() * 1000), now) if last else "-",
        last.instance if last else "-",
        "-" if took is None else _age(round(took * 1000)),
        running,
    ]


async def _jobs(args: argparse.Namespace) -> int:
    backend, view, jobs = await _read_cluster(args.backend, with_jobs=True)
    if args.json:
        print(
            json.dumps(
                {
                    "backend": redact_url(repr(backend)),
                    "now_ms": view.now_ms,
                    "jobs": [_job_json(j) for j in jobs],
                },
                indent=2,
            )
        )
        return EXIT_OK
    if not jobs:
        print(f"no live instance carries a job in {redact_url(repr(backend))}")
        return EXIT_OK
    header = ["job", "schedule", "next", "last run", "when", "where", "took", "running"]
    rows = [_job_row(j, view.now_ms) for j in jobs]
    print("\n".join(_table(header, rows, [14, 15, 11, 9, 11, 10, 6, 10])))
    if view.drift:
        print("\n* definitions differ between instances (each fires its own schedule):")
        for drift in view.drift:
            print(
                textwrap.fill(
                    drift.describe(), WIDTH, initial_indent="  ", subsequent_indent="    "
                )
            )
    return EXIT_OK


def _next(args: argparse.Namespace) -> int:
    schedule = CronSchedule(args.expression, args.tz)
    for moment in schedule.next_times(datetime.now(UTC), args.n):
        print(moment.isoformat())
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="anarchon", description="Leaderless distributed cron: one run per slot.")
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    parser.add_argument(
        "--log-level",
        type=_level,
        default="INFO",
        help=f"logging level: {', '.join(LEVELS)} (default INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a Scheduler object until SIGINT/SIGTERM")
    run.add_argument("target", help="module:attribute of a Scheduler (or a function making one)")

    history = sub.add_parser("history", help="print a job's runs, newest first")
    history.add_argument("job")
    history.add_argument(
        "--backend",
        help=f"backend URL; default ${ENV_BACKEND}, else SQLite at $ANARCHON_DB or ./anarchon.db",
    )
    history.add_argument(
        "-n", type=_count(1, 100_000), default=20, help="how many runs, at least 1 (default 20)"
    )

    for name, text in (
        ("jobs", "list the jobs live instances carry: schedule, next slot, last run, drift"),
        ("instances", "list the live instances: heartbeat, clock offset, version, jobs"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument(
            "--backend",
            help=f"backend URL; default ${ENV_BACKEND}, else SQLite at $ANARCHON_DB or "
            "./anarchon.db",
        )
        command.add_argument(
            "--json", action="store_true", help="print one JSON object (docs/operations.md)"
        )

    nxt = sub.add_parser("next", help="print the next fire times of a cron expression")
    nxt.add_argument("expression")
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    nxt.add_argument("-n", type=_count(1, 10_000), default=5, help="how many (default 5)")

    from .web._command import add_parser as add_dashboard

    add_dashboard(sub, ENV_BACKEND)
    demo = sub.add_parser("demo", help="several processes share one SQLite file and one job")
    demo.add_argument("--instances", type=_count(1, 20), default=3, help="1 to 20 (default 3)")
    demo.add_argument("--seconds", type=_seconds, default=20.0, help="run time (default 20)")
    return parser


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def _code(exc: AnarchonError) -> int:
    if isinstance(exc, ConfigurationError | MissingDependency):
        return EXIT_USAGE
    if isinstance(exc, BackendError):
        return EXIT_BACKEND
    return EXIT_FAILED


def _one_line(text: str) -> str:
    return redact_url(" ".join(part.strip() for part in text.splitlines() if part.strip()))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``anarchon`` console script; exits with a code from the table above."""
    args = _parser().parse_args(argv)
    _configure_logging(args.log_level)
    try:
        if args.command == "run":
            code = _run(args.target)
        elif args.command == "history":
            code = asyncio.run(_history(args))
        elif args.command == "jobs":
            code = asyncio.run(_jobs(args))
        elif args.command == "instances":
            code = asyncio.run(_instances(args))
        elif args.command == "next":
            code = _next(args)
        elif args.command == "dashboard":
            from .web._command import run_dashboard

            code = run_dashboard(args)
        else:
            from ._demo import run_demo

            logging.getLogger("anarchon").setLevel(logging.WARNING)
            code = EXIT_FAILED if asyncio.run(run_demo(args.instances, args.seconds)) else EXIT_OK
    except _Exit as exc:
        print(_one_line(str(exc)), file=sys.stderr)
        code = exc.code
    except AnarchonError as exc:
        print(f"anarchon: {_one_line(str(exc))}", file=sys.stderr)
        code = _code(exc)
    sys.exit(code)
