"""The Django guide's example project (docs/examples/django_project), copied into a temporary
folder and run as real ``manage.py`` processes on SQLite and on PostgreSQL: two ``manage.py
anarchon run`` instances run each slot once, the handlers' ORM writes land (plain and async
handlers), ``manage.py anarchon history`` reads the same history, and the database password the
settings hold is printed nowhere."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from anarchon import RunStatus
from tests.backends.postgres import DSN, url_of
from tests.integrations.procs import EXAMPLES, STARTED, STOPPED, contiguous_seconds, processes
from tests.integrations.test_asgi import history
from tests.ports import any_free

pytestmark = pytest.mark.slow

PROJECT = EXAMPLES / "django_project"
PASSWORD = f"pw-{uuid.uuid4().hex}"
SUCCEEDED = re.compile(r"job (\w+) succeeded")
JOBS = ("tick", "atick")


class Project:
    """A copy of the example project and the database it uses."""

    def __init__(self, root: Path, env: dict[str, str], url: str, rows: str) -> None:
        self.root, self.env, self.url, self.rows_from = root, env, url, rows

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def rows(self) -> list[tuple[str, datetime, str]]:
        query = "SELECT job, slot, instance FROM reports_tick"
        if self.rows_from == "sqlite":
            with closing(sqlite3.connect(self.root / "db.sqlite3")) as conn:
                found = conn.execute(query).fetchall()
            return [(j, datetime.fromisoformat(s).replace(tzinfo=UTC), i) for j, s, i in found]
        with psycopg.connect(self.url_dsn) as conn:
            return list(conn.execute(query).fetchall())

    url_dsn = ""


@pytest.fixture(params=["sqlite", "postgres"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    import os

    root = tmp_path / "project"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("*.sqlite3", "*.db"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANARCHON_", "POSTGRES_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if request.param == "sqlite":
        yield Project(root, env, f"sqlite:///{root / 'anarchon.db'}", "sqlite")
        return
    name = f"anarchon_dj_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = DSN.rsplit("/", 1)[0] + f"/{name}"
    # Trust authentication ignores the password; the test checks it is never shown.
    env.update(POSTGRES_DB=name, POSTGRES_PASSWORD=PASSWORD)
    made = Project(root, env, url_of("anarchon", dsn), "postgres")
    made.url_dsn = dsn
    try:
        yield made
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def test_manage_py_anarchon_run_in_two_processes(project: Project, tmp_path: Path) -> None:
    shown = [project.manage("migrate", "-v", "0")]
    with processes(tmp_path) as procs:
        instances = [
            procs.start([sys.executable, "manage.py", "anarchon", "run"], project.env, project.root)
            for _ in range(2)
        ]
        ids = [i.wait_for(STARTED)[0].group(1) for i in instances]
        while sum(len(i.found(SUCCEEDED)) for i in instances) < 8:
            instances[0].wait_for(SUCCEEDED, len(instances[0].found(SUCCEEDED)) + 1, timeout=30)
        stops = [i.stop(signal.SIGTERM) for i in instances]
    logs = "\n".join(i.text() for i in instances)
    assert [code for code, _ in stops] == [0, 0], logs
    assert len(set(ids)) == 2 and sorted(STOPPED.findall(logs)) == sorted(ids), logs

    rows = project.rows()
    shown.append(project.manage("anarchon", "history", "tick", "-n", "1000"))
    for name in JOBS:
        written = Counter(slot for job, slot, _ in rows if job == name)
        assert written and set(written.values()) == {1}, (name, written)
        assert contiguous_seconds([s.isoformat() for s in written]) == []
        runs = [r for r in await history(project.url, name) if r.status is not RunStatus.SKIPPED]
        assert all(r.status is RunStatus.SUCCEEDED for r in runs), runs
        recorded = {r.slot: r.instance for r in runs}
        assert len(recorded) == len(runs)
        assert recorded == {slot: inst for job, slot, inst in rows if job == name}
        assert set(recorded.values()) <= set(ids)
    table = shown[-1].stdout.splitlines()
    assert table[0].startswith("started (UTC)") and len(table) - 1 == written_ticks(rows)
    for done in shown:
        assert PASSWORD not in done.stdout + done.stderr
    assert PASSWORD not in logs


def written_ticks(rows: list[tuple[str, datetime, str]]) -> int:
    return sum(1 for job, _, _ in rows if job == "tick")


def test_settings_mistakes_stop_django_with_the_rule(tmp_path: Path) -> None:
    """A bad ANARCHON setting, any key, fails ``manage.py check`` (the app's ready(), as every
    process that loads Django) naming the key and the rule; ``anarchon run`` on a job with a
    bad option names the job (exit code 2)."""
    root = tmp_path / "project"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("*.sqlite3", "*.db"))
    settings = root / "mysite" / "settings.py"
    base = settings.read_text()
    cases = {
        'ANARCHON = {"backend": "memory://", "grace": 5}': "unknown key(s) 'grace'",
        'ANARCHON = {"database": "default"}': "is a sqlite database; anarchon reuses only",
        'ANARCHON = {"database": "other"}': "'other' is not a database of DATABASES",
        'ANARCHON = {"backend": "memory://", "database": "default"}': "both 'backend' and",
        # These passed 'check' (and web workers) and failed only 'anarchon run':
        'ANARCHON = {"backend": "bogus://x"}': "unknown scheme 'bogus'",
        'ANARCHON = {"backend": ""}': "['backend'] = '' must be a backend URL",
        'ANARCHON = {"grace_ms": "abc"}': "grace_ms='abc' for Scheduler must be an integer",
        'ANARCHON = {"timezone": "Mars/Base"}': "time zone 'Mars/Base' is not a known IANA",
        'ANARCHON = {"max_workers": 0}': "max_workers=0 for Scheduler is out of range",
        'ANARCHON = {"instance_id": 5}': "instance_id=5 must be a non-empty string",
    }
    for line, message in cases.items():
        settings.write_text(base + "\n" + line + "\n")
        done = subprocess.run(
            [sys.executable, "manage.py", "check"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and message in done.stderr, (line, done.stderr)
    settings.write_text(base)
    cron = root / "reports" / "cron.py"
    cron.write_text(cron.read_text().replace('"* * * * * *")  #', '"* * * * * *", lease_ms=1)  #'))
    done = subprocess.run(
        [sys.executable, "manage.py", "anarchon", "run"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "lease_ms=1" in done.stderr and "'tick'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("project", ["sqlite"], indirect=True)
def test_manage_py_anarchon_run_serves_the_kubernetes_probes(
    project: Project, tmp_path: Path
) -> None:
    """The Kubernetes guide's probes for a Django project: ``manage.py anarchon run
    --metrics-port`` serves ``/healthz`` and ``/healthz?live=1`` (before, ``run`` took no
    option, so a Django scheduler could not be probed); a target or ``--backend`` is still
    refused, naming what it takes."""
    project.manage("migrate", "-v", "0")
    port = any_free()
    command = [sys.executable, "manage.py", "anarchon", "run", "--metrics-port", str(port)]
    with processes(tmp_path) as procs:
        run = procs.start(command, project.env, project.root)
        run.wait_for(STARTED)
        answers = {path: get(port, path) for path in ("/healthz", "/healthz?live=1")}
        code, _ = run.stop(signal.SIGTERM)
    assert code == 0, run.text()
    for path, (status, body) in answers.items():
        assert status == 200 and json.loads(body)["state"] == "running", (path, body)
    for refused in (["--backend", "memory://"], ["mysite:scheduler"]):
        done = project.manage("anarchon", "run", *refused, check=False)
        assert done.returncode != 0, done.stderr
        assert "takes only the options --log-format, --metrics-port" in done.stderr, done.stderr


def get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return int(response.status), response.read()
