"""What the ``anarchon`` commands print for people (:mod:`anarchon._cli.output`): text from the
backend shown safely, one row per run, tables within 100 columns that keep what they promise,
and no crash on a terminal that cannot encode a character."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from anarchon import Run, RunStatus, SQLiteBackend, Trigger
from anarchon._cli import cluster
from anarchon._cli.cluster import JOB_FLOORS, JOB_HEADER, _job_row, _running_line
from anarchon._cli.output import WIDTH, say, shown, table
from anarchon._scheduler import default_instance_id
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.control import Pause
from anarchon.registry import ClusterView, JobDefinition, JobView, record_instance
from tests.records import instance_record

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "line1\nline2 \x1b[31mRED\x1b[0m \x1b]0;pwned\x07 tab\there \u202eevil ünïcødé"
SHOWN = "line1\\nline2 \\x1b[31mRED\\x1b[0m \\x1b]0;pwned\\x07 tab\\there \\u202eevil ünïcødé"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")
"""What must never reach the terminal raw (a newline only between lines)."""
INSTANCE = "vm-10342-50d1"
"""An id as default_instance_id() makes it on host 'vm': '<host>-<pid>-<4 hex>'."""
LONG_INSTANCE = "anarchon-worker-7d9f8b6c5d-x2k4z-1-ab12"
"""The same in a Kubernetes pod (its name as host name, pid 1)."""
ODD_INSTANCE = "w\n1\x1b[2J"
"""An id no Scheduler accepts, as a foreign or damaged registry could still hold it."""
ODD_JOB = "odd\x1b[2Jjob"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain text, ünïcødé ✓", "plain text, ünïcødé ✓"),
        ("a\nb\r\nc\td", "a\\nb\\r\\nc\\td"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("nul\x00 del\x7f csi\x9b", "nul\\x00 del\\x7f csi\\x9b"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("abc\u202edef\u2066x\u2069\u200f", "abc\\u202edef\\u2066x\\u2069\\u200f"),
        ("C:\\temp\\x1b", "C:\\temp\\x1b"),  # a backslash is shown as it is
        ("", ""),
    ],
)
def test_shown_writes_every_control_character_as_a_visible_escape(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert shown(expected) == expected


def test_say_keeps_its_lines_and_escapes_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    say("one\x1b[2J\ttwo\nthree\x07")
    say("to stderr\x9b", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "one\\x1b[2J\\ttwo\nthree\\x07\n"
    assert err == "to stderr\\x9b\n"


def test_a_table_cuts_nothing_that_fits_and_shows_every_cell_safely() -> None:
    lines = table(["a", "b"], [["x\ny", "z\x1b"], ["long" * 5, "-"]], floors=[3, 3])
    assert lines == ["a                     b", "x\\ny                  z\\x1b", "long" * 5 + "  -"]
    assert table(["a", "b"], [["x" * 200, "y"]], floors=None)[1] == "x" * 200 + "  y"


def test_a_line_past_100_columns_loses_characters_from_its_widest_cells_first() -> None:
    lines = table(["a", "b", "c"], [["x" * 200, "y" * 60, "z"]], floors=[10, 10, 1])
    assert all(len(line) <= WIDTH for line in lines), lines
    cells = lines[1].split()
    assert cells[0].endswith("~") and cells[1].endswith("~") and cells[2] == "z"
    # The two wide columns end up alike; neither is cut below its floor.
    assert abs(len(cells[0]) - len(cells[1])) <= 1
    # Each column gives up what it has above its floor, alike: 91 - 90 == 7 - 6.
    floored = table(["a", "b"], [["x" * 200, "y" * 200]], floors=[90, 6])
    assert [len(c) for c in floored[1].split()] == [91, 7]
    # Floors that pass 100 columns win over the width.
    assert [len(c) for c in table(["a"], [["x" * 200]], floors=[150])[1].split()] == [150]


@dataclass
class Seeded:
    url: str
    failed_ms: int
    skipped_ms: int


DEFINITION = JobDefinition(
    name="sync", expression="* * * * * *", zone="UTC", options={"jitter_ms": 0}
)


async def _seed(db: Path, *, odd_job: bool = True) -> Seeded:
    """Two live instances carrying ``sync`` (one id a default one, one odd; with ``odd_job``,
    the odd one carries a job named with an escape too), and runs whose texts hold control
    characters: an error, a skip reason, who asked, an instance; one attempt still running."""
    backend = SQLiteBackend(db)
    await backend.start()
    try:
        now = await backend.server_time_ms()
        assert now is not None
        second = now - now % 1000
        registry = backend.registry()
        assert registry is not None
        odd = JobDefinition(name=ODD_JOB, expression="0 0 * * *", zone="UTC")
        carried = (DEFINITION, odd) if odd_job else (DEFINITION,)
        for instance, jobs in ((INSTANCE, (DEFINITION,)), (ODD_INSTANCE, carried)):
            record = instance_record(instance, *jobs, beat=now, interval_ms=60_000)
            await record_instance(registry, replace(record, host="vm", pid=10342))

        def claim(
            slot: int, instance: str, skip_reason: str | None = None, by: str | None = None
        ) -> ClaimRequest:
            return ClaimRequest(
                job="sync",
                slot=slot,
                run_id=f"run{slot}",
                token=f"token{slot}",
                instance=instance,
                trigger=Trigger.SCHEDULE,
                lease_ms=60_000,
                skip_reason=skip_reason,
                requested_by=by,
            )

        [failed] = await backend.claim([claim(second - 9000, INSTANCE)])
        assert failed.ticket is not None
        await backend.finish(failed.ticket, "failed", f"ValueError: {HOSTILE}")
        [skipped] = await backend.claim([claim(second - 8000, ODD_INSTANCE, skip_reason=HOSTILE)])
        assert skipped.status is ClaimStatus.SKIPPED
        [asked] = await backend.claim([claim(second - 7000, INSTANCE, by=HOSTILE)])
        assert asked.ticket is not None
        await backend.finish(asked.ticket, "succeeded", None)
        [running] = await backend.claim([claim(second - 3000, INSTANCE)])
        assert running.ticket is not None and running.run.status is RunStatus.RUNNING
    finally:
        await backend.stop()
    return Seeded(f"sqlite:///{db}", second - 9000, second - 8000)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return asyncio.run(_seed(tmp_path_factory.mktemp("output") / "anarchon.db"))


def anarchon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``anarchon ARGS`` as a process writing UTF-8, or with ``env`` saying how to encode."""
    unset = ("PYTHONIOENCODING", "PYTHONUTF8", "PYTHONCOERCECLOCALE", "LC_ALL", "LC_CTYPE", "LANG")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "anarchon", "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT,
        env={**base, **(env or {"PYTHONIOENCODING": "utf-8"})},
        timeout=120,
    )


