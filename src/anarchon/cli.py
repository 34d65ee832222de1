"""The ``anarchon`` command: run a scheduler; list jobs and instances; read history; explain a
slot; pause, resume and trigger jobs; list and cancel run requests; preview a schedule; run
the demo.

Every failure is one line on stderr and a documented exit code (README, "Command line";
docs/operations.md):

====  ==========================================================================================
0     done; ``run`` stopped by SIGINT or SIGTERM at any moment from its process's start: while
      anarchon or the app is imported (the scheduler is then not started), while the
      scheduler starts (the start is cancelled), or while it runs; ``dashboard`` by SIGTERM
1     ``demo`` saw a duplicate or a missed slot; ``health`` found a scheduler unhealthy;
      ``cancel`` found a request an instance had claimed first (it runs); any other anarchon
      error
2     bad command line or configuration: an unknown option, a bad number, a malformed,
      unknown or empty backend URL, a bad cron expression, a bad time or duration, a bad
      instance id, an address it cannot listen on, a ``run`` target that is not a Scheduler
      or that was already run (a module that calls ``scheduler.run()`` when imported), a
      backend with no registry or control store, ``trigger`` of a job no instance in the
      registry carries (without ``--force``); a bad command line is told before the backend
      is opened
3     no anarchon data where the backend points (no SQLite file, a file anarchon never wrote, no
      PostgreSQL tables, no NATS stream, no registry: no scheduler ever ran there), or
      (``explain``) no live instance carries the job, or (``cancel``) no pending request has
      the ID; read and write commands alike create nothing then
4     the backend cannot be reached or refused the request
====  ==========================================================================================

No message and no log line shows a password or token: URLs pass through one redactor. Text
from the backend is printed with its control characters escaped (:mod:`anarchon._cli.output`),
and a character the terminal's encoding lacks as a backslash escape.

``--json`` prints one JSON object whose shape is stable (fields are only ever added),
documented in docs/operations.md. The commands live in :mod:`anarchon._cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, NoReturn

from . import __version__, _early
from ._cli import cluster, health, requests, steer
from ._cli.common import (
    ENV_BACKEND,
    EXIT_BACKEND,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    Exit,
    no_data,
    opened,
    storage_checked,
)
from ._cli.output import say, shown, table
from ._early import EarlySignals
from ._http import ROUTES, HttpServer, RouteFactory, metrics_route
from ._job import check_name
from ._json import run_json
from ._models import Run
from ._options import HISTORY_LIMIT, NEXT_TIMES
from ._readable import iso, ms_of
from ._redact import RedactingFormatter, redact_url
from ._schedule import CronSchedule
from ._scheduler import Scheduler
from ._times import LATEST_MS
from .errors import (
    AnarchonError,
    BackendError,
    ConfigurationError,
    MissingDependency,
    SchedulerStateError,
)
from .health import MAX_TIMEOUT_S
from .logs import Action, JsonFormatter, log_fields

__all__ = ["main"]

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
LOG_FORMATS: Final = ("text", "json")
_Exit = Exit


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: <message>`` and a pointer to ``--help``; exit with code 2."""
        say(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """argparse's, but an argument the command does not know is reported by the command's
        parser, whose help lists the command's options (``anarchon jobs: unrecognized
        arguments: --jsn (see 'anarchon jobs --help')``)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = next((a.choices for a in self._actions if a.dest == "command"), None)
            owner = commands.get(parsed.command, self) if isinstance(commands, dict) else self
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


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
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds, above 0, at most {MAX_TIMEOUT_S}"
        )
    return value


DEMO_MIN_S: Final = 3.0
"""The shortest ``anarchon demo --seconds``: its job runs every 2 seconds and a slot counts once
a second has passed after it, so a shorter run may see no slot at all."""


def _demo_seconds(text: str) -> float:
    value = _seconds(text)
    if value < DEMO_MIN_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is too short to see a slot: the demo's job runs every 2 seconds and a "
            f"slot counts once a second has passed after it; give at least {DEMO_MIN_S:g}"
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


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsOptions:
    """The metrics server of ``anarchon run --metrics-port``."""

    port: int
    """``--metrics-port``: serve Prometheus metrics on this port."""
    host: str = "0.0.0.0"
    """``--metrics-host``: the address the metrics server listens on."""
    job_histograms: bool = False
    """``--metrics-job-histograms``: histograms per job instead of the instance's."""
    linger: int = 0
    """``--metrics-linger``: seconds to serve on after the scheduler stopped (0: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What ``anarchon run`` was asked to do: which Scheduler to run, with which backend, and
    its metrics server. :meth:`of` reads them from the command line; the defaults are the
    command's."""

    target: str
    """``module:attribute`` of a Scheduler, or of a function that makes one."""
    backend_url: str | None = None
    """``--backend``: the URL a ``Scheduler()`` made without a backend uses."""
    metrics: MetricsOptions | None = None
    """The metrics server (None without ``--metrics-port``: no server)."""

    @classmethod
    def of(cls, args: argparse.Namespace) -> RunOptions:
        """The options of a parsed ``anarchon run`` command line."""
        metrics = None
        if args.metrics_port is not None:
            metrics = MetricsOptions(
                port=args.metrics_port,
                host=args.metrics_host,
                job_histograms=args.metrics_job_histograms,
                linger=args.metrics_linger,
            )
        return cls(target=args.target, backend_url=args.backend, metrics=metrics)


def _run(options: RunOptions, early: EarlySignals | None = None) -> int:
    """``anarchon run``: run the Scheduler ``options`` name until a signal stops it.
    ``early``: the signals caught since the process began (state, not an option): one that
    came before the scheduler started means it is not started, or (during its start) that the
    start is cancelled."""
    early = early or EarlySignals()
    stop = _Stop()  # set from the signal handler: binds no loop until waited
    early.on_signal(stop.set)
    target, backend_url = options.target, options.backend_url
    if backend_url is not None and not backend_url.strip():
        raise _Exit(
            EXIT_USAGE,
            f"anarchon run: --backend {backend_url!r} is empty: give a backend URL such as "
            "sqlite:///anarchon.db, or leave --backend out",
        )
    if backend_url is not None:
        os.environ[ENV_BACKEND] = backend_url  # Scheduler() made without a backend reads it
    scheduler = _load_scheduler(target)
    if backend_url is not None and scheduler.backend_url != backend_url:
        raise _Exit(
            EXIT_USAGE,
            f"anarchon run: --backend applies to a Scheduler() made without a backend, but "
            f"{target} was given its own ({scheduler.backend.name}); drop --backend or build "
            "the scheduler with Scheduler() and no backend",
        )
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
    if early.caught:
        logging.getLogger("anarchon.scheduler").info(
            "%s before the scheduler started: not starting it", early.caught[0]
        )
        return EXIT_OK
    stop.scheduler = scheduler
    metrics = options.metrics
    server = None if metrics is None else _serve(scheduler, metrics)
    try:
        scheduler.run(stop)
        if server is not None and metrics is not None and metrics.linger:
            if stop.while_starting:
                # Nothing ran, so there are no final counts to wait for a scrape of: the
                # operator's stop is not held back by up to --metrics-linger seconds.
                logging.getLogger("anarchon.http").info(
                    "the start was cancelled: no final metrics to serve, not lingering",
                    extra=log_fields(Action.HTTP_LINGER, scraped=False),
                )
            else:
                _linger(server, metrics.linger)
    except BackendError as exc:
        if not stop.is_set():
            raise
        # The backend failed the start just as SIGINT or SIGTERM came (one that comes before
        # cancels the start: serve()): the operator stopped a scheduler that never started.
        logging.getLogger("anarchon.scheduler").warning(
            "stopped before the backend answered: the scheduler never started (%s)",
            _one_line(str(exc)),
            extra=log_fields(Action.START_FAILED),
        )
        return EXIT_OK
    except SchedulerStateError:
        raise _Exit(
            EXIT_USAGE,
            f"anarchon run: {target} had already run and stopped while {module!r} was imported "
            f"(it calls scheduler.run() at import time), so there is nothing left to run; {guard}",
        ) from None
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK


class _Stop(asyncio.Event):
    """The stop of ``anarchon run`` (a signal: early, or the loop's handler), noting whether it
    came while the scheduler was still starting (its start is then cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: Scheduler | None = None
        self.while_starting = False

    def set(self) -> None:
        """Set the event; the first time, note whether the scheduler's start had ended."""
        if not self.is_set() and self.scheduler is not None:
            # A stop before the start has ended cancels it (serve()), and nothing has run.
            self.while_starting = self.scheduler.state in ("new", "starting")
        super().set()


def _serve(scheduler: Scheduler, metrics: MetricsOptions) -> HttpServer:
    """Start the metrics server of ``anarchon run --metrics-port`` (see :mod:`._http`)."""
    routes: dict[str, RouteFactory] = {
        **ROUTES,
        "/metrics": partial(metrics_route, job_histograms=metrics.job_histograms),
    }
    port, host = metrics.port, metrics.host
    server = HttpServer(scheduler, port, host, routes)
    try:
        server.start()
    except OSError as exc:
        raise _Exit(EXIT_USAGE, f"anarchon run: cannot listen on {host}:{port}: {exc}") from None
    return server


def _linger(server: HttpServer, seconds: int) -> None:
    """``--metrics-linger``: the scheduler has stopped; serve on until a scrape has seen the
    final counts, ``seconds`` pass, or SIGINT or SIGTERM comes."""
    logger = logging.getLogger("anarchon.http")
    logger.info(
        "the scheduler stopped: serving the final metrics until a scrape reads them, at most "
        "%d s (SIGINT or SIGTERM ends the wait)",
        seconds,
        extra=log_fields(Action.HTTP_LINGER),
    )
    taken = {sig: signal.signal(sig, lambda *_: server.enough()) for sig in _SIGNALS}
    try:
        scraped = server.linger(seconds)
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)
    logger.info(
        "%s",
        "a scrape read the final metrics" if scraped else "no scrape read the final metrics",
        extra=log_fields(Action.HTTP_LINGER, scraped=scraped),
    )


