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
documented in docs/operations.md. The commands live in :mod:`anarchon._cli` (``dashboard`` in
:mod:`anarchon.web._command`, ``demo`` in :mod:`anarchon._demo`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, NoReturn

from . import __version__, _early
from ._cli import cluster, health, history, requests, steer
from ._cli.common import (
    ENV_BACKEND,
    EXIT_BACKEND,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    Exit,
)
from ._cli.output import one_line, say
from ._cli.run import RunOptions, leave_threads, run_scheduler
from ._early import EarlySignals
from ._options import HISTORY_LIMIT, NEXT_TIMES
from ._redact import RedactingFormatter
from .errors import AnarchonError, BackendError, ConfigurationError, MissingDependency
from .health import MAX_TIMEOUT_S
from .logs import JsonFormatter

__all__ = ["main"]

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
LOG_FORMATS: Final = ("text", "json")


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
    """An argparse type: a number of seconds above 0, at most :data:`MAX_TIMEOUT_S`."""
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
    """An argparse type: ``demo --seconds``, as :func:`_seconds` and at least :data:`DEMO_MIN_S`."""
    value = _seconds(text)
    if value < DEMO_MIN_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is too short to see a slot: the demo's job runs every 2 seconds and a "
            f"slot counts once a second has passed after it; give at least {DEMO_MIN_S:g}"
        )
    return value


def _level(text: str) -> str:
    """An argparse type: a logging level's name, any case (one of :data:`LEVELS`)."""
    level = text.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a logging level; use one of {', '.join(LEVELS)}"
        )
    return level


def _parser() -> argparse.ArgumentParser:
    """The ``anarchon`` command line: the global options and every command's own."""
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

    runs = command("history", "print a job's runs, newest first")
    runs.add_argument("job")
    runs.add_argument(
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
    """Log to stderr at ``level``: text lines with URLs' secrets masked, or JSON lines."""
    handler = logging.StreamHandler()
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else RedactingFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def _code(exc: AnarchonError) -> int:
    """The exit code of an anarchon error no command turned into one (see the table above)."""
    if isinstance(exc, ConfigurationError | MissingDependency):
        return EXIT_USAGE
    if isinstance(exc, BackendError):
        return EXIT_BACKEND
    return EXIT_FAILED


def _tolerant_output() -> None:
    """Never fail on a character the terminal's encoding lacks (``LC_ALL=C``: ASCII): stdout
    and stderr write it as a backslash escape (``\\xfc``) instead of raising
    UnicodeEncodeError halfway through a table."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


COMMANDS: Final[dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]]] = {
    "history": history.history,
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
            code = run_scheduler(RunOptions.of(args), early)
        elif args.command in COMMANDS:
            code = asyncio.run(COMMANDS[args.command](args))
        elif args.command == "next":
            code = history.next_times(args)
        elif args.command == "dashboard":
            from .web._command import run_dashboard

            code = run_dashboard(args, early)
        else:
            from ._demo import run_demo

            logging.getLogger("anarchon").setLevel(logging.WARNING)
            code = EXIT_FAILED if asyncio.run(run_demo(args.instances, args.seconds)) else EXIT_OK
    except Exit as exc:
        say(one_line(str(exc)), file=sys.stderr)
        code = exc.code
    except AnarchonError as exc:
        say(f"anarchon: {one_line(str(exc))}", file=sys.stderr)
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
        leave_threads(code)
    sys.exit(code)