def shown_safely(out: subprocess.CompletedProcess[str]) -> list[str]:
    """The command succeeded, printing nothing a terminal obeys; its stdout's lines."""
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    for stream in (out.stdout, out.stderr):
        assert not RAW.search(stream), stream
    return out.stdout.splitlines()


def test_history_prints_one_line_per_run_with_its_texts_escaped(seeded: Seeded) -> None:
    lines = shown_safely(anarchon("history", "sync", "--backend", seeded.url))
    assert len(lines) == 1 + 4, lines  # the header and one line per run
    [failed] = [line for line in lines if "ValueError" in line]
    assert failed.endswith(f"ValueError: {SHOWN}") and INSTANCE in failed
    [skipped] = [line for line in lines if " skipped " in line]
    assert "  w\\n1\\x1b[2J  " in skipped and skipped.endswith(f"  {SHOWN}"), skipped
    [asked] = [line for line in lines if "asked by" in line]
    assert asked.endswith(f"(asked by {SHOWN})"), asked
    # --json keeps the exact texts (JSON escapes them).
    out = anarchon("history", "sync", "--backend", seeded.url, "--json")
    runs = {run["slot_ms"]: run for run in json.loads(out.stdout)["runs"]}
    assert runs[seeded.failed_ms]["error"] == f"ValueError: {HOSTILE}"
    assert runs[seeded.skipped_ms]["instance"] == ODD_INSTANCE
    assert runs[seeded.skipped_ms]["reason"] == HOSTILE


