"""The steering and explain commands as an operator runs them: the real ``anarchon`` process on
every backend's real service (docs/operations.md, "Steering from the shell" and "Explaining a
slot").

Records are made in-process by claims (a run, a skipped slot, a missed slot) and an instance
record in the registry; the commands then read and write them through the backend's URL.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from anarchon import Trigger, steering
from anarchon._readable import iso_exact
from anarchon.backend import ClaimStatus
from anarchon.control import ALL_JOBS, Pause
from anarchon.registry import record_instance
from tests.conformance.cli import (
    BACKENDS,
    DEFINITION,
    JOB,
    ROOT,
    Shell,
    anarchon,
    as_json,
    claim,
    ok,
)
from tests.harness import Harness, Namespace
from tests.records import instance_record
from tests.web.cluster import Cluster

pytestmark = pytest.mark.timeout(300)


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
        ("requests",),
        ("cancel", "--job", JOB),
        ("cancel", "0" * 32),
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
    harness: Harness, shell: Shell, request: pytest.FixtureRequest
) -> None:
    slots = shell.slots
    ran = ok(shell.url, "explain", JOB, _iso(slots.ran))
    assert f"{JOB} @ " in ran and "ran, succeeded" in ran and "w0" in ran, ran
    skipped = ok(shell.url, "explain", JOB, str(slots.skipped))
    assert "skipped" in skipped and "too late: test" in skipped, skipped
    missed = as_json(shell.url, "explain", JOB, str(slots.missed))
    assert missed["fate"] == "missed" and "no instance carried" in missed["reason"], missed
    naive = datetime.fromtimestamp(slots.future / 1000, UTC).replace(tzinfo=None).isoformat()
    assert "+" not in naive and "Z" not in naive  # no zone: the job's (UTC)
    future = ok(shell.url, "explain", JOB, naive)
    assert "in the future" in future and "carried by: w0" in future, future
    unclaimed = as_json(shell.url, "explain", JOB, str(slots.unclaimed))
    assert unclaimed["fate"] == "no-record" and unclaimed["history_pruned"] is False, unclaimed
    not_a_slot = as_json(shell.url, "explain", JOB, str(slots.not_a_slot))
    assert not_a_slot["fate"] == "not-a-slot", not_a_slot
    assert not_a_slot["previous_slot_ms"] == slots.ran
    assert not_a_slot["next_slot_ms"] == slots.ran + 1000
    out = anarchon(shell.url, "explain", "other", str(slots.ran))
    assert out.returncode == 3 and "no live instance carries job 'other'" in out.stderr
    out = anarchon(shell.url, "explain", JOB, "yesterday")
    assert out.returncode == 2 and "'yesterday' is not an ISO 8601 time" in out.stderr


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_pause_resume_and_trigger(
    harness: Harness, shell: Shell, request: pytest.FixtureRequest
) -> None:
    [job] = as_json(shell.url, "jobs")["jobs"]
    assert job["paused"] is False and job["last_run"]["status"] == "missed", job

    said = ok(shell.url, "pause", JOB, "--by", "alice@ops")
    assert said.strip() == f"paused job {JOB!r} on every instance, until resumed (by alice@ops)"
    [job] = as_json(shell.url, "jobs")["jobs"]
    assert job["paused"] is True and job["pause"]["by"] == "alice@ops", job
    table = ok(shell.url, "jobs")
    assert "paused" in table and "alice@ops" in table, table
    assert all(len(line) <= 100 for line in table.splitlines()), table

    assert "resumed job 'sync'" in ok(shell.url, "resume", JOB)
    assert as_json(shell.url, "jobs")["jobs"][0]["paused"] is False
    assert "was not paused" in ok(shell.url, "resume", JOB)

    until = as_json(shell.url, "pause", "--all", "--until", "2h", "--by", "bob@ops")
    now = await shell.backend.server_time_ms()
    assert now is not None and until["job"] == "*"
    assert abs(until["until_ms"] - (now + 7_200_000)) < 60_000, until
    [job] = as_json(shell.url, "jobs")["jobs"]
    assert job["paused"] is True and job["pause"]["job"] == "*"
    assert "every job (the whole cluster)" in ok(shell.url, "jobs")
    assert ok(shell.url, "resume", "--all").startswith(
        "ended the whole-cluster pause (paused by bob"
    )

    printed = ok(shell.url, "trigger", JOB, "--by", "carol@ops").strip()
    assert re.fullmatch(r"[0-9a-f]{32}", printed), printed
    control = shell.backend.control()
    assert control is not None
    [stored] = [r for r in await control.requests([JOB]) if r.id == printed]
    assert stored.trigger is Trigger.MANUAL and stored.requested_by == "carol@ops"

    out = anarchon(shell.url, "pause")
    assert out.returncode == 2 and "give a JOB, or --all" in out.stderr
    out = anarchon(shell.url, "pause", JOB, "--until", "soon")
    assert out.returncode == 2 and "'soon'" in out.stderr
    out = anarchon(shell.url, "pause", JOB, "--until", "2001-01-01T00:00:00")
    assert out.returncode == 2 and "not in the future" in out.stderr
    out = anarchon(shell.url, "trigger", "unknown-job")
    assert out.returncode == 2 and "carries job 'unknown-job'" in out.stderr, out.stderr
    out = anarchon(shell.url, "trigger", "unknown-job", "--force")
    assert out.returncode == 0 and "no live instance carries job 'unknown-job'" in out.stderr


def _refused(url: str, said: str, *argv: str) -> None:
    """``anarchon ARGV`` exits 2 with one line naming the value and the rule, no traceback."""
    out = anarchon(url, *argv)
    assert out.returncode == 2, (argv, out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert said in out.stderr, (argv, out.stderr)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_times_out_of_range_exit_2_and_store_nothing(
    harness: Harness,
    shell: Shell,
) -> None:
    # Each was a traceback (exit 1, or 4 on PostgreSQL); the pauses were stored on SQLite and
    # NATS, and broke the instances, the commands and the dashboard that read them.
    now = await steering.backend_now_ms(shell.backend)
    rule = "a time is from 1970-01-01T00:00:00Z to 9998-12-31T23:59:59.999Z"
    micro, nano = str(now * 1000), str(now * 1_000_000)
    far = "is more than 10 years after"  # this host's clock: told before the backend opens
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
        _refused(shell.url, said, *argv)
    control = shell.backend.control()
    assert control is not None and await control.pauses() == []
    [job] = as_json(shell.url, "jobs")["jobs"]
    assert job["paused"] is False, job
    last = ok(shell.url, "explain", JOB, "9998-12-31T23:59:59Z")
    assert "in the future" in last, last


ATHENS = replace(DEFINITION, name="athens", expression="30 2 * * *", zone="Europe/Athens")
#: 2026-03-29T02:30 in Athens (+02:00): a slot of ATHENS; the clocks skip 03:00 to 04:00 then.
ATHENS_SLOT = 1_774_744_200_000
#: How a time without an offset is read, as the messages state the rule.
NAIVE_WORDS = "a time without an offset (no Z, no +02:00) is read in the time zone of the job"


@pytest.mark.parametrize("harness", ["sqlite", "postgres"], indirect=True)
async def test_a_time_without_an_offset_is_in_the_jobs_zone(
    harness: Harness,
    shell: Shell,
) -> None:
    """docs/operations.md, "Times on the command line": explain and pause --until read a time
    without an offset in the job's zone (pause --until read it in UTC), --all and a job no
    one carries refuse it, and every time printed reads back as the same instant."""
    now = await steering.backend_now_ms(shell.backend)
    registry, control = shell.backend.registry(), shell.backend.control()
    assert registry is not None and control is not None
    await record_instance(registry, instance_record("w1", ATHENS, beat=now))
    late = replace(claim(ATHENS_SLOT, skip_reason="too late: test"), job="athens")
    assert (await shell.backend.claim([late]))[0].status is ClaimStatus.SKIPPED
    # The slot as history prints it (with Z, one word) reads back as the same slot; it was
    # "2026-03-29 00:30:00.000", without an offset, so read in Athens: 22:30Z the day before.
    [row] = ok(shell.url, "history", "athens").splitlines()[1:]
    copied = row.split()[1]
    assert copied == "2026-03-29T00:30:00.000Z", row
    assert as_json(shell.url, "explain", "athens", copied)["slot_ms"] == ATHENS_SLOT
    # 02:30 as Athens shows it finds the slot; so does the local time explain prints.
    said = ok(shell.url, "explain", "athens", "2026-03-29T02:30")
    assert "athens @ 2026-03-29T00:30:00Z (2026-03-29T02:30:00+02:00 Europe/Athens)" in said
    fate = as_json(shell.url, "explain", "athens", "2026-03-29T02:30:00+02:00")
    assert (fate["slot_ms"], fate["fate"]) == (ATHENS_SLOT, "skipped"), fate
    # Twice on 2026-10-25 (04:00 back to 03:00): the first, and a note names the second.
    twice = as_json(shell.url, "explain", "athens", "2026-10-25T03:30")
    assert twice["slot_ms"] == 1_792_888_200_000, twice  # 00:30Z, +03:00
    assert "occurs twice in Europe/Athens" in twice["notes"][0], twice["notes"]
    assert "give 2026-10-25T03:30:00+02:00 for the second" in twice["notes"][0]
    # Skipped by the clocks: refused naming the value, the gap and the rule.
    gap = anarchon(shell.url, "explain", "athens", "2026-03-29T03:30")
    assert gap.returncode == 2 and NAIVE_WORDS in gap.stderr, gap.stderr
    assert "SLOT '2026-03-29T03:30' does not exist in Europe/Athens" in gap.stderr
    # pause --until: in the job's zone (it was UTC: two or three hours off).
    athens = ZoneInfo("Europe/Athens")
    noon = (datetime.now(athens) + timedelta(days=1)).replace(
        hour=12, minute=0, second=0, microsecond=0
    )
    text = noon.replace(tzinfo=None).isoformat()
    until = as_json(shell.url, "pause", "athens", "--until", text)["until_ms"]
    assert until == int(noon.timestamp()) * 1000, (text, until)
    ok(shell.url, "resume", "athens")
    # No one zone: every job, or a job no live instance carries. Nothing is stored.
    for why, argv in (
        ("--all is about every job, whatever their time zones", ("--all",)),
        ("no live instance carries job 'gone', so its time zone is unknown", ("gone",)),
    ):
        out = anarchon(shell.url, "pause", *argv, "--until", text)
        assert out.returncode == 2 and why in out.stderr, out.stderr
        assert f"--until {text!r} has no offset, and no job's time zone applies" in out.stderr
    assert await control.pauses() == []
    with_offset = as_json(shell.url, "pause", "--all", "--until", f"{text}Z")
    assert with_offset["until_ms"] == int(noon.replace(tzinfo=UTC).timestamp()) * 1000
    ok(shell.url, "resume", "--all")


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_a_bad_by_exits_2_and_stores_nothing(
    harness: Harness,
    shell: Shell,
) -> None:
    """``--by ''`` became user@host and ``--by $'x\\ny'`` was stored; ``by`` follows the
    rule of ``instance_id``: a non-empty, printable string of at most 256 characters."""
    rule = "must be a non-empty string of at most 256 characters"
    for said, argv in (
        (f"anarchon pause: --by='' {rule}", ("pause", JOB, "--by", "")),
        ("anarchon pause: --by='x\\ny' must be printable", ("pause", "--all", "--by", "x\ny")),
        (f"... (257 characters) {rule}", ("trigger", JOB, "--by", "x" * 257)),
    ):
        _refused(shell.url, said, *argv)
    control = shell.backend.control()
    assert control is not None
    assert await control.pauses() == [] and await control.requests([JOB]) == []


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_resuming_a_pause_that_ended_by_itself_says_it_was_not_paused(
    harness: Harness,
    shell: Shell,
) -> None:
    now = await steering.backend_now_ms(shell.backend)
    control = shell.backend.control()
    assert control is not None
    ended = Pause(job=JOB, by="alice@ops", at_ms=now - 2000, until_ms=now - 1000)
    await control.pause(ended)
    said = ok(shell.url, "resume", JOB).strip()
    until = iso_exact(now - 1000)  # to the millisecond, as `anarchon jobs` prints a slot
    assert said == f"job 'sync' was not paused: its pause by alice@ops ended at {until}", said
    assert await control.pauses() == []  # removed all the same
    await control.pause(ended)
    assert as_json(shell.url, "resume", JOB) == {"resumed": None, "still_paused": []}
    await control.pause(replace(ended, job=ALL_JOBS))
    said = ok(shell.url, "resume", "--all").strip()
    assert said.startswith("the whole cluster was not paused: its pause"), said


ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z")


def _ms(printed: str) -> int:
    return round(datetime.fromisoformat(printed).timestamp() * 1000)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_the_moments_pause_resume_and_jobs_print_paste_back_exactly(
    harness: Harness, shell: Shell
) -> None:
    # They were printed to the second: an `until` pasted back was up to 999 ms off the stored
    # one. Now as `anarchon jobs` prints a slot: milliseconds when there are some.
    said = ok(shell.url, "pause", JOB, "--until", "2h", "--by", "alice@ops").strip()
    [until] = ISO_UTC.findall(said)
    [job] = as_json(shell.url, "jobs")["jobs"]
    stored = job["pause"]
    assert _ms(until) == stored["until_ms"], (said, stored)
    pause_line = f"  {JOB}: by alice@ops since {iso_exact(stored['at_ms'])}, until {until}"
    assert pause_line in ok(shell.url, "jobs").splitlines()
    again = as_json(shell.url, "pause", JOB, "--until", until, "--by", "alice@ops")
    assert again["until_ms"] == stored["until_ms"], (again, stored)
    said = ok(shell.url, "resume", JOB).strip()
    [since] = ISO_UTC.findall(said)
    assert _ms(since) == again["at_ms"], (said, again)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_resume_all_names_every_job_still_paused_on_its_own(
    harness: Harness,
    shell: Shell,
) -> None:
    """``pause sync; pause --all; resume --all``: the whole-cluster pause ends and sync's own
    stays (docs/operations.md), and the output says so; it printed "resumed every job" and
    ``"still_paused": []`` while sync stayed paused. The pauses are read from the control
    store, so a loaded machine that lets the test's instance record age out changes nothing."""
    control = shell.backend.control()
    assert control is not None

    async def held() -> list[tuple[str, str]]:
        return [(p.job, p.by) for p in await control.pauses()]

    ok(shell.url, "pause", JOB, "--by", "alice@ops")
    ok(shell.url, "pause", "--all", "--by", "bob@ops")
    said = ok(shell.url, "resume", "--all").splitlines()
    assert said[0].startswith("ended the whole-cluster pause (paused by bob@ops since "), said
    assert said[1:] == [
        f"note: job {JOB!r} is still paused by alice@ops ('anarchon resume {JOB}' ends it)"
    ], said
    assert await held() == [(JOB, "alice@ops")]

    ok(shell.url, "pause", "--all", "--by", "bob@ops")
    answer = as_json(shell.url, "resume", "--all")
    assert answer["resumed"]["job"] == ALL_JOBS, answer
    assert [(p["job"], p["by"]) for p in answer["still_paused"]] == [(JOB, "alice@ops")], answer
    # Nothing left of the cluster's: it says so, and still names the job's own pause.
    said = ok(shell.url, "resume", "--all").splitlines()
    assert said[0] == "the whole cluster was not paused" and len(said) == 2, said
    assert "resumed job 'sync' (paused by alice@ops" in ok(shell.url, "resume", JOB)
    assert as_json(shell.url, "resume", "--all") == {"resumed": None, "still_paused": []}
    assert await held() == []
    help_text = ok(shell.url, "resume", "--help")
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
    harness: Harness, ns: Namespace, shell: Shell, tmp_path: Path
) -> None:
    """docs/operations.md: such an end reads as "until resumed" everywhere: instances claim
    (and skip) the job's slots, ``jobs``, ``explain`` and the dashboard answer."""
    slots = shell.slots
    now = await steering.backend_now_ms(shell.backend)
    # What an earlier version could store: epoch ns (SQLite and PostgreSQL keep 64 bits, the
    # NATS bucket any JSON number); on Redis, whose write named the end in the reason (so
    # failed past 9999), at most the last moment of 9999.
    ends = {
        "redis": [253_402_300_799_999],
        "nats": [now * 1_000_000, 10**20],
    }.get(harness.name, [now * 1_000_000])
    control = shell.backend.control()
    assert control is not None
    for n, end in enumerate(ends):
        await control.pause(_as_an_earlier_version_stored_it(end, now))
        # A restarted instance (PostgreSQL's start ends such a pause in the table: its claim
        # names the end with to_timestamp(), which failed on it, so every claim of the job did).
        fresh = ns.make()
        await fresh.start()
        try:
            lease = 15000 if fresh.is_lease_backend else 0
            [held] = await fresh.claim([claim(slots.unclaimed + n * 1000, lease_ms=lease)])
            assert held.status is ClaimStatus.SKIPPED, held
            assert held.run.reason is not None and held.run.reason.startswith("paused by old@ops")
            [read] = await fresh.control().pauses()  # type: ignore[union-attr]
            assert read.until_ms is None and read.by == "old@ops", read
        finally:
            await fresh.stop()
        [job] = as_json(shell.url, "jobs")["jobs"]
        assert job["paused"] is True and job["pause"]["until_ms"] is None, job
        assert "sync: by old@ops since" in ok(shell.url, "jobs")
        future = ok(shell.url, "explain", JOB, str(slots.future))
        assert "the job is paused by old@ops: this slot is skipped" in future, future
        if n == 0:
            _pages_answer(shell.url, tmp_path, "/", f"/jobs/{JOB}", "/?format=json")
        assert ok(shell.url, "resume", JOB).startswith("resumed job 'sync' (paused by old@ops")


