"""The guides' examples run: the blocks marked ``test: tests/docs/test_guides.py NAME`` and the
files of docs/examples that no other test runs (logging_config.py, test_my_jobs.py, cron_app.py
with myapp-cron.service and kubernetes.yaml)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from anarchon import Scheduler
from tests.docs.blocks import EXAMPLES, ROOT, block
from tests.integrations.procs import BIN, STARTED, STOPPED, TICK, processes
from tests.integrations.test_asgi import check_ticks, history


def python(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def load(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """Run ``code`` as a module (not as __main__) with ``env`` set; its globals."""
    saved = dict(os.environ)
    os.environ.update(env)
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        namespace: dict[str, Any] = {"__name__": "guide_example"}
        exec(compile(code, "guide_example", "exec"), namespace)
        return namespace
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize(
    ("page", "name", "jobs"),
    [
        (
            "docs/migrate/celery-beat.md",
            "celery-after",
            {"cleanup": "0 3 * * *", "digest": "*/15 9-17 * * MON-FRI", "rates": "*/30 * * * * *"},
        ),
        (
            "docs/migrate/apscheduler.md",
            "apscheduler-after",
            {"cleanup": "0 3 * * *", "report": "30 6 * * MON-FRI"},
        ),
        ("docs/migrate/kubernetes-cronjob.md", "cronjob-after", {"report": "30 6 * * 1-5"}),
    ],
)
async def test_migration_examples_make_their_jobs(
    page: str, name: str, jobs: dict[str, str], tmp_path: Path
) -> None:
    found = load(block(page, name), tmp_path, ANARCHON_BACKEND="memory://")
    scheduler: Scheduler = found["scheduler"]
    assert scheduler.jobs == jobs
    async with scheduler:  # the options are valid for a lease backend; each handler runs
        for job in jobs:
            run = await scheduler.run_now(job)
            assert run.status == "succeeded", run


def test_the_logging_example_prints_one_json_object_a_line() -> None:
    lines = python(str(EXAMPLES / "logging_config.py")).splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    (written,) = [r for r in records if r["logger"] == "anarchon.job.report"]
    assert written["rows"] == 42 and written["job"] == "report" and written["attempt"] == 1
    errors = [r for r in records if r["level"] == "ERROR"]
    # A failed run: one ERROR record, with the fields and the handler's traceback.
    assert len(errors) == 1, errors
    (failed,) = errors
    assert failed["action"] == "run_failed" and failed["job"] == "export"
    assert "ConnectionError: the export server closed the connection" in failed["traceback"]
    assert 'in export\n    raise ConnectionError("the export server' in failed["traceback"]


SENTRY_HARNESS = '''
import asyncio, json, os
import sentry_sdk
from sentry_sdk.transport import Transport

events = []


class InMemory(Transport):
    """Keeps events instead of sending them: no network."""

    def capture_envelope(self, envelope):
        events.extend(i.payload.json for i in envelope.items if i.type == "event")


real_init = sentry_sdk.init
sentry_sdk.init = lambda *a, **k: real_init(*a, transport=InMemory, **k)

GUIDE

from anarchon import RunContext, Scheduler
from anarchon.testing import MemoryBackend


async def main():
    scheduler = Scheduler(MemoryBackend())

    @scheduler.job("export", "0 7 * * *")
    async def export(ctx: RunContext) -> None:
        raise ConnectionError("the export server closed the connection")

    @scheduler.job("report", "0 6 * * *")
    def report(ctx: RunContext) -> None:
        ctx.logger.info("report written")

    async with scheduler:
        for name in ("report", "export", "report"):
            await scheduler.run_now(name)


asyncio.run(main())
sentry_sdk.flush()
print(json.dumps(events))
'''


def test_sentry_gets_one_event_per_failed_run() -> None:
    script = SENTRY_HARNESS.replace("GUIDE", block("docs/guides/sentry.md", "sentry-init"))
    out = python("-c", script, env={"SENTRY_DSN": "https://public@sentry.invalid/1"})
    events = json.loads(out.splitlines()[-1])
    assert len(events) == 1, events
    (event,) = events
    assert event["logger"] == "anarchon.scheduler" and event["level"] == "error"
    (exception,) = event["exception"]["values"]
    assert exception["type"] == "ConnectionError"
    assert exception["stacktrace"]["frames"][-1]["function"] == "export"
    assert event["tags"]["anarchon.job"] == "export"
    assert event["extra"]["action"] == "run_failed" and event["extra"]["attempt"] == 1
    assert event["fingerprint"] == ["anarchon", "export", "{{ default }}"]


def test_the_testing_guide_example_passes_under_pytest(tmp_path: Path) -> None:
    copy = tmp_path / "test_my_jobs.py"
    shutil.copy(EXAMPLES / "test_my_jobs.py", copy)
    out = python("-m", "pytest", "-q", "-p", "no:cacheprovider", str(copy), cwd=tmp_path)
    assert re.search(r"^3 passed", out, re.M), out


def unit_service() -> dict[str, list[str]]:
    """The [Service] section of myapp-cron.service, each key with all its values."""
    section: dict[str, list[str]] = {}
    current = None
    for line in (EXAMPLES / "myapp-cron.service").read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            section.setdefault(key, []).append(value)
    return section


def deployment() -> dict[str, Any]:
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes.yaml").read_text()))
    (found,) = [d for d in documents if d["kind"] == "Deployment"]
    assert isinstance(found, dict)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("where", ["systemd", "kubernetes"])
async def test_the_deployment_examples_run_their_command(where: str, tmp_path: Path) -> None:
    """Read the unit file or the manifest, check the stop timeout against the grace, and run
    its command with its environment as two instances would (two hosts, two replicas): they
    share the slots, and stop within the timeout on the signal systemd or the kubelet sends."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    home = tmp_path / "srv"
    home.mkdir()
    shutil.copy(EXAMPLES / "cron_app.py", home)
    if where == "systemd":
        unit = unit_service()
        env = dict(e.split("=", 1) for e in unit["Environment"])
        stop_s = int(unit["TimeoutStopSec"][0])
        sig = getattr(signal, unit["KillSignal"][0])
        command = unit["ExecStart"][0].replace("/srv/myapp/.venv/bin/", f"{BIN}/").split()
        assert unit["WorkingDirectory"] == ["/srv/myapp"]
    else:
        spec = deployment()["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert [e["name"] for e in container["env"] if "valueFrom" in e] == ["ANARCHON_BACKEND"]
        stop_s = spec["terminationGracePeriodSeconds"]
        sig = signal.SIGTERM
        command = [str(BIN / container["command"][0]), *container["command"][1:]]
    grace_s = int(env["GRACE_MS"]) / 1000
    assert stop_s >= grace_s + 10, f"{where}: stop timeout {stop_s}s vs grace {grace_s}s"
    env["ANARCHON_BACKEND"] = store  # from EnvironmentFile / the Secret
    with processes(tmp_path) as procs:
        instances = [procs.start(command, env, home) for _ in range(2)]
        ids = {i.wait_for(STARTED)[0].group(1) for i in instances}
        while sum(len(i.found(TICK)) for i in instances) < 4:
            instances[0].wait_for(TICK, len(instances[0].found(TICK)) + 1, timeout=30)
        stops = [i.stop(sig, timeout=stop_s) for i in instances]
    logs = "\n".join(i.text() for i in instances)
    assert [code for code, _ in stops] == [0, 0], logs
    assert all(took < stop_s for _, took in stops)
    assert len(ids) == 2 and {m.group(1) for m in STOPPED.finditer(logs)} == ids
    check_ticks(logs, await history(store, "sync"), ids)