def test_explain_keeps_each_attempt_to_its_row_and_its_texts_escaped(seeded: Seeded) -> None:
    def explain(slot_ms: int, *more: str) -> subprocess.CompletedProcess[str]:
        return anarchon("explain", "sync", str(slot_ms), "--backend", seeded.url, *more)

    lines = shown_safely(explain(seeded.failed_ms))
    assert f"    #1: ValueError: {SHOWN}" in lines, lines
    lines = shown_safely(explain(seeded.skipped_ms))
    assert f"  reason: {SHOWN}" in lines, lines
    [row] = [line for line in lines if line.startswith("    1  slot")]
    assert "  w\\n1\\x1b[2J  " in row and row.endswith("skipped"), lines
    fate = json.loads(explain(seeded.skipped_ms, "--json").stdout)
    assert fate["reason"] == HOSTILE and fate["attempts"][0]["instance"] == ODD_INSTANCE
    # An error line names the registry's jobs: escaped too, still one line.
    out = anarchon("explain", "nosuch", "0", "--backend", seeded.url)
    assert out.returncode == 3 and not RAW.search(out.stderr), out.stderr
    assert "odd\\x1b[2Jjob" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_jobs_shows_the_running_attempt_and_its_age_with_a_default_instance_id(
    tmp_path: Path,
) -> None:
    seeded = asyncio.run(_seed(tmp_path / "anarchon.db", odd_job=False))
    lines = shown_safely(anarchon("jobs", "--backend", seeded.url))
    assert all(len(line) <= WIDTH for line in lines), lines
    [sync] = [line for line in lines if line.startswith("sync")]
    # docs/operations.md: the last run's instance (where) whole; the attempts running now,
    # `#attempt` and how long they ran, each below the table with its instance id whole.
    assert re.search(rf"  succeeded  \S+  {INSTANCE}  \S+ +#1 \d+(\.\d)?m?s$", sync), sync
    running = lines[lines.index("running now:") + 1]
    slot = ISO_UTC.pattern
    assert re.fullmatch(rf"  sync: #1 on {INSTANCE} for \d+(\.\d)?m?s \(slot {slot}\)", running)
    lines = shown_safely(anarchon("instances", "--backend", seeded.url))
    assert len(lines) == 1 + 2 and any(line.startswith("w\\n1\\x1b[2J ") for line in lines)


def _running(instance: str, now: int, attempt: int = 1) -> Run:
    return Run(
        job="sync",
        slot=datetime.fromtimestamp((now - 3_000) / 1000, UTC),
        run_id="r1",
        instance=instance,
        trigger=Trigger.SCHEDULE,
        attempt=attempt,
        status=RunStatus.RUNNING,
        started_at=datetime.fromtimestamp((now - 2_500) / 1000, UTC),
    )


def test_default_instance_ids_stay_whole_in_jobs_while_an_attempt_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The table cut the last run's instance (`vm-10431-aa~`) to make room for the running
    # attempt's (`vm-10432-85a2#1 195ms`), and cut that one in turn past 100 columns. Ids as
    # default_instance_id() makes them on host 'vm' with the largest pid Linux gives.
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(os, "getpid", lambda: 4_194_303)
    ran, runs = default_instance_id(), default_instance_id()
    now = 1_796_571_793_000
    began = _running(ran, now)
    done = began.started_at + timedelta(milliseconds=4)
    last = replace(began, status=RunStatus.SUCCEEDED, finished_at=done)
    report = JobView(
        name="report",
        definition=replace(DEFINITION, name="report", expression="0 6 * * *", zone="Europe/Athens"),
        instances=(ran, runs),
        next_slot_ms=now + 1000,
        last_run=last,
        running=(),
    )
    sync = replace(report, name="sync", definition=DEFINITION, running=(_running(runs, now),))
    lines = table(JOB_HEADER, [_job_row(report, now), _job_row(sync, now)], JOB_FLOORS)
    assert all(len(line) <= WIDTH for line in lines), lines
    assert all(f"  {ran}  " in line for line in lines[1:]), lines
    assert lines[2].endswith("  #1 2.5s"), lines
    slot = "2026-12-06T15:43:10Z"
    assert _running_line(sync.running[0], now) == f"sync: #1 on {runs} for 2.5s (slot {slot})"


def test_a_long_instance_id_is_whole_on_the_running_attempts_line() -> None:
    now = 1_796_571_793_000
    job = JobView(
        name="a-job-of-a-long-name",
        definition=replace(DEFINITION, zone="America/Argentina/Buenos_Aires"),
        instances=(LONG_INSTANCE,),
        next_slot_ms=now + 1000,
        last_run=None,
        running=(_running(LONG_INSTANCE, now, attempt=2),),
    )
    lines = table(JOB_HEADER, [_job_row(job, now)], JOB_FLOORS)
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[1].endswith("  #2 2.5s"), lines
    assert f" on {LONG_INSTANCE} for 2.5s " in _running_line(job.running[0], now)