_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

#: ``anarchon run``: once the scheduler stopped, how long (s) the threads still running that are
#: not daemon threads (started by a handler) get to end before the process exits without them.
THREADS_WAIT_S: Final = 3.0


def _leave_threads(code: int) -> None:
    """``anarchon run`` is over: wait up to :data:`THREADS_WAIT_S` for the non-daemon threads
    still running (a handler started them; Python's own exit would wait for them for ever),
    then, if some still run, log ``threads_left`` naming them and end the process now with
    ``code`` (``os._exit``, after flushing the logs and output: no atexit hooks run). Returns
    when none is left. Only the command does this: a Scheduler used as a library leaves the
    process to its owner."""
    deadline = time.monotonic() + THREADS_WAIT_S
    for thread in _running_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _running_threads()
    if not left:
        return
    logging.getLogger("anarchon.scheduler").warning(
        "the scheduler stopped, but %d thread(s) that are not daemon threads still run after "
        "%g s: %s; exiting without them (code %d)",
        len(left),
        THREADS_WAIT_S,
        ", ".join(repr(t.name) for t in left),
        code,
        extra=log_fields(Action.THREADS_LEFT, threads=len(left)),
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _running_threads() -> list[threading.Thread]:
    """The threads other than this one that Python's exit would wait for."""
    return [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.daemon and t.is_alive()
    ]


def _row(run: Run) -> list[str]:
    def when(moment: datetime | None) -> str:
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


async def _history(args: argparse.Namespace) -> int:
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


def _next(args: argparse.Namespace) -> int:
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

    text = "run a Scheduler object until SIGINT/SIGTERM"
    run = sub.add_parser("run", help=text, description=text)
    run.add_argument("target", help="module:attribute of a Scheduler (or a function making one)")
    run.add_argument(
        "--backend",
        help=f"backend URL for a Scheduler() made without one (sets ${ENV_BACKEND} before the "
        "import)",
    )
    run.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text (default) or json: one JSON object a line (anarchon.logs.JsonFormatter)",
    )
    run.add_argument(
        "--metrics-port",
        type=_count(0, 65_535),
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs anarchon[prometheus])",
    )
    run.add_argument(
        "--metrics-host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)"
    )
    run.add_argument(
        "--metrics-job-histograms",
        action="store_true",
        help="a fire lag and a handler duration histogram per job (32 more series a job) "
        "instead of the instance's",
    )
    run.add_argument(
        "--metrics-linger",
        type=_count(0, 3600),
        default=0,
        metavar="SECONDS",
        help="after the scheduler stopped, serve on until a scrape has read the final counts, "
        "at most SECONDS (default 0: exit at once)",
    )

    def command(name: str, text: str, *, json_flag: bool = True) -> argparse.ArgumentParser:
        made = sub.add_parser(name, help=text, description=text)
        made.add_argument(
            "--backend",
            help=f"backend URL; default ${ENV_BACKEND}, else SQLite at $ANARCHON_DB or "
            "./anarchon.db",
        )
        if json_flag:
            where = "docs/observability.md" if name == "health" else "docs/operations.md"
            made.add_argument(
                "--json", action="store_true", help=f"print one JSON object ({where})"
            )
        return made

    history = command("history", "print a job's runs, newest first")
    history.add_argument("job")
    history.add_argument(
        "-n",
        type=_count(1, HISTORY_LIMIT.high),
        default=20,
        help=f"how many runs, 1 to {HISTORY_LIMIT.high} (default 20)",
    )
    command("jobs", "list the jobs live instances carry: next slot, last run, running, paused")
    command("instances", "list the live instances: heartbeat, clock offset, version, jobs")
    probe = command("health", "exit 0 if this host's scheduler is healthy (a Kubernetes probe)")
    probe.add_argument("--instance", help="the instance to check (default: those on this host)")
    probe.add_argument(
        "--timeout", type=_seconds, default=health.TIMEOUT_S, help="seconds (default 5)"
    )

    explain = command("explain", "say what became of one slot of a job, and why")
    explain.add_argument("job")
    explain.add_argument(
        "slot",
        help="ISO 8601 time (without an offset: in the job's zone; a repeated local time is "
        "the first) or epoch milliseconds",
    )
    for name, about, every in (
        (
            "pause",
            "pause a job (or every job: --all) on every instance, until resumed or --until",
            "pause every job (the whole cluster)",
        ),
        (
            "resume",
            "end a job's pause (or the whole-cluster pause: --all) on every instance",
            "end the whole-cluster pause; a job paused on its own stays paused (each such job "
            "is named: 'anarchon resume JOB' ends its pause)",
        ),
    ):
        steering = command(name, about)
        steering.add_argument("job", nargs="?", help="the job's name")
        steering.add_argument("--all", action="store_true", help=every)
        if name == "pause":
            steering.add_argument(
                "--until",
                metavar="TIME",
                help="end the pause by itself: ISO 8601 (without an offset: in the job's zone; "
                "with --all, give the offset), epoch ms, or "
                "a duration from now such as 30m, 2h, 1d, 1h30m (units s, m, h, d, w); at most "
                "10 years ahead",
            )
            steering.add_argument(
                "--by", help="who pauses (default $ANARCHON_REQUESTER or user@host)"
            )
    trigger = command("trigger", "run a job once now on an instance that carries it; print the id")
    trigger.add_argument("job")
    trigger.add_argument("--by", help="who asks (default $ANARCHON_REQUESTER or user@host)")
    trigger.add_argument(
        "--force",
        action="store_true",
        help="store the request even if no instance in the registry carries the job (it waits "
        "until one does)",
    )
    pending = command("requests", "list the run requests (triggers, retries) not claimed yet")
    pending.add_argument("--job", help="only this job's")
    cancel = command(
        "cancel", "cancel a pending run request (a trigger or a retry), or every one of a job"
    )
    cancel.add_argument("request", nargs="?", metavar="ID", help="the request's id")
    cancel.add_argument("--job", help="cancel every pending request of this job")
    cancel.add_argument("--by", help="who cancels (default $ANARCHON_REQUESTER or user@host)")

    text = "print the next fire times of a cron expression"
    nxt = sub.add_parser("next", help=text, description=text)
    nxt.add_argument("expression", help="5 fields, or 6 with seconds first")
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    nxt.add_argument(
        "-n",
        type=_count(NEXT_TIMES.low, NEXT_TIMES.high),
        default=5,
        help=f"how many, {NEXT_TIMES.low} to {NEXT_TIMES.high} (default 5)",
    )

    from .web._command import add_parser as add_dashboard

    add_dashboard(sub, ENV_BACKEND)
    text = "several processes share one SQLite file and one job"
    demo = sub.add_parser("demo", help=text, description=text)
    demo.add_argument("--instances", type=_count(1, 20), default=3, help="1 to 20 (default 3)")
    demo.add_argument(
        "--seconds",
        type=_demo_seconds,
        default=20.0,
        help=f"run time, at least {DEMO_MIN_S:g} (default 20); SIGINT or SIGTERM ends it early",
    )
    return parser


