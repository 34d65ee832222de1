"""The steering commands' own parsing (JOB or --all), without a backend; times and durations are
read by anarchon._times (tests/unit/test_times.py), and the commands against real backends are
in tests/conformance/test_cli_steering.py."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from anarchon._cli.common import Exit
from anarchon._cli.steer import _job_or_all
from anarchon.control import ALL_JOBS
from tests.unit.test_cli import cli, one_line_error


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
        ("cancel",),
        ("cancel", "xyz"),
    ],
)
def test_usage_errors_exit_2_before_touching_a_backend(argv: tuple[str, ...]) -> None:
    out = cli(*argv, "--backend", "sqlite:////nonexistent/x.db")
    one_line_error(out, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ("explain", "a.b", "2026-01-01T00:00:00Z"),
        ("trigger", "a.b"),
        ("trigger", "*"),
        ("pause", "a.b"),
        ("requests", "--job", "a.b"),
        ("cancel", "--job", "a.b"),
    ],
)
def test_a_bad_job_name_exits_2_naming_the_rule_before_touching_a_backend(
    argv: tuple[str, ...],
) -> None:
    # explain said "no live instance carries job 'a.b'" (exit 3) and trigger "no anarchon
    # data" (exit 3) before the name was ever checked.
    out = cli(*argv, "--backend", "sqlite:////nonexistent/x.db")
    one_line_error(out, 2, f"anarchon {argv[0]}: job name", "may contain only letters")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("explain", "sync", "notatime"), "SLOT 'notatime' is not an ISO 8601 time"),
        (("explain", "sync", "2026-02-30T00:00:00"), "SLOT '2026-02-30T00:00:00'"),
        (("explain", "sync", "9" * 23), "is out of range: a time is from 1970"),
        (("pause", "sync", "--until", "soon"), "--until 'soon' is not an ISO 8601 time"),
        (("pause", "--all", "--until", "1000000w"), "out of range: a time is from 1970"),
    ],
)
@pytest.mark.parametrize(
    "backend",
    ["sqlite:////nonexistent/x.db", "postgresql://127.0.0.1:1/none", "redis://127.0.0.1:1"],
)
def test_a_bad_time_exits_2_naming_it_whatever_the_cluster(
    argv: tuple[str, ...], said: str, backend: str
) -> None:
    # explain said "no live instance carries job" or "no anarchon data" (exit 3), or that the
    # backend cannot be reached (exit 4), before it read the time at all.
    out = cli(*argv, "--backend", backend)
    one_line_error(out, 2, f"anarchon {argv[0]}: ", said)


async def test_pause_until_is_parsed_once_and_the_registry_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``anarchon pause JOB --until TIME`` (every other option at its default) parses TIME once:
    the checks before the backend is opened and the reading in the job's zone on the backend's
    clock share it; and it reads the registry once, for the job's zone and the warning that no
    instance carries it. It parsed the text up to five times and read the registry twice."""
    from anarchon import steering
    from anarchon._cli import steer
    from anarchon.backends.sqlite import SQLiteBackend
    from anarchon.registry import JobDefinition, read_instances, record_instance
    from tests.records import instance_record

    path = tmp_path / "a.db"
    backend = SQLiteBackend(path)
    await backend.start()
    try:
        now = await steering.backend_now_ms(backend)
        athens = JobDefinition(name="athens", expression="30 2 * * *", zone="Europe/Athens")
        registry = backend.registry()
        assert registry is not None
        await record_instance(registry, instance_record("w0", athens, beat=now))
    finally:
        await backend.stop()
    parsed: list[str] = []
    reads: list[object] = []
    parse, read = getattr(steer, "parse_time", None), read_instances

    def counted_parse(text: str, **kw: Any) -> Any:
        parsed.append(text)
        assert parse is not None
        return parse(text, **kw)

    async def counted_read(*args: Any) -> Any:
        reads.append(args)
        return await read(*args)

    monkeypatch.setattr(steer, "parse_time", counted_parse, raising=False)
    monkeypatch.setattr(steer, "read_instances", counted_read)
    until = "2030-01-01T12:00"  # no offset: in Athens (+02:00 in winter)
    args = argparse.Namespace(
        job="athens", all=False, until=until, by=None, backend=f"sqlite:///{path}", json=True
    )
    assert await steer.pause(args) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["until_ms"] == int(datetime(2030, 1, 1, 10, tzinfo=UTC).timestamp()) * 1000
    assert (parsed, len(reads)) == ([until], 1)
