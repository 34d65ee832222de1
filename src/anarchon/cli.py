"""The ``anarchon`` command: run a scheduler, read history, preview a schedule, run the demo.

Every failure is one line on stderr and a documented exit code (README, "Command line"):

====  ==========================================================================================
0     done
1     ``demo`` saw a duplicate or a missed slot; any other anarchon error
2     bad command line or configuration: an unknown option, a bad number, a malformed or
      unknown backend URL, a bad cron expression, a ``run`` target that is not a Scheduler or
      that was already run (a module that calls ``scheduler.run()`` when imported)
3     ``history`` found no anarchon data where the backend points (no SQLite file, or a file
      anarchon never wrote)
4     the backend cannot be reached or refused the request
====  ==========================================================================================

No message and no log line shows a password or token: URLs pass through one redactor.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, NoReturn
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

    nxt = sub.add_parser("next", help="print the next fire times of a cron expression")
    nxt.add_argument("expression")
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    nxt.add_argument("-n", type=_count(1, 10_000), default=5, help="how many (default 5)")

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
        elif args.command == "next":
            code = _next(args)
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
