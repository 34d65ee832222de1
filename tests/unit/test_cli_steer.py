"""The steering commands' own parsing (times, durations, JOB or --all), without a backend; the
commands against real backends are in tests/conformance/test_cli_steering.py."""

from __future__ import annotations

import argparse

import pytest

from anarchon._cli.common import Exit
from anarchon._cli.steer import _job_or_all, parse_duration_ms, parse_time_ms
from anarchon.control import ALL_JOBS
from tests.unit.test_cli import cli, one_line_error


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30m", 1_800_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("45s", 45_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "30", "m", "2 hours", "1.5h", "-1h", "2026-01-01"])
def test_not_durations(text: str) -> None:
    assert parse_duration_ms(text) is None


def test_times_with_and_without_a_zone_and_epoch_ms() -> None:
    utc = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    assert parse_time_ms("2026-01-01T00:00:00Z", what="SLOT") == utc
    assert parse_time_ms("2026-01-01T02:00:00+02:00", what="SLOT") == utc
    assert parse_time_ms("2026-01-01T00:00:00", what="SLOT") == utc
    assert parse_time_ms("2026-01-01T02:00:00", "Europe/Athens", what="SLOT") == utc
    assert parse_time_ms(str(utc), what="SLOT") == utc
    with pytest.raises(Exit, match="SLOT 'noon' is not an ISO 8601 time") as info:
        parse_time_ms("noon", what="SLOT")
    assert info.value.code == 2


def _args(job: str | None, all_: bool) -> argparse.Namespace:
    return argparse.Namespace(job=job, all=all_)


def test_a_job_or_all_but_not_both_nor_neither() -> None:
    assert _job_or_all(_args("sync", False), "pause") == "sync"
    assert _job_or_all(_args(None, True), "pause") == ALL_JOBS
    for args, text in (
        (_args("sync", True), "not both"),
        (_args(None, False), "give a JOB, or --all"),
        (_args("*", False), "use --all"),
        (_args("bad name", False), "'bad name'"),
    ):
        with pytest.raises(Exit, match=text) as info:
            _job_or_all(args, "pause")
        assert info.value.code == 2


@pytest.mark.parametrize(
    "argv",
    [
        ("pause",),
        ("pause", "a", "--all"),
        ("resume",),
        ("explain", "sync"),
        ("trigger",),
    ],
)
def test_usage_errors_exit_2_before_touching_a_backend(argv: tuple[str, ...]) -> None:
    out = cli(*argv, "--backend", "sqlite:////nonexistent/x.db")
    one_line_error(out, 2)
