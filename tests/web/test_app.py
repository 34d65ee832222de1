"""The dashboard in process: pages, the JSON shapes, who may act (token, callable, CSRF), bad
input, and the pure parts (schedule in words, strips, timelines, explanations)."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from anarchon import (
    MemoryBackend,
    Run,
    RunContext,
    RunStatus,
    Scheduler,
    SkipCause,
    SQLiteBackend,
    Trigger,
)
from anarchon._times import LATEST_MS
from anarchon.backend import TOO_LATE, Backend, ClaimRequest
from anarchon.control import Pause
from anarchon.errors import BackendError, BackendUnavailable
from anarchon.registry import JobDefinition, build_view
from anarchon.web import dashboard
from anarchon.web._data import (
    FATES,
    MAX_WALK,
    Snapshot,
    fate_of,
    job_rows,
    recent_slots,
    schedule_in_words,
    timeline,
)
from tests.ports import any_free
from tests.records import instance_record, waiting_retry

pytestmark = pytest.mark.timeout(60)
TOKEN = "operator-token-123"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Reply:
    status: int
    body: str
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """Blocking HTTP calls run in a thread, so the server in this loop answers them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies: dict[str, str] = {}

    async def call(
        self,
        path: str,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        cookies: bool = True,
    ) -> Reply:
        def send() -> Reply:
            body = None if data is None else urllib.parse.urlencode(data).encode()
            request = urllib.request.Request(self.base + path, data=body)
            if body is not None:
                request.add_header("Content-Type", "application/x-www-form-urlencoded")
            for key, value in (headers or {}).items():
                request.add_header(key, value)
            if cookies and self.cookies:
                request.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in self.cookies.items()))
            opener = urllib.request.build_opener(_NoRedirect)
            try:
                response = opener.open(request, timeout=20)
            except urllib.error.HTTPError as exc:
                response = exc
            with response:
                for value in response.headers.get_all("set-cookie") or []:
                    name, _, rest = value.partition("=")
                    self.cookies[name] = rest.split(";")[0].strip('"')
                return Reply(
                    response.status, response.read().decode(), dict(response.headers.items())
                )

        return await asyncio.to_thread(send)

    def csrf(self) -> str:
        return self.cookies["anarchon_csrf"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Served:
    client: Client
    backend: MemoryBackend
    scheduler: Scheduler


async def _serve(token: Any, jobs: bool = True) -> AsyncIterator[Served]:
    backend = MemoryBackend()
    scheduler = Scheduler(backend, instance_id="w0", heartbeat_ms=200)

    async def ok(ctx: RunContext) -> None:
        pass

    async def bad(ctx: RunContext) -> None:
        raise RuntimeError("boom at postgresql://app:hunter2pw@db/x")

    if jobs:
        scheduler.add("every-second", "* * * * * *", ok)
        scheduler.add("failing", "* * * * * *", bad)
        scheduler.add("daily", "0 3 * * *", ok)
    port = any_free()
    app = dashboard(scheduler, token=token, refresh_ms=0)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with scheduler:
        task = asyncio.create_task(server.serve())
        await asyncio.sleep(2.2)  # uvicorn starts meanwhile
        assert server.started
        try:
            yield Served(Client(f"http://127.0.0.1:{port}"), backend, scheduler)
        finally:
            server.should_exit = True
            await task


@pytest.fixture
async def readonly() -> AsyncIterator[Served]:
    async for served in _serve(None):
        yield served


@pytest.fixture
async def guarded() -> AsyncIterator[Served]:
    async for served in _serve(TOKEN):
        yield served


ACTIONS = [
    "/jobs/every-second/pause",
    "/jobs/every-second/resume",
    "/jobs/every-second/trigger",
    "/jobs/every-second/cancel",
    "/all/pause",
    "/all/resume",
]


async def test_pages_render_and_show_no_secret(readonly: Served) -> None:
    client = readonly.client
    for path in (
        "/",
        "/?q=fail",
        "/?page=2&per=10",
        "/instances",
        "/jobs/failing",
        "/jobs/failing?range=1h&status=failed&trigger=schedule&instance=w0",
        "/jobs/every-second?range=365d",
        "/jobs/daily?from=0&to=86400000",
    ):
        reply = await client.call(path)
        assert reply.status == 200, (path, reply.body[:500])
        assert "hunter2pw" not in reply.body, path
        assert "default-src 'self'" in reply.headers["content-security-policy"]
    jobs = await client.call("/")
    assert len(re.findall(r'<tr class="job[ "]', jobs.body)) == 3
    assert '<script src="/static/app.js"' in jobs.body
    assert "data-action" not in jobs.body  # read-only: no buttons
    searched = await client.call("/?q=FAIL")
    assert 'data-job="failing"' in searched.body and 'data-job="daily"' not in searched.body
    for asset in ("/static/app.js", "/static/app.css"):
        assert (await client.call(asset)).status == 200
    failing = await client.call("/jobs/failing")
    assert "RuntimeError: boom at postgresql://app:***@db/x" in failing.body


async def test_json_shapes(readonly: Served) -> None:
    client = readonly.client
    data = (await client.call("/?format=json")).json()
    assert data["total"] == 3 and [j["name"] for j in data["jobs"]] == [
        "daily",
        "every-second",
        "failing",
    ]
    failing = data["jobs"][2]
    assert failing["last_run"]["status"] == "failed"
    assert "hunter2pw" not in json.dumps(data)
    assert len(failing["strip"]) == 50 and failing["strip"][-1]["fate"] in FATES
    slot = failing["last_run"]["slot_ms"]
    story = (await client.call(f"/jobs/failing/slots/{slot}?format=json")).json()
    assert story["kind"] == "failed" and story["attempts"][0]["status"] == "failed"
    assert "hunter2pw" not in json.dumps(story)
    panel = await client.call(f"/jobs/failing/slots/{slot}", headers={"X-Anarchon-Partial": "1"})
    assert panel.body.lstrip().startswith("<section") and 'data-kind="failed"' in panel.body


async def test_every_page_answers_json_clients_in_json(readonly: Served) -> None:
    """docs/dashboard.md: a client that asks for JSON gets every reply in JSON. A job's page and
    the instances page answered it with their HTML (200), the jobs page ignored Accept."""
    client = readonly.client
    asks: list[tuple[str, dict[str, str] | None]] = [("?format=json", None), ("", JSON)]
    for query, headers in asks:
        jobs = await client.call("/" + query, headers=headers)
        assert jobs.json()["total"] == 3, jobs.body[:200]
        job = (await client.call("/jobs/failing" + query, headers=headers)).json()
        assert job["job"] == "failing" and job["definition"]["expression"] == "* * * * * *"
        assert job["row"]["last_run"]["status"] == "failed" and job["runs"], job
        assert job["timeline"]["counts"].get("failed", 0) >= 1, job["timeline"]
        assert "hunter2pw" not in json.dumps(job)
        seen = (await client.call("/instances" + query, headers=headers)).json()
        [w0] = seen["instances"]
        assert w0["id"] == "w0" and w0["heartbeat_age_ms"] >= 0 and w0["warn_ms"] >= 250, w0
        assert seen["silent"] == [] and seen["drift"] == []


async def test_read_only_refuses_every_action(readonly: Served) -> None:
    client = readonly.client
    await client.call("/")
    for path in ACTIONS:
        reply = await client.call(path, {"csrf": client.csrf()})
        assert reply.status == 403, path
        assert "read-only" in reply.body
        bearer = await client.call(path, {}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status == 403, path
    assert await readonly.backend.control().pauses() == []
    assert (await client.call("/login")).status == 404


async def test_token_sign_in_csrf_and_actions(guarded: Served) -> None:
    client, control = guarded.client, guarded.backend.control()
    await client.call("/")
    for path in ACTIONS:  # not signed in
        assert (await client.call(path, {"csrf": client.csrf()})).status == 403, path
    wrong = await client.call("/login", {"csrf": client.csrf(), "token": "nope", "name": "x"})
    assert wrong.status == 403 and "not the operator token" in wrong.body
    no_csrf = await client.call("/login", {"token": TOKEN, "name": "alice"})
    assert no_csrf.status == 403
    signed = await client.call("/login", {"csrf": client.csrf(), "token": TOKEN, "name": "alice"})
    assert signed.status == 303 and "anarchon_operator" in client.cookies
    assert TOKEN not in client.cookies["anarchon_operator"]
    # Signed in, but without the CSRF token, with a wrong one, or from another site: refused.
    for data, headers in (
        ({}, {}),
        ({"csrf": "0" * 32}, {}),
        ({"csrf": client.csrf()}, {"Origin": "http://evil.example"}),
        ({"csrf": client.csrf()}, {"Origin": "null"}),
    ):
        reply = await client.call("/jobs/every-second/pause", data, headers=headers)
        assert reply.status == 403, (data, headers)
    assert await control.pauses() == []
    page = await client.call("/")
    assert 'data-action="pause"' in page.body and "data-operator>alice" in page.body
    paused = await client.call(
        "/jobs/every-second/pause",
        {"csrf": client.csrf(), "for_minutes": "15", "next": "/jobs/every-second"},
        headers={"Origin": client.base},
    )
    assert paused.status == 303
    assert paused.headers["location"].startswith("/jobs/every-second?msg=")
    assert "paused every-second for 15 min" in (await client.call(paused.headers["location"])).body
    [held] = await control.pauses()
    assert held.job == "every-second" and held.by == "alice@dashboard" and held.until_ms
    # Paused slots are recorded skipped, 'paused by alice@dashboard'.
    await asyncio.sleep(2.2)
    runs = await guarded.backend.history("every-second", 5)
    assert any((r.reason or "").startswith("paused by alice@dashboard") for r in runs)
    assert "data-paused" in (await client.call("/")).body
    resumed = await client.call("/jobs/every-second/resume", {"csrf": client.csrf()})
    assert resumed.status == 303 and await control.pauses() == []
    triggered = await client.call(
        "/jobs/daily/trigger", {"csrf": client.csrf()}, headers={"Accept": "application/json"}
    )
    assert triggered.status == 200 and triggered.json()["by"] == "alice@dashboard"
    # Stored for alice; the scheduler reads requests every second and may have run it already
    # (a request is removed only once its claim is recorded, so one of the two is found).
    pending = await control.requests(["daily"])
    if pending:
        [request] = pending
        assert request.trigger is Trigger.MANUAL and request.requested_by == "alice@dashboard"
    else:
        ran = await guarded.backend.history("daily", 5)
        assert [(r.trigger, r.requested_by) for r in ran] == [(Trigger.MANUAL, "alice@dashboard")]
    # The next page link never leaves the dashboard.
    away = await client.call("/all/pause", {"csrf": client.csrf(), "next": "//evil.example/"})
    assert away.headers["location"].startswith("/?msg=")
    await client.call("/all/resume", {"csrf": client.csrf()})
    # A script with the token as a bearer needs no cookie and no CSRF token.
    bearer = await client.call(
        "/jobs/failing/pause",
        {},
        headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"},
        cookies=False,
    )
    assert bearer.status == 200 and bearer.json()["by"] == "token@dashboard"
    bad = await client.call("/jobs/failing/pause", {"csrf": client.csrf(), "for_minutes": "x"})
    assert bad.status == 400 and "for_minutes=&#39;x&#39; must be a whole number" in bad.body
    # A pause whose end has passed no longer holds: resuming it says so (it said "resumed").
    now = int(time.time() * 1000)
    await control.pause(Pause(job="daily", by="bob@ops", at_ms=now - 2000, until_ms=now - 1000))
    ended = await client.call(
        "/jobs/daily/resume", {"csrf": client.csrf()}, headers={"Accept": "application/json"}
    )
    assert ended.status == 200 and ended.json()["done"] == "daily was not paused", ended.body
    unknown = await client.call("/jobs/failing/explode", {"csrf": client.csrf()})
    assert unknown.status == 400
    # The message named the class that carried it, and no action that exists.
    asks = {**BEARER, **JSON}
    unknown = await client.call("/jobs/failing/explode", {}, headers=asks, cookies=False)
    assert unknown.json()["error"] == (
        "unknown action 'explode' for failing: a job takes pause, resume, trigger and cancel; "
        "/all (every job) takes pause and resume"
    ), unknown.body
    every = await client.call("/all/trigger", {}, headers=asks, cookies=False)
    assert every.status == 400 and every.json()["error"].startswith(
        "unknown action 'trigger' for every job: a job takes pause, resume, trigger and cancel"
    ), every.body


async def test_host_callable_decides_who_acts() -> None:
    def who(request: Any) -> str | None:
        found: str | None = request.headers.get("x-user")
        return found

    async for served in _serve(who, jobs=True):
        client = served.client
        await client.call("/")
        denied = await client.call("/jobs/daily/pause", {"csrf": client.csrf()})
        assert denied.status == 403
        done = await client.call(
            "/jobs/daily/pause", {"csrf": client.csrf()}, headers={"X-User": "bob <script>"}
        )
        assert done.status == 303
        [held] = await served.backend.control().pauses()
        assert held.by == "bobscript@dashboard"


async def test_bad_requests_are_clear(readonly: Served) -> None:
    client = readonly.client
    for path, text in (
        ("/?per=3", "per=&#39;3&#39; must be a whole number from 10 to 500"),
        ("/jobs/daily?range=2y", "range=&#39;2y&#39; must be one of"),
        ("/jobs/daily/slots/abc", "slot &#39;abc&#39; is not an ISO 8601 time"),
        # Both answered 200 with an empty history ("No runs match the filters").
        ("/jobs/daily?status=ok", "status=&#39;ok&#39; must be one of succeeded, failed,"),
        ("/jobs/daily?trigger=cron", "trigger=&#39;cron&#39; must be one of schedule, manual,"),
    ):
        reply = await client.call(path)
        assert reply.status == 400 and text in reply.body, (path, reply.body[-400:])
    # Each answered 500 text/plain (ValueError: year out of range, OverflowError).
    rule = "a time is from 1970-01-01T00:00:00Z to 9998-12-31T23:59:59.999Z"
    for path, text in (
        ("/jobs/daily/slots/9007199254740992?format=json", "slot &#39;9007199254740992&#39;"),
        ("/jobs/daily/slots/253402300800000?format=json", "slot &#39;253402300800000&#39;"),
        ("/jobs/daily/slots/0001-01-01T00:00:00", "slot &#39;0001-01-01T00:00:00&#39;"),
        ("/jobs/daily?from=0&to=9007199254740992", "to &#39;9007199254740992&#39;"),
        ("/jobs/daily?from=-1&to=86400000", "from &#39;-1&#39; is not an ISO 8601 time"),
        ("/jobs/daily?end=9007199254740992&range=1h", "end &#39;9007199254740992&#39;"),
        ("/jobs/daily?end=1000&range=1h", "end=&#39;1000&#39; must be at least 3600000"),
        ("/jobs/daily?from=200&to=100", "from (200) must be before to (100)"),
    ):
        reply = await client.call(path)
        # ?format=json: the same message, in JSON (HTML-escaped on the page).
        body = reply.json()["error"] if "format=json" in path else html.unescape(reply.body)
        assert reply.status == 400 and html.unescape(text) in body, (path, reply.body[-400:])
        assert "out of range" not in text or rule in body
    for path in (
        f"/jobs/daily?from=0&to={LATEST_MS}",
        f"/jobs/daily?end={LATEST_MS}&range=365d",
        f"/jobs/daily/slots/{LATEST_MS}?format=json",
        "/jobs/daily?from=4102444800000&to=4102531200000",  # 2100: ZeroDivisionError before
        "/jobs/daily/slots/2026-01-01T03:00:00Z?format=json",
    ):
        reply = await client.call(path)
        assert reply.status == 200, (path, reply.body[-400:])
    story = (await client.call("/jobs/daily/slots/2026-01-01T03:00:00Z?format=json")).json()
    assert story["slot_ms"] == 1_767_236_400_000, story
    missing = await client.call("/jobs/nope")
    assert missing.status == 404 and "no live instance carries a job named" in missing.body


def test_dashboard_refuses_bad_arguments() -> None:
    with pytest.raises(TypeError, match="pass an anarchon Scheduler or Backend"):
        dashboard("sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 8 characters"):
        dashboard(MemoryBackend(), token="short")
    with pytest.raises(TypeError, match="must be None"):
        dashboard(MemoryBackend(), token=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="refresh_ms=-1"):
        dashboard(MemoryBackend(), refresh_ms=-1)


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("7 * * * *", "every hour at :07"),
        ("0 3 * * *", "every day at 03:00"),
        ("30 9 * * 1-5", "every weekday at 09:30"),
        ("0 0 * * 0", "every Sunday at 00:00"),
        ("15 2 1 * *", "on day 1 of every month at 02:15"),
        ("* * * * * *", "every second"),
        ("*/10 * * * * *", "every 10 seconds"),
        ("@hourly", "every hour at :00"),
        ("0 */2 * * *", "every 2 hours at :00"),
        ("1,2 3 * * *", None),
        ("0 3 * 1 *", None),
    ],
)
def test_schedule_in_words(expression: str, words: str | None) -> None:
    assert schedule_in_words(expression) == words