@pytest.mark.parametrize("harness", ["nats"], indirect=True)
async def test_a_mistyped_nats_prefix_exits_3(
    harness: Harness, ns: Namespace, shell: Shell
) -> None:
    """The stream exists, but no scheduler ran under the URL's prefix (mistyped, or the default
    'cron.' where the schedulers use another): every command, the dashboard too, says "no
    anarchon data" with exit code 3 and names the prefix and the stream's subjects. It said
    "cannot be reached" (exit 4) after a server error, and the dashboard served 503 pages."""
    from tests.ports import any_free

    # shell: the stream, with the namespace's own prefix, a scheduler's record and runs (the
    # registry exists).
    prefix = str(ns.extra["prefix"])
    url = shell.url.replace(f"prefix={prefix}", "prefix=typo.")
    assert url != shell.url
    dashboard = ("dashboard", "--port", str(any_free()))
    for argv in (("jobs",), ("history", JOB), ("pause", JOB), ("trigger", JOB), dashboard):
        out = anarchon(url, *argv)
        assert out.returncode == 3, (argv, out.returncode, out.stdout, out.stderr)
        assert "no anarchon data at " in out.stderr, out.stderr
        assert "holds no subject under prefix 'typo.'" in out.stderr, out.stderr
        assert f"its subjects: {prefix}>" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