def test_a_pod_name_in_where_is_never_cut(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Kubernetes pod's instance id (31 characters) in `where`, on a line already full (a long
    # job name, zone and running attempt): the table may cut it, so it is printed whole below,
    # as a running attempt's instance is.
    pod = "payments-worker-7d9f8b6c5-x2x9q"
    now = 1_796_571_793_000
    began = _running(pod, now)
    last = replace(
        began, job="a-job-of-a-long-name", status=RunStatus.SUCCEEDED, finished_at=began.started_at
    )
    job = JobView(
        name="a-job-of-a-long-name",
        definition=replace(DEFINITION, zone="America/Argentina/Buenos_Aires"),
        instances=(pod, LONG_INSTANCE),
        next_slot_ms=now + 1000,
        last_run=last,
        running=(_running(LONG_INSTANCE, now, attempt=2),),
    )
    view = ClusterView(now_ms=now, instances=(), definitions={}, drift=())

    async def read(url: str | None, *, with_jobs: bool) -> tuple[str, ClusterView, list[JobView]]:
        return "SQLiteBackend('x.db')", view, [job]

    monkeypatch.setattr(cluster, "read_cluster", read)
    assert asyncio.run(cluster.jobs(argparse.Namespace(backend=None, json=False))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    assert any(pod in line for line in lines), "the pod's instance id is cut everywhere"
    slot = "2026-12-06T15:43:10Z"
    assert f"  a-job-of-a-long-name: #1 succeeded on {pod} (slot {slot})" in lines, lines


async def _carried(db: Path, definition: JobDefinition) -> str:
    """A SQLite file where one live instance carries ``definition``; its URL."""
    backend = SQLiteBackend(db)
    await backend.start()
    try:
        now = await backend.server_time_ms()
        registry = backend.registry()
        assert now is not None and registry is not None
        record = instance_record(INSTANCE, definition, beat=now, interval_ms=60_000)
        await record_instance(registry, record)
    finally:
        await backend.stop()
    return f"sqlite:///{db}"


ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z")


def test_the_next_slot_jobs_prints_pasted_into_explain_and_pause_names_that_slot(
    tmp_path: Path,
) -> None:
    # `next` was a time of day within a day (`04:00:00`), else month-day and minutes
    # (`01-01 04:00`), with no date and no zone marker, where history prints ISO with Z: explain
    # and pause --until could not read it back (and a time without an offset is read in the
    # job's zone). Now the slot whole, in UTC with its Z. Every option at its default.
    athens = JobDefinition(name="report", expression="0 6 1 1 *", zone="Europe/Athens")
    url = asyncio.run(_carried(tmp_path / "anarchon.db", athens))
    lines = shown_safely(anarchon("jobs", "--backend", url))
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[0].split()[:5] == ["job", "schedule", "next", "last", "run"], lines
    pasted = ISO_UTC.findall(lines[1])
    assert len(pasted) == 1, lines
    shape = json.loads(anarchon("jobs", "--backend", url, "--json").stdout)
    next_ms = shape["jobs"][0]["next_slot_ms"]
    fate = json.loads(anarchon("explain", "report", pasted[0], "--backend", url, "--json").stdout)
    assert (fate["slot_ms"], fate["slot"], fate["is_slot"]) == (next_ms, pasted[0], True), fate
    out = anarchon("pause", "report", "--until", pasted[0], "--backend", url, "--json")
    assert json.loads(out.stdout)["until_ms"] == next_ms, out


async def _store_pause(db: Path, by: str) -> None:
    """A pause of ``sync`` stored as an earlier version (or another tool) could: ``--by`` now
    refuses control characters, but what is already stored must still be shown safely."""
    backend = SQLiteBackend(db)
    await backend.start()
    try:
        control = backend.control()
        assert control is not None
        now = await backend.server_time_ms()
        assert now is not None
        await control.pause(Pause(job="sync", by=by, at_ms=now))
    finally:
        await backend.stop()


def test_who_paused_is_escaped_by_jobs_and_resume(tmp_path: Path) -> None:
    seeded = asyncio.run(_seed(tmp_path / "anarchon.db"))
    refused = anarchon("pause", "sync", "--by", HOSTILE, "--backend", seeded.url)
    assert refused.returncode == 2 and "must be printable" in refused.stderr, refused
    assert "\\x1b" in refused.stderr and "\x1b" not in refused.stderr, refused
    asyncio.run(_store_pause(tmp_path / "anarchon.db", HOSTILE))
    jobs = shown_safely(anarchon("jobs", "--backend", seeded.url))
    assert any(line.startswith(f"  sync: by {SHOWN[:40]}") for line in jobs), jobs
    resumed = shown_safely(anarchon("resume", "sync", "--backend", seeded.url))
    assert resumed[0].startswith(f"resumed job 'sync' (paused by {SHOWN} since "), resumed


@pytest.mark.parametrize(
    ("command", "env"),
    [
        ("history", {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}),
        ("explain", {"PYTHONIOENCODING": "ascii"}),
    ],
)
def test_a_terminal_that_cannot_encode_a_character_gets_an_escape_not_a_crash(
    seeded: Seeded, command: str, env: dict[str, str]
) -> None:
    argv = {
        "history": ("history", "sync", "-n", "2"),
        "explain": ("explain", "sync", str(seeded.failed_ms)),
    }[command]
    out = anarchon(*argv, "--backend", seeded.url, env=env)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
    assert "\\xfcn\\xefc\\xf8d\\xe9" in out.stdout, out.stdout