def _run(
    slot: int,
    status: RunStatus,
    attempt: int = 1,
    reason: str | None = None,
    cause: SkipCause | None = None,
) -> Run:
    moment = datetime.fromtimestamp(slot / 1000, UTC)
    return Run(
        job="j",
        slot=moment,
        run_id=f"r{slot}-{attempt}",
        instance="w0",
        trigger=Trigger.SCHEDULE,
        attempt=attempt,
        status=status,
        started_at=moment,
        finished_at=None if status is RunStatus.RUNNING else moment,
        reason=reason,
        skip_cause=cause,
    )


def test_fates() -> None:
    """A skip's fate is its skip cause (the reason's words are for people)."""
    skipped = RunStatus.SKIPPED
    assert fate_of(_run(0, RunStatus.SUCCEEDED)) == "succeeded"
    assert fate_of(_run(0, skipped, reason="paused by a@b", cause=SkipCause.PAUSED)) == "paused"
    assert fate_of(_run(0, skipped, reason="too late: w0", cause=SkipCause.TOO_LATE)) == "late"
    assert fate_of(_run(0, skipped, reason="behind: w0", cause=SkipCause.BEHIND)) == "late"
    assert fate_of(_run(0, skipped, reason="overlap: held", cause=SkipCause.OVERLAP)) == "skipped"
    assert fate_of(_run(0, RunStatus.MISSED, reason="no instance")) == "missed"


