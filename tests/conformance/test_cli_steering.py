"""The steering and explain commands as an operator runs them: the real ``anarchon`` process on
every backend's real service (docs/operations.md, "Steering from the shell" and "Explaining a
slot").

Records are made in-process by claims (a run, a skipped slot, a missed slot) and an instance
record in the registry; the commands then read and write them through the backend's URL.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from anarchon import Backend, RunStatus, Trigger, steering
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.control import ALL_JOBS, Pause
from anarchon.registry import InstanceRecord, JobDefinition, record_instance
from tests.harness import Harness, Namespace
from tests.web.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgres", "redis", "nats"]
MINUTE = 60_000
JOB = "sync"
DEFINITION = JobDefinition(
    name=JOB,
    expression="* * * * * *",
    zone="UTC",
    options={"jitter_ms": 0, "max_late_ms": 5000, "lease_ms": 15000},
)


def anarchon(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``anarchon ARGV --backend URL`` as a process."""
    return subprocess.run(
        [sys.executable, "-m", "anarchon", "--log-level", "WARNING", *argv, "--backend", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(url: str, *argv: str) -> str:
    out = anarchon(url, *argv)
    assert out.returncode == 0, (argv, out.returncode, out.stdout, out.stderr)
    return out.stdout


def as_json(url: str, *argv: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(url, *argv, "--json"))
    return data


@pytest.fixture
async def started(ns: Namespace) -> AsyncIterator[Backend]:
    backend = ns.make()
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


class Slots:
    """Slots (every second) just before the backend's now: one ran, one skipped, one missed,
    one unclaimed; one ten minutes ahead; a moment between two slots."""

    def __init__(self, now_ms: int) -> None:
        second = now_ms - now_ms % 1000
        self.ran = second - 9000
        self.skipped = second - 8000
        self.missed = second - 7000
        self.unclaimed = second - 6000
        self.future = second + 10 * MINUTE
        self.not_a_slot = second - 9000 + 500


def _claim(slot: int, **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=JOB,
        slot=slot,
        run_id=f"run{slot}",
        token=f"token{slot}",
        instance="w0",
        trigger=Trigger.SCHEDULE,
        **kw,
    )


async def populate(backend: Backend) -> Slots:
    """An instance record carrying the job, and the records of three slots."""
    now = await backend.server_time_ms()
    assert now is not None
    slots = Slots(now)
    registry = backend.registry()
    assert registry is not None
    await record_instance(
        registry,
        InstanceRecord(
            id="w0",
            host="vm",
            pid=1,
            version="0.1.0",
            started_ms=now,
            heartbeat_ms=now,
            interval_ms=5000,
            clock_offset_ms=0,
            jobs=(DEFINITION,),
        ),
    )
    lease = 15000 if backend.is_lease_backend else 0
    [won] = await backend.claim([_claim(slots.ran, lease_ms=lease)])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    await backend.finish(won.ticket, "succeeded", None)
    [skip] = await backend.claim([_claim(slots.skipped, skip_reason="too late: test")])
    assert skip.status is ClaimStatus.SKIPPED
    gap = "no instance carried the job from 10:00 to 10:05 (test)"
    [miss] = await backend.claim(
        [_claim(slots.missed, skip_reason=gap, skip_status=RunStatus.MISSED)]
    )
    assert miss.status is ClaimStatus.SKIPPED
    return slots


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_no_data_exits_3_and_creates_nothing(harness: Harness, ns: Namespace) -> None:
    assert ns.url is not None
    for argv in (
        ("jobs",),
        ("instances",),
        ("history", JOB),
        ("explain", JOB, "2026-01-01T00:00:00Z"),
        ("pause", JOB),
        ("pause", "--all", "--until", "30m"),
        ("resume", JOB),
        ("trigger", JOB),
    ):
        out = anarchon(ns.url, *argv)
        assert out.returncode == 3, (argv, out.returncode, out.stdout, out.stderr)
        assert "no anarchon data at " in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    _assert_nothing_created(harness, ns)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_the_dashboard_command_exits_3_without_data(harness: Harness, ns: Namespace) -> None:
    """Like every other command: a missing SQLite file, PostgreSQL schema or NATS stream, or a
    Redis prefix where no scheduler recorded itself, ends it with exit code 3 (it served 503
    on every page before), and it creates nothing."""
    from tests.ports import any_free

    assert ns.url is not None
    port = str(any_free())
    out = subprocess.run(
        [sys.executable, "-m", "anarchon", "dashboard", "--port", port, "--backend", ns.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert "anarchon dashboard: no anarchon data at " in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    _assert_nothing_created(harness, ns)


def _assert_nothing_created(harness: Harness, ns: Namespace) -> None:
    import asyncio

    if harness.name == "sqlite":
        assert ns.url is not None
        assert not Path(ns.url.removeprefix("sqlite:///")).exists()
    elif harness.name == "postgres":
        import psycopg

        with psycopg.connect(str(ns.extra["dsn"])) as conn:
            row = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                (ns.extra["schema"],),
            ).fetchone()
        assert row is not None and row[0] == 0
    elif harness.name == "redis":
        from redis import Redis

        client = Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            assert list(client.scan_iter(match=f"{ns.extra['prefix']}*")) == []
        finally:
            client.close()
    elif harness.name == "nats":

        async def streams() -> list[str]:
            import nats

            nc = await nats.connect(str(ns.extra["server"]))
            try:
                return [str(i.config.name) for i in await nc.jetstream().streams_info()]
            finally:
                await nc.close()

        found = asyncio.run(streams())
        assert not [n for n in found if str(ns.extra["stream"]) in n], found


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_explain_says_each_fate(
    harness: Harness, ns: Namespace, started: Backend, request: pytest.FixtureRequest
) -> None:
    assert ns.url is not None
    slots = await populate(started)
    ran = ok(ns.url, "explain", JOB, _iso(slots.ran))
    assert f"{JOB} @ " in ran and "ran, succeeded" in ran and "w0" in ran, ran
    skipped = ok(ns.url, "explain", JOB, str(slots.skipped))
    assert "skipped" in skipped and "too late: test" in skipped, skipped
    missed = as_json(ns.url, "explain", JOB, str(slots.missed))
    assert missed["fate"] == "missed" and "no instance carried" in missed["reason"], missed
    naive = datetime.fromtimestamp(slots.future / 1000, UTC).replace(tzinfo=None).isoformat()
    assert "+" not in naive and "Z" not in naive  # no zone: the job's (UTC)
    future = ok(ns.url, "explain", JOB, naive)
    assert "in the future" in future and "carried by: w0" in future, future
    unclaimed = as_json(ns.url, "explain", JOB, str(slots.unclaimed))
    assert unclaimed["fate"] == "no-record" and unclaimed["history_pruned"] is False, unclaimed
    not_a_slot = as_json(ns.url, "explain", JOB, str(slots.not_a_slot))
    assert not_a_slot["fate"] == "not-a-slot", not_a_slot
    assert not_a_slot["previous_slot_ms"] == slots.ran
    assert not_a_slot["next_slot_ms"] == slots.ran + 1000
    out = anarchon(ns.url, "explain", "other", str(slots.ran))
    assert out.returncode == 3 and "no live instance carries job 'other'" in out.stderr
    out = anarchon(ns.url, "explain", JOB, "yesterday")
    assert out.returncode == 2 and "'yesterday' is not an ISO 8601 time" in out.stderr


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_pause_resume_and_trigger(
    harness: Harness, ns: Namespace, started: Backend, request: pytest.FixtureRequest
) -> None:
    assert ns.url is not None
    await populate(started)
    [job] = as_json(ns.url, "jobs")["jobs"]
    assert job["paused"] is False and job["last_run"]["status"] == "missed", job

    said = ok(ns.url, "pause", JOB, "--by", "alice@ops")
    assert said.strip() == f"paused job {JOB!r} on every instance, until resumed (by alice@ops)"
    [job] = as_json(ns.url, "jobs")["jobs"]
    assert job["paused"] is True and job["pause"]["by"] == "alice@ops", job
    table = ok(ns.url, "jobs")
    assert "paused" in table and "alice@ops" in table, table
    assert all(len(line) <= 100 for line in table.splitlines()), table

    assert "resumed job 'sync'" in ok(ns.url, "resume", JOB)
    assert as_json(ns.url, "jobs")["jobs"][0]["paused"] is False
    assert "was not paused" in ok(ns.url, "resume", JOB)

    until = as_json(ns.url, "pause", "--all", "--until", "2h", "--by", "bob@ops")
    now = await started.server_time_ms()
    assert now is not None and until["job"] == "*"
    assert abs(until["until_ms"] - (now + 7_200_000)) < 60_000, until
    [job] = as_json(ns.url, "jobs")["jobs"]
    assert job["paused"] is True and job["pause"]["job"] == "*"
    assert "every job (the whole cluster)" in ok(ns.url, "jobs")
    assert ok(ns.url, "resume", "--all").startswith("ended the whole-cluster pause (paused by bob")

    printed = ok(ns.url, "trigger", JOB, "--by", "carol@ops").strip()
    assert re.fullmatch(r"[0-9a-f]{32}", printed), printed
    control = started.control()
    assert control is not None
    [stored] = [r for r in await control.requests([JOB]) if r.id == printed]
    assert stored.trigger is Trigger.MANUAL and stored.requested_by == "carol@ops"

    out = anarchon(ns.url, "pause")
    assert out.returncode == 2 and "give a JOB, or --all" in out.stderr
    out = anarchon(ns.url, "pause", JOB, "--until", "soon")
    assert out.returncode == 2 and "'soon'" in out.stderr
    out = anarchon(ns.url, "pause", JOB, "--until", "2001-01-01T00:00:00")
    assert out.returncode == 2 and "not in the future" in out.stderr
    out = anarchon(ns.url, "trigger", "unknown-job")
    assert out.returncode == 0 and "no live instance carries job 'unknown-job'" in out.stderr


def _refused(url: str, said: str, *argv: str) -> None:
    """``anarchon ARGV`` exits 2 with one line naming the value and the rule, no traceback."""
    out = anarchon(url, *argv)
    assert out.returncode == 2, (argv, out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert said in out.stderr, (argv, out.stderr)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_times_out_of_range_exit_2_and_store_nothing(
    harness: Harness, ns: Namespace, started: Backend
) -> None:
    # Each was a traceback (exit 1, or 4 on PostgreSQL); the pauses were stored on SQLite and
    # NATS, and broke the instances, the commands and the dashboard that read them.
    assert ns.url is not None
    await populate(started)
    now = await steering.backend_now_ms(started)
    rule = "a time is from 1970-01-01T00:00:00Z to 9998-12-31T23:59:59.999Z"
    micro, nano = str(now * 1000), str(now * 1_000_000)
    far = "is more than 10 years after the backend's clock"
    for said, argv in (
        (f"--until '{micro}' is out of range: {rule}", ("pause", JOB, "--until", micro)),
        ("(epoch nanoseconds? divide by 1,000,000", ("pause", "--all", "--until", nano)),
        (rule, ("pause", JOB, "--until", "99999999999999999999")),
        (far, ("pause", JOB, "--until", "2100-01-01")),
        (rule, ("pause", JOB, "--until", "1000000w")),
        (f"SLOT '{'9' * 23}' is out of range: {rule}", ("explain", JOB, "9" * 23)),
        (f"'0001-01-01T00:00:00' is out of range: {rule}", ("explain", JOB, "0001-01-01T00:00:00")),
        (f"SLOT '253402300800000' is out of range: {rule}", ("explain", JOB, "253402300800000")),
    ):
        _refused(ns.url, said, *argv)
    control = started.control()
    assert control is not None and await control.pauses() == []
    [job] = as_json(ns.url, "jobs")["jobs"]
    assert job["paused"] is False, job
    last = ok(ns.url, "explain", JOB, "9998-12-31T23:59:59Z")
    assert "in the future" in last, last


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_a_bad_by_exits_2_and_stores_nothing(
    harness: Harness, ns: Namespace, started: Backend
) -> None:
    """``--by ''`` became user@host and ``--by $'x\\ny'`` was stored; ``by`` follows the
    rule of ``instance_id``: a non-empty, printable string of at most 256 characters."""
    assert ns.url is not None
    await populate(started)
    rule = "must be a non-empty string of at most 256 characters"
    for said, argv in (
        (f"anarchon pause: --by='' {rule}", ("pause", JOB, "--by", "")),
        ("anarchon pause: --by='x\\ny' must be printable", ("pause", "--all", "--by", "x\ny")),
        (f"... (257 characters) {rule}", ("trigger", JOB, "--by", "x" * 257)),
    ):
        _refused(ns.url, said, *argv)
    control = started.control()
    assert control is not None
    assert await control.pauses() == [] and await control.requests([JOB]) == []


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_resuming_a_pause_that_ended_by_itself_says_it_was_not_paused(
    harness: Harness, ns: Namespace, started: Backend
) -> None:
    assert ns.url is not None
    await populate(started)
    now = await steering.backend_now_ms(started)
    control = started.control()
    assert control is not None
    ended = Pause(job=JOB, by="alice@ops", at_ms=now - 2000, until_ms=now - 1000)
    await control.pause(ended)
    said = ok(ns.url, "resume", JOB).strip()
    until = datetime.fromtimestamp((now - 1000) // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert said == f"job 'sync' was not paused: its pause by alice@ops ended at {until}", said
    assert await control.pauses() == []  # removed all the same
    await control.pause(ended)
    assert as_json(ns.url, "resume", JOB) == {"resumed": None, "still_paused": []}
    await control.pause(replace(ended, job=ALL_JOBS))
    said = ok(ns.url, "resume", "--all").strip()
    assert said.startswith("the whole cluster was not paused: its pause"), said


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_resume_all_names_every_job_still_paused_on_its_own(
    harness: Harness, ns: Namespace, started: Backend
) -> None:
    """``pause sync; pause --all; resume --all``: the whole-cluster pause ends and sync's own
    stays (docs/operations.md), and the output says so; it printed "resumed every job" and
    ``"still_paused": []`` while sync stayed paused. The pauses are read from the control
    store, so a loaded machine that lets the test's instance record age out changes nothing."""
    assert ns.url is not None
    await populate(started)
    control = started.control()
    assert control is not None

    async def held() -> list[tuple[str, str]]:
        return [(p.job, p.by) for p in await control.pauses()]

    ok(ns.url, "pause", JOB, "--by", "alice@ops")
    ok(ns.url, "pause", "--all", "--by", "bob@ops")
    said = ok(ns.url, "resume", "--all").splitlines()
    assert said[0].startswith("ended the whole-cluster pause (paused by bob@ops since "), said
    assert said[1:] == [
        f"note: job {JOB!r} is still paused by alice@ops ('anarchon resume {JOB}' ends it)"
    ], said
    assert await held() == [(JOB, "alice@ops")]

    ok(ns.url, "pause", "--all", "--by", "bob@ops")
    answer = as_json(ns.url, "resume", "--all")
    assert answer["resumed"]["job"] == ALL_JOBS, answer
    assert [(p["job"], p["by"]) for p in answer["still_paused"]] == [(JOB, "alice@ops")], answer
    # Nothing left of the cluster's: it says so, and still names the job's own pause.
    said = ok(ns.url, "resume", "--all").splitlines()
    assert said[0] == "the whole cluster was not paused" and len(said) == 2, said
    assert "resumed job 'sync' (paused by alice@ops" in ok(ns.url, "resume", JOB)
    assert as_json(ns.url, "resume", "--all") == {"resumed": None, "still_paused": []}
    assert await held() == []
    help_text = ok(ns.url, "resume", "--help")
    assert "a job paused on its own stays paused" in " ".join(help_text.split()), help_text


def _pages_answer(url: str, tmp_path: Path, *pages: str) -> None:
    """``anarchon dashboard`` on ``url`` answers each page (200) naming the pause."""
    board = Cluster(url, tmp_path)
    try:
        board.serve(token=None)
        for page in pages:
            with urllib.request.urlopen(board.base + page, timeout=30) as response:
                body = response.read().decode()
                assert response.status == 200 and "old@ops" in body, (page, body[-500:])
    finally:
        board.stop()


def _as_an_earlier_version_stored_it(until_ms: int, now_ms: int) -> Pause:
    """A pause with an end no time holds, as versions that took any end stored it (a Pause
    made now reads such an end as none: it is set past that)."""
    pause = Pause(job=JOB, by="old@ops", at_ms=now_ms)
    object.__setattr__(pause, "until_ms", until_ms)
    return pause


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_a_pause_stored_with_an_end_no_time_holds_holds_until_resumed(
    harness: Harness, ns: Namespace, started: Backend, tmp_path: Path
) -> None:
    """docs/operations.md: such an end reads as "until resumed" everywhere: instances claim
    (and skip) the job's slots, ``jobs``, ``explain`` and the dashboard answer."""
    assert ns.url is not None
    slots = await populate(started)
    now = await steering.backend_now_ms(started)
    # What an earlier version could store: epoch ns (SQLite and PostgreSQL keep 64 bits, the
    # NATS bucket any JSON number); on Redis, whose write named the end in the reason (so
    # failed past 9999), at most the last moment of 9999.
    ends = {
        "redis": [253_402_300_799_999],
        "nats": [now * 1_000_000, 10**20],
    }.get(harness.name, [now * 1_000_000])
    control = started.control()
    assert control is not None
    for n, end in enumerate(ends):
        await control.pause(_as_an_earlier_version_stored_it(end, now))
        # A restarted instance (PostgreSQL's start ends such a pause in the table: its claim
        # names the end with to_timestamp(), which failed on it, so every claim of the job did).
        fresh = ns.make()
        await fresh.start()
        try:
            lease = 15000 if fresh.is_lease_backend else 0
            [held] = await fresh.claim([_claim(slots.unclaimed + n * 1000, lease_ms=lease)])
            assert held.status is ClaimStatus.SKIPPED, held
            assert held.run.reason is not None and held.run.reason.startswith("paused by old@ops")
            [read] = await fresh.control().pauses()  # type: ignore[union-attr]
            assert read.until_ms is None and read.by == "old@ops", read
        finally:
            await fresh.stop()
        [job] = as_json(ns.url, "jobs")["jobs"]
        assert job["paused"] is True and job["pause"]["until_ms"] is None, job
        assert "sync: by old@ops since" in ok(ns.url, "jobs")
        future = ok(ns.url, "explain", JOB, str(slots.future))
        assert "the job is paused by old@ops: this slot is skipped" in future, future
        if n == 0:
            _pages_answer(ns.url, tmp_path, "/", f"/jobs/{JOB}", "/?format=json")
        assert ok(ns.url, "resume", JOB).startswith("resumed job 'sync' (paused by old@ops")


@pytest.mark.parametrize("harness", ["nats"], indirect=True)
async def test_a_mistyped_nats_prefix_exits_3(harness: Harness, ns: Namespace) -> None:
    """The stream exists, but no scheduler ran under the URL's prefix (mistyped, or the default
    'cron.' where the schedulers use another): every command, the dashboard too, says "no
    anarchon data" with exit code 3 and names the prefix and the stream's subjects. It said
    "cannot be reached" (exit 4) after a server error, and the dashboard served 503 pages."""
    from tests.ports import any_free

    assert ns.url is not None
    backend = ns.make()
    await backend.start()  # the stream, with the namespace's own prefix
    try:
        await populate(backend)  # a scheduler's record and runs: the registry exists
    finally:
        await backend.stop()
    prefix = str(ns.extra["prefix"])
    url = ns.url.replace(f"prefix={prefix}", "prefix=typo.")
    assert url != ns.url
    dashboard = ("dashboard", "--port", str(any_free()))
    for argv in (("jobs",), ("history", JOB), ("pause", JOB), ("trigger", JOB), dashboard):
        out = anarchon(url, *argv)
        assert out.returncode == 3, (argv, out.returncode, out.stdout, out.stderr)
        assert "no anarchon data at " in out.stderr, out.stderr
        assert "holds no subject under prefix 'typo.'" in out.stderr, out.stderr
        assert f"its subjects: {prefix}>" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
