"""``python manage.py anarchon COMMAND``: the ``anarchon`` command with Django's settings.

``run`` runs the scheduler built by :func:`anarchon.integrations.django.build_scheduler`, with
the options of ``anarchon run`` in :data:`RUN_OPTIONS` (``--metrics-port 9100`` serves
``/healthz`` and ``/metrics``).
Every other command (``history``, ``jobs``, ``instances``, ``explain``, ``pause``,
``resume``, ``trigger``) is the ``anarchon`` command of the same name, run with the backend the
settings name (through ``$ANARCHON_BACKEND``, so a password never sits on a command line and is
never printed).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anarchon.integrations.django import backend_url

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TARGET: Final = "anarchon.integrations.django:build_scheduler"


@contextmanager
def _backend_env(url: str | None) -> Iterator[None]:
    """``$ANARCHON_BACKEND`` set to ``url`` (if any) while the CLI runs, then restored."""
    before = os.environ.get("ANARCHON_BACKEND")
    if url is not None:
        os.environ["ANARCHON_BACKEND"] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ANARCHON_BACKEND", None)
        else:
            os.environ["ANARCHON_BACKEND"] = before


RUN_OPTIONS: Final = (
    "--log-format",
    "--metrics-port",
    "--metrics-host",
    "--metrics-linger",
    "--metrics-job-histograms",
)
"""The options of ``anarchon run`` that ``manage.py anarchon run`` passes on (the metrics
server, whose ``/healthz`` the Kubernetes probes ask, and the log format); not a target or
``--backend``: the jobs come from each app's ``cron.py``, the backend from the settings."""


def _check_run_options(args: Sequence[str]) -> None:
    """Refuse what ``manage.py anarchon run`` does not pass on; the values themselves are
    checked by ``anarchon run``, with its messages."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in RUN_OPTIONS[:-1]:
        parser.add_argument(name)
    parser.add_argument(RUN_OPTIONS[-1], action="store_true")
    try:
        _, rest = parser.parse_known_args(list(args))
    except argparse.ArgumentError as exc:
        raise CommandError(f"manage.py anarchon run: {exc}") from None
    if rest:
        raise CommandError(
            f"'anarchon run' here takes only the options {', '.join(RUN_OPTIONS)} (got "
            f"{' '.join(rest)!r}): the jobs come from each app's cron.py and the backend from "
            "settings.ANARCHON"
        )


def cli_argv(command: str, args: Sequence[str], log_level: str) -> list[str]:
    """The ``anarchon`` command line that ``manage.py anarchon COMMAND ARGS`` runs."""
    if command == "run":
        _check_run_options(args)
        return ["--log-level", log_level, "run", TARGET, *args]
    return ["--log-level", log_level, command, *args]


class Command(BaseCommand):
    """``manage.py anarchon run [--metrics-port PORT ...] | history JOB [-n N] | ...``"""

    help = (
        "Run the scheduler with every app's cron.py jobs ('run'), or any command of the "
        "'anarchon' CLI ('history JOB -n 20' ...) on the backend that settings.ANARCHON names."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """``--log-level``, the command and its arguments."""
        parser.add_argument(
            "--log-level",
            default="INFO",
            type=str.upper,
            choices=LEVELS,
            help="logging level when LOGGING configures no root handler (default INFO)",
        )
        parser.add_argument(
            "command",
            metavar="COMMAND",
            help=(
                "run, or a command of the anarchon CLI (history, jobs, instances, explain, pause, "
                "resume, trigger; see 'anarchon --help'), "
                "with the backend of settings.ANARCHON"
            ),
        )
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the command's arguments")

    def handle(self, *_: Any, **options: Any) -> None:
        """Run the ``anarchon`` command; exit with its exit code when it is not 0."""
        from anarchon.cli import main

        argv = cli_argv(options["command"], options["arguments"], options["log_level"])
        url = None if options["command"] == "run" else backend_url()
        with _backend_env(url):
            try:
                main(argv)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