def test_timeline_cells_buckets_and_unread() -> None:
    minute = 60_000
    now = 1_800_000_000_000
    definition = JobDefinition(name="j", expression="* * * * *", zone="UTC")
    runs = [
        _run(now - 1 * minute, RunStatus.RUNNING),
        _run(now - 2 * minute, RunStatus.FAILED, attempt=2),
        _run(now - 2 * minute, RunStatus.FAILED, attempt=1),
        _run(now - 3 * minute, RunStatus.MISSED),
    ]
    line = timeline(definition, runs, now - 10 * minute, now, now, complete=True)
    fates = {c.slot_ms: c.fate for c in line.cells}
    assert len(line.cells) == 10 and not line.buckets
    assert fates[now - minute] == "running" and fates[now - 3 * minute] == "missed"
    assert fates[now - 4 * minute] == "none"
    assert [c.attempts for c in line.cells if c.slot_ms == now - 2 * minute] == [2]
    # Incomplete history: slots older than the oldest read are 'unread' buckets.
    partial = timeline(definition, runs, now - 24 * 60 * minute, now, now, complete=False)
    assert partial.buckets and partial.read_from_ms == now - 3 * minute
    assert partial.buckets[0].fate == "unread" and partial.buckets[-1].fate != "unread"
    # A year of a per-minute job: the walk stops at MAX_WALK slots.
    year = timeline(definition, [], now - 365 * 1440 * minute, now, now, complete=True)
    assert year.capped and year.slots == MAX_WALK and len(year.buckets) == 240


def test_recent_slots() -> None:
    from anarchon import CronSchedule

    now = 1_800_000_000_000
    assert len(recent_slots(CronSchedule("* * * * * *"), now, 50)) == 50
    yearly = recent_slots(CronSchedule("0 0 1 1 *"), now, 50)
    assert len(yearly) == 50 and yearly[-1] <= now and yearly == sorted(yearly)


def test_templates_and_assets_are_package_data() -> None:
    """Every file the dashboard serves is matched by pyproject's package-data patterns."""
    import fnmatch
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["anarchon"]
    package = ROOT / "src" / "anarchon"
    files = [
        p.relative_to(package).as_posix()
        for folder in ("web/templates", "web/static")
        for p in (package / folder).iterdir()
    ]
    assert files
    unmatched = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not unmatched


def test_no_cdn_or_outside_address() -> None:
    folder = ROOT / "src" / "anarchon" / "web"
    for path in [*folder.glob("templates/*"), *folder.glob("static/*")]:
        text = path.read_text()
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", text), path
        assert "@import" not in text and "url(http" not in text, path


