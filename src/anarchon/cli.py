"""The ``anarchon`` command: run a scheduler, read history, preview a schedule, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from . import __version__
from ._models import Run
from ._schedule import CronSchedule
from ._scheduler import Scheduler
from ._urls import backend_from_url
from .backend import Backend
from .errors import AnarchonError

__all__ = ["main"]


def _load_scheduler(target: str) -> Scheduler:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(
            f"anarchon run: {target!r} must be 'module:attribute', e.g. 'app:scheduler'"
        )
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"anarchon run: cannot import {module_name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"anarchon run: {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, Scheduler):
        obj = obj()
    if not isinstance(obj, Scheduler):
        raise SystemExit(f"anarchon run: {target!r} is {obj!r}, not an anarchon Scheduler")
    return obj


def _backend(url: str | None) -> Backend:
    if url is None:
        from .backends.sqlite import SQLiteBackend

        return SQLiteBackend()
    return backend_from_url(url)


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
    await backend.start_reader()
    try:
        runs = await backend.history(args.job, limit=args.n)
    finally:
        await backend.stop()
    if not runs:
        print(f"no runs of {args.job!r} recorded in {backend!r}")
        return 0
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
    return 0


def _next(args: argparse.Namespace) -> int:
    schedule = CronSchedule(args.expression, args.tz)
    for moment in schedule.next_times(datetime.now(UTC), args.n):
        print(moment.isoformat())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anarchon", description="Leaderless distributed cron: one run per slot."
    )
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a Scheduler object until SIGINT/SIGTERM")
    run.add_argument("target", help="module:attribute of a Scheduler (or a function making one)")

    history = sub.add_parser("history", help="print a job's runs, newest first")
    history.add_argument("job")
    history.add_argument(
        "--backend", help="backend URL (default: SQLite $ANARCHON_DB or anarchon.db)"
    )
    history.add_argument("-n", type=int, default=20, help="how many runs (default 20)")

    nxt = sub.add_parser("next", help="print the next fire times of a cron expression")
    nxt.add_argument("expression")
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many (default 5)")

    demo = sub.add_parser("demo", help="several processes share one SQLite file and one job")
    demo.add_argument("--instances", type=int, default=3)
    demo.add_argument("--seconds", type=float, default=20.0)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``anarchon`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        if args.command == "run":
            _load_scheduler(args.target).run()
            code = 0
        elif args.command == "history":
            code = asyncio.run(_history(args))
        elif args.command == "next":
            code = _next(args)
        else:
            from ._demo import run_demo

            logging.getLogger("anarchon").setLevel(logging.WARNING)
            code = 1 if asyncio.run(run_demo(args.instances, args.seconds)) else 0
    except AnarchonError as exc:
        print(f"anarchon: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