def _configure_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else RedactingFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def _code(exc: AnarchonError) -> int:
    if isinstance(exc, ConfigurationError | MissingDependency):
        return EXIT_USAGE
    if isinstance(exc, BackendError):
        return EXIT_BACKEND
    return EXIT_FAILED


def _one_line(text: str) -> str:
    joined = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return shown(redact_url(joined))


def _tolerant_output() -> None:
    """Never fail on a character the terminal's encoding lacks (``LC_ALL=C``: ASCII): stdout
    and stderr write it as a backslash escape (``\\xfc``) instead of raising
    UnicodeEncodeError halfway through a table."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


COMMANDS: Final[dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]]] = {
    "history": _history,
    "jobs": cluster.jobs,
    "instances": cluster.instances,
    "explain": steer.explain,
    "pause": steer.pause,
    "resume": steer.resume,
    "trigger": steer.trigger,
    "requests": requests.requests,
    "cancel": requests.cancel,
    "health": health.health,
}


#: Options whose value may start with '-' (``--until -5m``).
_SIGNED_VALUES: Final = ("--until",)


def _joined_values(argv: Sequence[str]) -> list[str]:
    """``--until -5m`` read as ``--until=-5m``: argparse takes a word starting with '-' for an
    option (only a plain negative number passes), and said ``--until: expected one argument``
    where the command can say what is wrong with the value."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            out += [word, *words]
            break
        if word in _SIGNED_VALUES:
            value = next(words, None)
            if value is not None and value[:1] == "-" and value[1:2].isdigit():
                out.append(f"{word}={value}")
                continue
            out += [word] if value is None else [word, value]
            continue
        out.append(word)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``anarchon`` console script; exits with a code from the table above."""
    _tolerant_output()
    args = _parser().parse_args(_joined_values(sys.argv[1:] if argv is None else argv))
    # Caught since the package was imported, in the command's process (anarchon._early).
    held, _early.EARLY = _early.EARLY, None
    early = held or EarlySignals()
    # `run` and `dashboard` stop by SIGTERM with exit 0: they keep the signals caught through
    # their imports (the app's; uvicorn, Starlette and Jinja2), the others take them now.
    keeps = args.command in ("run", "dashboard")
    if keeps:
        early.install()  # first (if not yet): importing the app can take seconds
    _configure_logging(args.log_level, getattr(args, "log_format", "text"))
    try:
        if held is not None and not keeps:
            held.release()  # a signal held meanwhile is taken now, as it would have been
        if args.command == "run":
            code = _run(RunOptions.of(args), early)
        elif args.command in COMMANDS:
            code = asyncio.run(COMMANDS[args.command](args))
        elif args.command == "next":
            code = _next(args)
        elif args.command == "dashboard":
            from .web._command import run_dashboard

            code = run_dashboard(args, early)
        else:
            from ._demo import run_demo

            logging.getLogger("anarchon").setLevel(logging.WARNING)
            code = EXIT_FAILED if asyncio.run(run_demo(args.instances, args.seconds)) else EXIT_OK
    except _Exit as exc:
        say(_one_line(str(exc)), file=sys.stderr)
        code = exc.code
    except AnarchonError as exc:
        say(f"anarchon: {_one_line(str(exc))}", file=sys.stderr)
        code = _code(exc)
    except KeyboardInterrupt:
        # Ctrl-C: the way to end `dashboard` (uvicorn raises the SIGINT it caught again once it
        # has stopped), a read on a slow backend, or `run` on a third signal. No traceback.
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # The output's reader left (`| head`). Python's own exit would flush stdout into the
        # closed pipe again and print an error: stdout goes to /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_PIPE_CLOSED
    if args.command == "run":
        _leave_threads(code)
    sys.exit(code)