def test_cli_parts(tmp_path: Path) -> None:
    import subprocess
    import sys

    def command(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "anarchon", "dashboard", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    nothing = command("--backend", f"sqlite:///{tmp_path / 'none.db'}")
    assert nothing.returncode == 3 and "no anarchon data at" in nothing.stderr
    assert not (tmp_path / "none.db").exists()
    short = tmp_path / "token"
    short.write_text("abc\n")
    refused = command("--backend", "sqlite:///x.db", "--token-file", str(short))
    assert refused.returncode == 2 and "holds 3 characters" in refused.stderr
    port = command("--port", "70000")
    assert port.returncode == 2 and "port number from 1 to 65535" in port.stderr


def test_a_port_the_dashboard_cannot_listen_on_exits_2_not_3(tmp_path: Path) -> None:
    """A port already taken ended the command with uvicorn's exit code 3, which means "no
    anarchon data" here; it is a bad option, 2, as 'anarchon run --metrics-port' says."""
    import socket
    import subprocess
    import sys

    db = tmp_path / "cron.db"
    asyncio.run(_one_run_in(db))
    env = {**os.environ, "ANARCHON_BACKEND": f"sqlite:///{db}"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "anarchon", "dashboard", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    assert out.returncode == 2, (out.returncode, out.stderr)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"anarchon dashboard: cannot listen on 127.0.0.1:{port}"), out.stderr
    assert "Traceback" not in out.stderr


async def _one_run_in(db: Path) -> None:
    async with Scheduler(SQLiteBackend(db)) as scheduler:
        scheduler.add("noop", "@daily", lambda ctx: None)
        await scheduler.run_now("noop")


@pytest.mark.parametrize(("stop", "code"), [("SIGINT", 130), ("SIGTERM", 0)])
def test_a_signal_ends_the_dashboard_command_without_a_traceback(
    tmp_path: Path, stop: str, code: int
) -> None:
    """Ctrl-C (SIGINT) exits 130, as a shell reports an interrupted command; SIGTERM, the stop
    systemd and Kubernetes send, is a clean stop: 0, as ``anarchon run`` exits."""
    import signal

    from tests.web.cluster import Cluster

    db = tmp_path / "anarchon.db"
    asyncio.run(_one_run_in(db))  # the file holds anarchon's tables
    served = Cluster(f"sqlite:///{db}", tmp_path)
    try:
        served.serve(token=None)  # the `anarchon dashboard` command, answering
        served.procs["dashboard"].send_signal(getattr(signal, stop))
        ended = served.procs["dashboard"].wait(30)
    finally:
        served.stop()
    text = (tmp_path / "dashboard.log").read_text()
    # uvicorn stops, then raises the signal it caught again: SIGINT as a KeyboardInterrupt out
    # of main(), SIGTERM into the command's own handler (not the default one: exit 143).
    assert ended == code and "Traceback" not in text, (ended, text)
    assert f"anarchon dashboard on {served.base}/" in text, text


def test_fast_view_matches_build_view() -> None:
    from anarchon.registry import InstanceRecord, build_view
    from anarchon.web._data import fast_view

    def record(name: str, *jobs: JobDefinition) -> InstanceRecord:
        return instance_record(name, *jobs, beat=0, clock_offset_ms=None, version="v")

    a = JobDefinition(name="a", expression="*/2 * * * *", zone="UTC", options={"lease_ms": 1})
    a2 = JobDefinition(name="a", expression="*/3  * * * *", zone="UTC", options={"lease_ms": 1})
    a_spaced = JobDefinition(
        name="a", expression="*/2  *  * * *", zone="UTC", options={"lease_ms": 1}
    )
    b = JobDefinition(name="b", expression="0 3 * * *", zone="Europe/Paris")
    b_true = JobDefinition(
        name="b", expression="0 3 * * *", zone="Europe/Paris", options={"x": True}
    )
    b_one = JobDefinition(name="b", expression="0 3 * * *", zone="Europe/Paris", options={"x": 1})
    cases = [
        [record("w1", a, b), record("w0", a_spaced, b)],
        [record("w0", a, b), record("w1", a2, b), record("w2", a2)],
        [record("w0", b_true), record("w1", b_one)],
        [],
    ]
    for instances in cases:
        fast, exact = fast_view(instances, 5), build_view(instances, 5)
        assert fast == exact


async def test_mounted_under_a_prefix() -> None:
    """docs/dashboard.md: ``app.mount("/cron", dashboard(scheduler, token=...))`` in a
    Starlette (or FastAPI) app: links, assets, cookies and redirects stay under the prefix."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    backend = MemoryBackend()
    scheduler = Scheduler(backend, instance_id="w0", heartbeat_ms=200)

    async def report(ctx: RunContext) -> None:
        pass

    scheduler.add("report", "*/2 * * * * *", report)
    app = Starlette(routes=[Mount("/cron", app=dashboard(scheduler, token=lambda r: "carol"))])
    port = any_free()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with scheduler:
        task = asyncio.create_task(server.serve())
        await asyncio.sleep(1.5)
        try:
            client = Client(f"http://127.0.0.1:{port}")
            page = await client.call("/cron/")
            assert page.status == 200
            assert 'href="/cron/jobs/report"' in page.body
            assert 'src="/cron/static/app.js"' in page.body
            assert "Path=/cron/" in page.headers["set-cookie"]
            assert (await client.call("/cron/static/app.css")).status == 200
            done = await client.call(
                "/cron/jobs/report/pause", {"csrf": client.csrf(), "next": "/cron/jobs/report"}
            )
            assert done.status == 303 and done.headers["location"].startswith("/cron/jobs/report?")
            [held] = await backend.control().pauses()
            assert held.by == "carol@dashboard"
        finally:
            server.should_exit = True
            await task


BEARER = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Accept": "application/json"}


async def _expect_json_error(
    client: Client,
    path: str,
    status: int,
    text: str,
    data: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    reply = await client.call(path, data, headers=headers, cookies=False)
    assert reply.status == status, (path, reply.status, reply.body[:300])
    assert reply.headers["content-type"] == "application/json", (path, reply.headers)
    body = reply.json()
    assert body["ok"] is False and text in body["error"], (path, body)


async def test_json_clients_get_every_error_as_json(guarded: Served) -> None:
    """?format=json or Accept: application/json: errors in JSON, with the page's message; a
    bad job name is 400 naming the rule on every route, an unknown job 404 on every route."""
    client = guarded.client
    rule = "job name 'a b' may contain only letters, digits, '_' and '-'"
    unknown = "no live instance carries a job named 'nosuch' and it has no history"
    form = "application/x-www-form-urlencoded"
    for path, status, text, data, headers in (
        ("/jobs/a%20b/pause", 400, rule, {}, {**BEARER, **JSON}),
        ("/jobs/a%20b/trigger?format=json", 400, rule, {}, BEARER),
        ("/jobs/a%20b", 400, rule, None, JSON),
        ("/jobs/a%20b/slots/0?format=json", 400, rule, None, {}),
        ("/jobs/nosuch", 404, unknown, None, JSON),
        ("/jobs/nosuch/slots/0?format=json", 404, unknown, None, {}),
        ("/jobs/daily/pause", 400, "for_minutes", {"for_minutes": "-1"}, {**BEARER, **JSON}),
        ("/jobs/daily/pause", 400, "for_minutes", {"for_minutes": "abc"}, {**BEARER, **JSON}),
        ("/jobs/daily/explode", 400, "unknown action 'explode'", {}, {**BEARER, **JSON}),
        ("/all/trigger", 400, "unknown action 'trigger'", {}, {**BEARER, **JSON}),
        (
            "/jobs/daily/pause",
            400,
            f"send {form}",
            {"for_minutes": "1"},
            {**BEARER, **JSON, "Content-Type": "application/json"},
        ),
        ("/?per=3&format=json", 400, "per=", None, {}),
        ("/nowhere?format=json", 404, "Not Found", None, {}),
        ("/jobs/daily/pause", 405, "Method Not Allowed", None, JSON),
    ):
        await _expect_json_error(client, path, status, text, data, headers)
    assert await guarded.backend.control().pauses() == []
    # A browser still gets the pages, with the same status and message.
    for path, status, data in (
        ("/jobs/a%20b/pause", 400, {}),
        ("/jobs/a%20b", 400, None),
        ("/jobs/a%20b/slots/0", 400, None),
        ("/jobs/nosuch/slots/0", 404, None),
    ):
        reply = await client.call(path, data, headers=BEARER, cookies=False)
        assert reply.status == status, (path, reply.status, reply.body[:300])
        assert reply.headers["content-type"].startswith("text/html"), path
    assert "only letters, digits" in (await client.call("/jobs/a%20b")).body


async def test_a_read_only_dashboard_answers_json_clients_in_json(readonly: Served) -> None:
    client = readonly.client
    await _expect_json_error(client, "/login", 404, "no operator token", None, JSON)
    await _expect_json_error(client, "/all/pause?format=json", 403, "read-only", {}, BEARER)


async def test_steering_a_job_no_live_instance_carries_warns(guarded: Served) -> None:
    """As 'anarchon trigger' and 'anarchon pause' warn on stderr, the dashboard says it: in the
    JSON reply's warning, and on the page it sends the browser back to."""
    client = guarded.client
    asks = {**BEARER, **JSON}
    # force=1: no instance in the registry carries it either (refused without: see below).
    forced = {"force": "1"}
    triggered = await client.call("/jobs/nosuchjob2/trigger", forced, headers=asks, cookies=False)
    assert triggered.status == 200 and triggered.json()["warning"] == (
        "no live instance carries job 'nosuchjob2': the request waits until one does"
    )
    paused = await client.call("/jobs/nosuchjob2/pause", {}, headers=asks, cookies=False)
    assert paused.status == 200 and paused.json()["warning"] == (
        "no live instance carries job 'nosuchjob2': the pause holds once one carries it"
    )
    resumed = await client.call("/jobs/nosuchjob2/resume", {}, headers=asks, cookies=False)
    assert resumed.json()["warning"] is None
    carried = await client.call("/jobs/daily/trigger", {}, headers=asks, cookies=False)
    assert carried.status == 200 and carried.json()["warning"] is None
    everything = await client.call("/all/pause", {}, headers=asks, cookies=False)
    assert everything.json()["warning"] is None
    await client.call("/all/resume", {}, headers=asks, cookies=False)
    page = await client.call(
        "/jobs/nosuchjob2/trigger",
        {"next": "/jobs/daily", **forced},
        headers=BEARER,
        cookies=False,
    )
    assert page.status == 303
    location = page.headers["location"]
    assert location.startswith("/jobs/daily?msg="), location
    shown = await client.call(location)  # the browser keeps the cookie the redirect set
    assert "data-warning>no live instance carries job &#39;nosuchjob2&#39;" in shown.body


async def test_trigger_refuses_a_job_no_instance_in_the_registry_carries_as_the_command_does(
    guarded: Served,
) -> None:
    """The dashboard's Trigger of a job that no instance in the registry carries only warned
    (and stored a request that waits for ever), while `anarchon trigger` refuses it (exit 2)
    unless --force. Now the same rule and words: 409 unless force=1, and such a job's page
    offers "Trigger anyway". Every option at its default but the token."""
    from anarchon import steering
    from anarchon.registry import trigger_refusal
    from anarchon.testing._requests import request

    client, backend = guarded.client, guarded.backend
    asks = {**BEARER, **JSON}
    registry = backend.registry()
    assert registry is not None
    words = await trigger_refusal(registry, "dailly")
    assert words == (
        "no instance in the registry carries job 'dailly' (did you mean 'daily'?): a request is "
        "stored only for a job that a live or recently stopped instance defines (else it waits "
        "until one is deployed)"
    )
    refused = await client.call("/jobs/dailly/trigger", {}, headers=asks, cookies=False)
    assert refused.status == 409, refused.body
    assert refused.json()["error"] == (
        f"{words}; 'Trigger anyway' (the form field force=1) stores it anyway"
    )
    assert await steering.pending_requests(backend, "dailly") == []
    forced = await client.call("/jobs/dailly/trigger", {"force": "1"}, headers=asks, cookies=False)
    assert forced.status == 200 and forced.json()["warning"] == (
        "no live instance carries job 'dailly': the request waits until one does"
    )
    assert len(await steering.pending_requests(backend, "dailly")) == 1
    carried = await client.call("/jobs/daily/trigger", {}, headers=asks, cookies=False)
    assert carried.status == 200 and carried.json()["warning"] is None
    # A job with records that no instance carries: its page offers "Trigger anyway" only.
    now = int(time.time() * 1000)
    await backend.claim([request("retired", now - now % 60_000, skip_reason=LATE_WORDS)])
    await client.call("/")
    signed = await client.call("/login", {"csrf": client.csrf(), "token": TOKEN, "name": "alice"})
    assert signed.status == 303
    page = await client.call("/jobs/retired")
    assert 'data-action="trigger anyway"' in page.body, page.body[-3000:]
    assert '<input type="hidden" name="force" value="1">' in page.body
    assert 'data-action="trigger"' not in page.body
    retired = await trigger_refusal(registry, "retired")
    assert retired is not None and retired.replace("'", "&#39;") in page.body  # data-confirm
    shape = (await client.call("/jobs/retired?format=json")).json()
    assert shape["trigger_refusal"] == retired
    daily = await client.call("/jobs/daily")
    assert 'data-action="trigger"' in daily.body and 'name="force"' not in daily.body
    assert (await client.call("/jobs/daily?format=json")).json()["trigger_refusal"] is None


async def test_a_time_a_page_shows_pasted_back_names_the_same_slot(readonly: Served) -> None:
    """The pages cut every time to the second while a slot is a time in ms: a slot at .250
    was shown as :00Z, which pasted into an address (or `explain`) named another instant. Now
    shown as `explain` prints it, milliseconds when there are some. Every option at its
    default."""
    client = readonly.client
    for slot, shown in (
        (_utc_ms(2026, 3, 29, 0, 30) + 250, "2026-03-29T00:30:00.250Z"),
        (_utc_ms(2026, 3, 29, 3, 0), "2026-03-29T03:00:00Z"),
    ):
        page = await client.call(f"/jobs/daily/slots/{slot}")
        assert page.status == 200, page.body[-500:]
        assert f"<h2>daily · {shown}" in page.body, page.body[-1500:]
        copied = urllib.parse.quote(shown, safe="")
        back = (await client.call(f"/jobs/daily/slots/{copied}?format=json")).json()
        assert (back["slot_ms"], back["slot"]) == (slot, shown), back


async def test_resume_all_names_each_job_still_paused_on_its_own(guarded: Served) -> None:
    """The "Resume all" button ends the whole-cluster pause and no job's own
    (docs/operations.md); its reply said "resumed every job" while such a job stayed paused."""
    client = guarded.client
    asks = {**BEARER, **JSON}
    await client.call("/jobs/daily/pause", {}, headers=asks, cookies=False)
    await client.call("/all/pause", {}, headers=asks, cookies=False)
    resumed = await client.call("/all/resume", {}, headers=asks, cookies=False)
    assert resumed.json()["done"] == (
        "ended the whole-cluster pause; still paused on their own: daily"
    ), resumed.body
    again = await client.call("/all/resume", {}, headers=asks, cookies=False)
    assert again.json()["done"] == (
        "the whole cluster was not paused; still paused on their own: daily"
    ), again.body
    await client.call("/jobs/daily/resume", {}, headers=asks, cookies=False)
    await client.call("/all/pause", {}, headers=asks, cookies=False)
    alone = await client.call("/all/resume", {}, headers=asks, cookies=False)
    assert alone.json()["done"] == "ended the whole-cluster pause", alone.body
    assert await guarded.backend.control().pauses() == []


async def test_resuming_a_job_says_when_the_whole_cluster_pause_still_holds_it(
    guarded: Served,
) -> None:
    """ "Resume" of a job under a whole-cluster pause said "resumed daily" (or "daily was not
    paused") while its slots stayed skipped; 'anarchon resume daily' notes the cluster's."""
    client = guarded.client
    asks = {**BEARER, **JSON}
    await client.call("/jobs/daily/pause", {}, headers=asks, cookies=False)
    await client.call("/all/pause", {}, headers=asks, cookies=False)
    still = "it is still paused with every job by token@dashboard ('Resume all' ends it)"
    resumed = await client.call("/jobs/daily/resume", {}, headers=asks, cookies=False)
    assert resumed.json()["done"] == f"resumed daily; {still}", resumed.body
    again = await client.call("/jobs/daily/resume", {}, headers=asks, cookies=False)
    assert again.json()["done"] == f"daily was not paused on its own; {still}", again.body
    await client.call("/all/resume", {}, headers=asks, cookies=False)
    alone = await client.call("/jobs/daily/resume", {}, headers=asks, cookies=False)
    assert alone.json()["done"] == "daily was not paused", alone.body
    assert await guarded.backend.control().pauses() == []


async def test_an_action_does_not_carry_an_earlier_actions_warning_along(guarded: Served) -> None:
    """A form returns to the page it was on, whose address held the last action's message: the
    warning of a trigger of a job no instance carries came back under every later action."""
    client = guarded.client
    await client.call("/")
    warned = await client.call("/jobs/nosuchjob3/trigger", {"force": "1"}, headers=BEARER)
    old = warned.headers["location"].partition("?msg=")[2]
    page = await client.call(f"/jobs/daily?range=6h&msg={old}", headers=BEARER)
    assert 'name="next" value="/jobs/daily?range=6h"' in page.body, page.body[-2000:]
    assert "no live instance carries" in page.body  # shown on the page it was meant for
    done = await client.call(
        "/jobs/daily/pause", {"next": f"/jobs/daily?msg={old}&range=6h&warn=stale"}, headers=BEARER
    )
    assert done.status == 303
    location = done.headers["location"]
    assert location.startswith("/jobs/daily?range=6h&msg=") and old not in location, location
    shown = await client.call(location)
    assert "paused daily" in shown.body and "no live instance carries" not in shown.body
    await client.call("/jobs/daily/resume", {}, headers=BEARER)


async def test_a_link_cannot_put_a_message_on_the_dashboard(guarded: Served) -> None:
    """``/?flash=...&warn=...`` showed any text in the status and alert banners, so a crafted
    link showed "Cluster compromised" on the real dashboard. An action's message now travels
    sealed for the browser that acted, for a few minutes."""
    client = guarded.client
    forged = "/?flash=Cluster+compromised&warn=run+curl+evil.example"
    for path in (forged, "/jobs/daily" + forged[1:], "/?msg=e30.0000", "/?msg=junk"):
        page = await client.call(path)
        assert page.status == 200, (path, page.body[:300])
        assert "compromised" not in page.body and "evil.example" not in page.body, path
        assert 'class="flash"' not in page.body and "data-warning" not in page.body, path
    signed = await client.call("/login", {"csrf": client.csrf(), "token": TOKEN, "name": "alice"})
    assert signed.status == 303
    done = await client.call(
        "/jobs/nosuchjob4/trigger", {"csrf": client.csrf(), "next": "/", "force": "1"}
    )
    location = done.headers["location"]
    assert location.startswith("/?msg=") and "nosuchjob4" not in location, location
    mine = await client.call(location)
    assert '<p class="flash" role="status">asked the cluster to run nosuchjob4' in mine.body
    assert "data-warning>no live instance carries job &#39;nosuchjob4&#39;" in mine.body
    # The same address in another browser (another CSRF cookie): nothing.
    other = Client(client.base)
    theirs = await other.call(location)
    assert theirs.status == 200 and "nosuchjob4" not in theirs.body
    # A tampered seal: nothing.
    body, _, mac = location.partition("=")[2].rpartition(".")
    tampered = await client.call(f"/?msg={body}.{mac[::-1]}")
    assert "nosuchjob4" not in tampered.body


def test_a_sealed_message_is_for_one_browser_and_a_few_minutes() -> None:
    from anarchon.web._auth import MESSAGE_TTL_S, Guard

    now = [1_000_000.0]
    for token in (TOKEN, lambda request: "alice", None):
        guard = Guard(token)
        guard.clock = lambda: now[0]
        sealed = guard.seal_message("cookie-a", "paused daily", None)
        assert guard.open_message("cookie-a", sealed) == ("paused daily", "")
        assert guard.open_message("cookie-b", sealed) == ("", "")
        assert guard.open_message(None, sealed) == ("", "")
        another = Guard(TOKEN)  # another process with the same token
        another.clock = guard.clock
        assert another.open_message("cookie-a", sealed) == (
            ("paused daily", "") if token == TOKEN else ("", "")  # another key: nothing
        )
        now[0] += MESSAGE_TTL_S
        assert guard.open_message("cookie-a", sealed) == ("", "")


async def test_failed_sign_ins_are_limited_per_address(guarded: Served) -> None:
    """/login took any number of guesses. Past 5 failures in 5 minutes from one address, it
    answers 429 with Retry-After, even to the right token."""
    client = guarded.client
    await client.call("/")
    for _ in range(5):
        wrong = await client.call("/login", {"csrf": client.csrf(), "token": "guess-123"})
        assert wrong.status == 403, wrong.body[:300]
    for token in ("guess-456", TOKEN):
        held = await client.call("/login", {"csrf": client.csrf(), "token": token, "name": "a"})
        assert held.status == 429, held.body[:300]
        assert 1 <= int(held.headers["retry-after"]) <= 300, held.headers
        assert "too many failed sign-ins from 127.0.0.1: at most 5 in 300 s" in held.body
    assert "anarchon_operator" not in client.cookies
    asks = await client.call("/login", {"csrf": client.csrf(), "token": TOKEN}, headers=JSON)
    assert asks.status == 429 and asks.json()["ok"] is False, asks.body
    assert "try again in" in asks.json()["error"]


def test_sign_in_limit_forgets_failures_after_its_window() -> None:
    from anarchon.web._auth import SignInLimit

    now = [100.0]
    limit = SignInLimit(clock=lambda: now[0])
    assert (limit.failures, limit.window_s) == (5, 300)
    for _ in range(5):
        assert limit.wait_s("10.0.0.1") == 0
        limit.failed("10.0.0.1")
    assert limit.wait_s("10.0.0.1") == 301 and limit.wait_s("10.0.0.2") == 0
    now[0] += 299.5
    assert limit.wait_s("10.0.0.1") == 1
    now[0] += 1
    assert limit.wait_s("10.0.0.1") == 0
    small = SignInLimit(1, 60, addresses=2, clock=lambda: now[0])
    for address in ("a", "b", "c"):
        small.failed(address)
    assert [small.wait_s(a) > 0 for a in ("a", "b", "c")] == [False, True, True]


async def test_sign_out_revokes_the_session(guarded: Served) -> None:
    """A copy of the session cookie kept acting after "sign out" (until the token changed)."""
    client, control = guarded.client, guarded.backend.control()
    await client.call("/")
    await client.call("/login", {"csrf": client.csrf(), "token": TOKEN, "name": "alice"})
    kept = client.cookies["anarchon_operator"]
    other = Client(client.base)
    await other.call("/")
    await other.call("/login", {"csrf": other.csrf(), "token": TOKEN, "name": "bob"})
    assert "data-operator>alice" in (await client.call("/")).body
    out = await client.call("/logout", {"csrf": client.csrf()})
    assert out.status == 303 and "anarchon_operator" in out.headers.get("set-cookie", "")
    client.cookies["anarchon_operator"] = kept  # the copy an attacker kept
    assert "data-operator" not in (await client.call("/")).body
    refused = await client.call("/jobs/daily/pause", {"csrf": client.csrf()})
    assert refused.status == 403 and await control.pauses() == []
    # Bob's session is his own: it still acts.
    assert (await other.call("/jobs/daily/pause", {"csrf": other.csrf()})).status == 303
    [held] = await control.pauses()
    assert held.by == "bob@dashboard"
    await other.call("/jobs/daily/resume", {"csrf": other.csrf()})


def test_a_session_ends_after_its_lifetime() -> None:
    from anarchon.web._auth import SESSION_TTL_S, Guard

    now = [1_000_000.0]
    guard = Guard(TOKEN)
    guard.clock = lambda: now[0]
    value = guard.session_value("alice")
    assert guard.revoke(value + "x") is None and guard.revoke(value) == "alice"
    assert guard.revoke(value) is None  # already signed out
    fresh = guard.session_value("alice")
    now[0] += SESSION_TTL_S
    assert guard.revoke(fresh) is None  # ended
    guard.revoke(guard.session_value("bob"))
    # A revoked session is forgotten once it would have ended: only bob's is remembered.
    assert len(guard._revoked) == 1


class _DownBackend(MemoryBackend):
    async def server_time_ms(self) -> int | None:
        from anarchon.errors import BackendUnavailable

        raise BackendUnavailable("no answer from postgresql://app:hunter2pw@db/x")


async def _serve_backend(backend: Backend) -> AsyncIterator[Client]:
    port = any_free()
    app = dashboard(backend, refresh_ms=0)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started
        yield Client(f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await task
        await app.state.dashboard.source.close()


class _BrokenBackend(MemoryBackend):
    async def server_time_ms(self) -> int | None:
        raise RuntimeError("a bug")


async def test_a_failing_backend_is_503_in_json_for_json_clients() -> None:
    async for client in _serve_backend(_BrokenBackend()):
        await _expect_json_error(client, "/?format=json", 500, "Internal Server Error")
        page = await client.call("/")
        assert page.status == 500 and "a bug" not in page.body
    async for client in _serve_backend(_DownBackend()):
        for path, headers in (("/?format=json", {}), ("/instances", JSON)):
            await _expect_json_error(
                client, path, 503, "BackendUnavailable: no answer", None, headers
            )
        reply = await client.call("/?format=json")
        assert "hunter2pw" not in reply.body and "app:***@db" in reply.body
        page = await client.call("/")
        assert page.status == 503 and page.headers["content-type"].startswith("text/html")


async def test_the_instances_page_lists_records_that_are_not_live_apart() -> None:
    """A record silent for over six of its heartbeats (kill -9) is not a live instance: not in
    the list, its jobs not listed, shown below as not live."""
    from anarchon.registry import record_instance

    backend = MemoryBackend()
    store = backend.registry()
    now = int(datetime.now(UTC).timestamp() * 1000)
    alive = JobDefinition(name="alive", expression="* * * * *", zone="UTC")
    orphan = JobDefinition(name="orphan", expression="* * * * *", zone="UTC")
    await record_instance(store, instance_record("w0", alive, beat=now))
    await record_instance(
        store, instance_record("dead", orphan, beat=now - 60_000, interval_ms=1_000)
    )
    async for client in _serve_backend(backend):
        page = await client.call("/instances")
        assert page.status == 200 and "1 live" in page.body
        assert 'data-instance="w0"' in page.body and 'data-instance="dead"' not in page.body
        assert 'data-silent="dead"' in page.body and "Not live" in page.body
        jobs = (await client.call("/?format=json")).json()
        assert [j["name"] for j in jobs["jobs"]] == ["alive"]
        assert (await client.call("/jobs/orphan")).status == 404


def test_the_dashboard_command_serves_while_the_backend_does_not_answer(tmp_path: Path) -> None:
    """A backend that does not answer at the start is warned about, and the pages answer 503
    (JSON for a JSON client) until it does: an outage passes, unlike a URL with no data."""
    import subprocess
    import sys

    from tests.conformance.procs import stop_processes

    port = any_free()
    log = tmp_path / "dashboard.log"
    args = [sys.executable, "-m", "anarchon", "dashboard", "--port", str(port)]
    args += ["--backend", "redis://127.0.0.1:1/0"]  # nothing listens on port 1
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=out)
    try:
        reply = None
        for _ in range(300):
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/?format=json", timeout=20):
                    pass
            except urllib.error.HTTPError as exc:
                reply = exc
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert reply is not None and reply.code == 503, log.read_text()
        assert reply.headers["content-type"] == "application/json"
        assert json.loads(reply.read())["ok"] is False
        assert "warning: the backend cannot be reached" in log.read_text()
    finally:
        stop_processes([proc])


class _Reads(MemoryBackend):
    """The in-memory backend, counting its history reads; ``refused`` makes the reads of that
    job fail (a permanent error), ``down`` every read (an outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.refused: str | None = None
        self.down = False

    def _check(self, jobs: Sequence[str]) -> None:
        if self.down:
            raise BackendUnavailable("no answer within 5 s (test)")
        if self.refused is not None and self.refused in jobs:
            raise BackendError(f"job {self.refused!r} refused (test)")

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        self.calls.append("history")
        self._check([job])
        return await super().history(job, limit)

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        self.calls.append(f"histories of {len(jobs)}")
        self._check(jobs)
        return await super().histories(jobs, limit)


async def test_the_jobs_page_reads_its_rows_histories_in_one_call() -> None:
    """The jobs page read each row's history in a call of its own (50 a page). It reads them
    in one; a job the backend refuses still shows its error in its own row only, and an outage
    in every row."""
    backend = _Reads()
    [won] = await backend.claim(
        [
            ClaimRequest(
                job="a", slot=None, run_id="r1", token="t1", instance="w0", trigger=Trigger.MANUAL
            )
        ]
    )
    assert won.ticket is not None
    await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    names = ["a", "b", "c"]
    jobs = [JobDefinition(name=name, expression="0 0 1 1 *", zone="UTC") for name in names]
    now = int(time.time() * 1000)
    snapshot = Snapshot(
        now_ms=now,
        view=build_view([instance_record("w0", *jobs, beat=now)], now),
        pauses=(),
        has_registry=True,
        has_control=True,
    )
    rows = await job_rows(backend, snapshot, names)
    assert backend.calls == ["histories of 3"]
    assert [r.last_run is not None for r in rows] == [True, False, False]
    assert [r.error for r in rows] == [None, None, None]
    backend.refused = "b"
    rows = await job_rows(backend, snapshot, names)
    assert [r.error for r in rows] == [None, "BackendError: job 'b' refused (test)", None]
    assert rows[0].last_run is not None
    backend.down = True
    rows = await job_rows(backend, snapshot, names)
    errors = {r.error for r in rows}
    assert errors == {"BackendUnavailable: no answer within 5 s (test)"}, errors


#: The words of a too-late skip record (SQLite keeps no cause: it reads it from them).
LATE_WORDS = f"{TOO_LATE}w0 reached it late"


async def _sqlite_carrying_sync(
    db: Path, job: JobDefinition | None = None
) -> tuple[SQLiteBackend, int]:
    """A started SQLite backend on ``db`` whose registry has ``w0`` carrying ``job`` (default
    ``sync``, every minute, in UTC), and its time then."""
    from anarchon.registry import record_instance

    writer = SQLiteBackend(db)
    await writer.start()
    now = await writer.server_time_ms()
    assert now is not None
    job = job or JobDefinition(name="sync", expression="* * * * *", zone="UTC")
    await record_instance(writer.registry(), instance_record("w0", job, beat=now))
    return writer, now


async def test_the_json_of_a_run_and_a_pause_is_the_clis(tmp_path: Path) -> None:
    # A run's JSON had no skip_cause, and a job's "paused" was {by, until_ms}: a whole-cluster
    # pause read as the job's own. Now both as the CLI's --json gives them; SQLite, defaults.
    from anarchon import steering
    from anarchon.control import ALL_JOBS
    from anarchon.testing._requests import request

    db = tmp_path / "anarchon.db"
    writer, now = await _sqlite_carrying_sync(db)
    slot = now - now % 60_000 - 60_000
    late = request("sync", slot, skip_reason=LATE_WORDS, skip_cause=SkipCause.TOO_LATE)
    await writer.claim([late])
    await steering.pause(writer, ALL_JOBS, by="alice@ops")
    await writer.stop()
    async for client in _serve_backend(SQLiteBackend(db)):
        (row,) = (await client.call("/?format=json")).json()["jobs"]
        assert row["last_run"]["skip_cause"] == "too_late", row
        paused = row["paused"]
        assert (paused["job"], paused["by"], paused["until_ms"]) == ("*", "alice@ops", None)
        assert isinstance(paused["at_ms"], int) and abs(paused["at_ms"] - now) < 600_000, paused
        page = (await client.call("/jobs/sync?format=json")).json()
        assert [r["skip_cause"] for r in page["runs"]] == ["too_late"], page["runs"]
        assert page["row"]["paused"] == paused


async def test_the_dashboard_and_anarchon_jobs_read_running_from_one_window(tmp_path: Path) -> None:
    # An attempt left running behind 25 newer records: `anarchon jobs` read the 20 newest and
    # did not show it running, the dashboard's jobs page read 120 and did. SQLite, defaults.
    from anarchon.registry import RECENT_RUNS, describe_jobs, read_instances
    from anarchon.testing._requests import request

    db = tmp_path / "anarchon.db"
    writer, now = await _sqlite_carrying_sync(db)
    first = now - now % 60_000 - 60 * 60_000
    (stuck,) = await writer.claim([request("sync", first, lease_ms=3_600_000)])
    assert stuck.run.status is RunStatus.RUNNING, stuck
    later = [first + n * 60_000 for n in range(1, RECENT_RUNS + 6)]
    await writer.claim([request("sync", s, skip_reason=LATE_WORDS) for s in later])
    view = build_view(await read_instances(writer.registry()), now)
    (cli_view,) = await describe_jobs(writer, view)
    await writer.stop()
    assert cli_view.running == () and cli_view.last_run is not None
    async for client in _serve_backend(SQLiteBackend(db)):
        (row,) = (await client.call("/?format=json")).json()["jobs"]
        assert row["running"] == [], row["running"]
        assert row["last_run"]["run_id"] == cli_view.last_run.run_id


#: How a time without an offset is read, as the answers state the rule.
NAIVE_WORDS = "a time without an offset (no Z, no +02:00) is read in the time zone of the job"


def _utc_ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


async def test_a_slot_address_without_an_offset_is_in_the_jobs_zone_as_in_explain(
    tmp_path: Path,
) -> None:
    # A job at 02:30 in Europe/Athens: `anarchon explain athens 2026-03-29T02:30` read its slot
    # (00:30Z), the dashboard read 02:30Z (04:30 in Athens: no slot). SQLite, defaults.
    from anarchon.testing._requests import request

    db = tmp_path / "anarchon.db"
    athens = JobDefinition(name="athens", expression="30 2 * * *", zone="Europe/Athens")
    writer, _ = await _sqlite_carrying_sync(db, athens)
    slot = _utc_ms(2026, 3, 29, 0, 30)
    for job in ("athens", "gone"):  # gone: a job with records that no live instance carries
        await writer.claim([request(job, slot, skip_reason=LATE_WORDS)])
    await writer.stop()
    async for client in _serve_backend(SQLiteBackend(db)):
        story = (await client.call("/jobs/athens/slots/2026-03-29T02:30?format=json")).json()
        assert (story["slot_ms"], story["kind"]) == (slot, "late"), story
        # Shown with its offset (the page and JSON), a copy reads back as the same slot.
        assert story["slot_local"] == "2026-03-29T02:30:00+02:00", story
        copied = urllib.parse.quote(story["slot_local"], safe="")
        back = (await client.call(f"/jobs/athens/slots/{copied}?format=json")).json()
        assert back["slot_ms"] == slot, back
        page = await client.call("/jobs/athens/slots/2026-03-29T02:30")
        assert "(2026-03-29T02:30:00+02:00 Europe/Athens)" in page.body, page.body[-600:]
        # A job page's range ends in the job's zone as well.
        job = (await client.call("/jobs/athens?end=2026-03-29T02:30&range=1h&format=json")).json()
        assert job["timeline"]["end_ms"] == slot, job["timeline"]
        # Athens skips 03:00 to 04:00 that day: 400 naming the value, the gap and the rule.
        gap = await client.call("/jobs/athens/slots/2026-03-29T03:30?format=json")
        said = gap.json()["error"]
        assert (
            gap.status == 400 and "slot '2026-03-29T03:30' does not exist in Europe/Athens" in said
        )
        assert NAIVE_WORDS in said and "skip from 03:00 to 04:00 on 2026-03-29" in said, said
        # Athens has 03:00 to 04:00 twice on 2026-10-25: the first, and the answer says so.
        twice = (await client.call("/jobs/athens/slots/2026-10-25T03:30?format=json")).json()
        assert twice["slot_ms"] == _utc_ms(2026, 10, 25, 0, 30), twice
        assert "occurs twice in Europe/Athens" in twice["summary"], twice
        assert "give 2026-10-25T03:30:00+02:00 for the second" in twice["summary"], twice
        # No live instance carries 'gone': its zone is unknown, so a time needs its offset.
        refused = await client.call("/jobs/gone/slots/2026-03-29T02:30?format=json")
        said = refused.json()["error"]
        assert refused.status == 400 and "no live instance carries job 'gone'" in said, said
        assert "slot '2026-03-29T02:30' has no offset" in said and NAIVE_WORDS in said, said
        gone = (await client.call("/jobs/gone/slots/2026-03-29T00:30:00Z?format=json")).json()
        assert gone["slot_ms"] == slot and gone["kind"] == "late", gone
        gone_page = await client.call("/jobs/gone?end=2026-03-29T02:30&range=1h&format=json")
        assert gone_page.status == 400, gone_page.body


async def test_pending_requests_are_listed_and_cancelled(guarded: Served) -> None:
    """The requests page and a job's page list the run requests not claimed yet (a trigger of a
    job nobody carries waits; a retry waits for its backoff); a signed-in operator cancels one
    with the page's CSRF token (its key recorded skipped, ``cancelled by alice@dashboard``), a
    script every one of a job with the bearer token; one an instance claimed first is said to
    be too late, and runs."""
    from anarchon import steering

    client, backend = guarded.client, guarded.backend
    control = backend.control()
    first = await steering.trigger(backend, "ghost", by="carol@ops")
    second = await steering.trigger(backend, "ghost", by="dave@ops")
    now = int(time.time() * 1000)
    retry = waiting_retry("daily", 1_800_000_000_000, now)
    assert await control.request(retry)
    listed = (await client.call("/requests?format=json")).json()
    by_id = {r["id"]: r for r in listed["requests"]}
    assert set(by_id) == {first.id, second.id, retry.id}, listed
    assert by_id[first.id]["kind"] == "trigger" and by_id[retry.id]["kind"] == "retry"
    assert by_id[first.id]["requested_by"] == "carol@ops" and by_id[retry.id]["due_at"]
    page = await client.call("/requests")
    assert page.status == 200 and f'data-request="{first.id}"' in page.body
    assert 'data-kind="retry"' in page.body and "carol@ops" in page.body
    assert 'data-action="cancel"' not in page.body  # not signed in: no buttons
    daily = await client.call("/jobs/daily")
    assert f'data-request="{retry.id}"' in daily.body and f'data-request="{first.id}"' not in (
        daily.body
    )
    assert [r["id"] for r in (await client.call("/jobs/daily?format=json")).json()["requests"]] == [
        retry.id
    ]
    refused = await client.call("/jobs/ghost/cancel", {"csrf": client.csrf(), "request": first.id})
    assert refused.status == 403 and len(await control.requests()) == 3

    await client.call("/login", {"csrf": client.csrf(), "token": TOKEN, "name": "alice"})
    page = await client.call("/requests")
    assert 'data-action="cancel"' in page.body
    no_csrf = await client.call("/jobs/ghost/cancel", {"request": first.id})
    assert no_csrf.status == 403 and len(await control.requests()) == 3
    bad = await client.call("/jobs/ghost/cancel", {"csrf": client.csrf(), "request": "xyz"})
    assert bad.status == 400 and "request id &#39;xyz&#39; is not 32 lowercase hex" in bad.body
    cancelled = await client.call(
        "/jobs/ghost/cancel",
        {"csrf": client.csrf(), "request": first.id, "next": "/requests"},
        headers={"Origin": client.base},
    )
    assert cancelled.status == 303 and cancelled.headers["location"].startswith("/requests?msg=")
    shown = await client.call(cancelled.headers["location"])
    assert f"cancelled the trigger request {first.id[:8]} of ghost" in shown.body
    assert f'data-request="{first.id}"' not in shown.body
    [record] = await backend.history("ghost")
    assert record.run_id == first.id and record.status is RunStatus.SKIPPED
    assert record.skip_cause is SkipCause.CANCELLED
    assert record.reason == "cancelled by alice@dashboard"

    # An instance claims the second first: it runs, and the cancellation says so.
    [won] = await backend.claim(
        [
            ClaimRequest(
                job="ghost",
                slot=None,
                run_id=second.id,
                token="t",
                instance="w9",
                trigger=Trigger.MANUAL,
                lease_ms=30_000,
                key=second.key,
            )
        ]
    )
    assert won.ticket is not None
    asks = {**BEARER, **JSON}
    late = await client.call("/jobs/ghost/cancel", {}, headers=asks, cookies=False)
    assert late.status == 200, late.body
    assert late.json()["done"] == "cancelled 0 pending request(s) of ghost"
    assert late.json()["warning"] == (
        f"too late: request {second.id[:8]} was claimed first by w9 (run running)"
    )
    every = await client.call("/jobs/daily/cancel", {}, headers=asks, cookies=False)
    assert every.json()["done"] == "cancelled 1 pending request(s) of daily", every.body
    assert await control.requests() == []
    gone = await client.call(
        "/jobs/ghost/cancel", {"request": first.id}, headers=asks, cookies=False
    )
    assert gone.json()["done"] == "nothing cancelled"
    assert gone.json()["warning"] == (
        f"request {first.id[:8]} of ghost is no longer pending: claimed or cancelled"
    )
    assert "No trigger or retry waits" in (await client.call("/requests")).body
