"""The FastAPI guide's application under real uvicorn and gunicorn processes, on SQLite and
PostgreSQL: every worker is an instance with its own id, each slot runs exactly once, and a
SIGTERM to the server stops every scheduler once, draining or handing over what runs."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from anarchon import Run, RunStatus, backend_from_url
from tests.backends.postgres import HARNESS as POSTGRES
from tests.backends.sqlite import HARNESS as SQLITE
from tests.harness import Harness, Namespace
from tests.integrations.procs import (
    BIN,
    EXAMPLES,
    ROOT,
    STARTED,
    STOPPED,
    TICK,
    Proc,
    contiguous_seconds,
    per_slot,
    processes,
)
from tests.ports import any_free

pytestmark = pytest.mark.slow

WORKERS = 2
GRACE_MS = 2_000
HARNESSES: dict[str, Harness] = {"sqlite": SQLITE, "postgres": POSTGRES}


def server_command(kind: str, port: int) -> list[str]:
    """``uvicorn`` on asyncio's loop, ``uvicorn-uvloop`` on uvloop (what uvicorn picks when
    uvloop is installed, as ``uvicorn[standard]`` does), gunicorn with UvicornWorker (its loop
    "auto": uvloop, installed with the test tools)."""
    if kind.startswith("uvicorn"):
        return [
            str(BIN / "uvicorn"),
            "fastapi_app:app",
            "--workers",
            str(WORKERS),
            "--loop",
            "uvloop" if kind == "uvicorn-uvloop" else "asyncio",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    command = [str(BIN / "gunicorn"), "fastapi_app:app", "-c", str(EXAMPLES / "gunicorn.conf.py")]
    return [*command, "--preload"] if kind == "gunicorn-preload" else command


@pytest.fixture(params=sorted(HARNESSES))
async def ns(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Namespace]:
    async with HARNESSES[request.param].namespace(tmp_path) as namespace:
        yield namespace


def environment(
    url: str, port: int, tmp: Path, grace_ms: int = GRACE_MS, **extra: str
) -> dict[str, str]:
    # The caller's PYTHONPATH is kept after ours: PYTHONPATH=<checkout>/src runs the servers on
    # that checkout's anarchon, as it does the test (a new test is run on the old code so).
    inherited = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": ":".join(filter(None, (str(EXAMPLES), str(ROOT), inherited))),
        "ANARCHON_BACKEND": url,
        "GRACE_MS": str(grace_ms),
        "BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": str(WORKERS),
        # gunicorn's control socket: one per server, not one per user.
        "XDG_RUNTIME_DIR": str(tmp),
        **extra,
    }


async def history(url: str, job: str) -> list[Run]:
    backend = backend_from_url(url)
    await backend.start_reader()
    try:
        return await backend.history(job, limit=10_000)
    finally:
        await backend.stop()


def get_json(port: int, path: str) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())


def check_ticks(server_logs: str, runs: list[Run], instances: set[str]) -> Counter[str]:
    """Exactly once per slot, from the handler's log lines and from history; returns the
    number of slots each instance ran."""
    ticks = list(TICK.finditer(server_logs))
    assert ticks, server_logs
    counts = per_slot(ticks)
    assert set(counts.values()) == {1}, [s for s, n in counts.items() if n > 1]
    assert contiguous_seconds(list(counts)) == [], "slots missing between first and last"
    ran = [r for r in runs if r.status is not RunStatus.SKIPPED]
    by_slot = Counter(r.slot.isoformat() for r in ran if r.slot is not None)
    assert set(by_slot.values()) == {1}, [s for s, n in by_slot.items() if n > 1]
    assert all(r.status is RunStatus.SUCCEEDED for r in ran), ran
    history_owner = {r.slot.isoformat(): r.instance for r in ran if r.slot is not None}
    logged_owner = {m.group(1): m.group(2) for m in ticks}
    assert logged_owner == history_owner
    assert set(logged_owner.values()) <= instances
    return Counter(logged_owner.values())


@pytest.mark.parametrize("kind", ["uvicorn", "uvicorn-uvloop", "gunicorn", "gunicorn-preload"])
async def test_each_slot_once_across_workers(kind: str, ns: Namespace, tmp_path: Path) -> None:
    assert ns.url is not None
    port = any_free()
    with processes(tmp_path) as procs:
        server = procs.start(server_command(kind, port), environment(ns.url, port, tmp_path))
        started = server.wait_for(STARTED, WORKERS)
        server.wait_for(TICK, 4)
        served = get_json(port, "/runs/tick")
        assert isinstance(served, list) and served, served
        code, took = server.stop(signal.SIGTERM)
    logs = server.text()
    assert code == 0, logs
    assert took < GRACE_MS / 1000 + 10, took
    ids = [m.group(1) for m in started]
    # Distinct ids, each carrying its worker's pid: computed after the fork, also with --preload.
    assert len(set(ids)) == WORKERS, ids
    assert len({i.rsplit("-", 2)[1] for i in ids}) == WORKERS, ids
    # SIGTERM stops each scheduler once; no worker is restarted to start another.
    assert [m.group(1) for m in STARTED.finditer(logs)] == ids, logs
    assert sorted(m.group(1) for m in STOPPED.finditer(logs)) == sorted(ids), logs
    check_ticks(logs, await history(ns.url, "tick"), set(ids))


SLOW_BEGAN = re.compile(r"slow began slot=(\S+) instance=(\S+) attempt=(\d+)")
SLOW_ENDED = re.compile(r"slow ended slot=(\S+) instance=(\S+) attempt=(\d+)")


@pytest.mark.parametrize(
    ("grace_ms", "outcome"), [(1_000, "handed over"), (8_000, "finished in the grace")]
)
async def test_sigterm_to_gunicorn_drains_or_hands_over(
    grace_ms: int, outcome: str, tmp_path: Path
) -> None:
    """A run of 3 s is going on a gunicorn worker when the master gets SIGTERM. With a grace
    shorter than the run, the worker hands the run over and a backup instance (``anarchon run``
    on the same jobs) re-runs the slot at once; with a longer grace the run finishes where it
    is. Either way the slot ends with one success, and nothing starts twice."""
    async with SQLITE.namespace(tmp_path) as ns:
        assert ns.url is not None
        port = any_free()
        env = environment(ns.url, port, tmp_path, grace_ms, SLOW_S="3")
        env["PYTHONPATH"] = f"{EXAMPLES}:{Path(__file__).parent}:{ROOT}"
        with processes(tmp_path) as procs:
            backup = procs.start([str(BIN / "anarchon"), "run", "asgi_app:scheduler"], env)
            (backup_started,) = backup.wait_for(STARTED)
            command = [
                str(BIN / "gunicorn"),
                "asgi_app:app",
                "-c",
                str(EXAMPLES / "gunicorn.conf.py"),
            ]
            server = procs.start(command, env)
            ids = {m.group(1) for m in server.wait_for(STARTED, WORKERS)}
            began = _slow_run_on(server, ids)
            code, took = server.stop(signal.SIGTERM)
            server_logs = server.text()
            if outcome == "handed over":
                backup.wait_for(re.compile(rf"slow ended slot={re.escape(began.group(1))}"))
            backup.stop(signal.SIGTERM)
        runs = await history(ns.url, "slow")
        ticks = await history(ns.url, "tick")
    assert code == 0, server_logs
    slot = began.group(1)
    attempts = sorted(
        (r for r in runs if r.slot is not None and r.slot.isoformat() == slot),
        key=lambda r: r.attempt,
    )
    succeeded = [r for r in attempts if r.status is RunStatus.SUCCEEDED]
    assert len(succeeded) == 1, attempts
    if outcome == "handed over":
        first, second = attempts
        assert first.instance == began.group(2) and first.status is RunStatus.FAILED
        assert first.reason is not None and "handed over" in first.reason, first
        assert second.instance == backup_started.group(1) and second.attempt == 2
        assert second.status is RunStatus.SUCCEEDED
        assert took < grace_ms / 1000 + 5, took
        assert not [m for m in SLOW_ENDED.finditer(server_logs) if m.group(1) == slot]
    else:
        (only,) = attempts
        assert only.instance == began.group(2) and only.status is RunStatus.SUCCEEDED
        assert [m.group(1) for m in SLOW_ENDED.finditer(server_logs)].count(slot) == 1
        assert took < grace_ms / 1000, took
    # Nothing started twice: each scheduler once, each slot once.
    assert {m.group(1) for m in STARTED.finditer(server_logs)} == ids
    assert len(STARTED.findall(server_logs)) == WORKERS
    assert len(STOPPED.findall(server_logs)) == WORKERS
    check_ticks(server_logs + backup.text(), ticks, ids | {backup_started.group(1)})


def _slow_run_on(server: Proc, ids: set[str]) -> re.Match[str]:
    """Wait for a run of the slow job that one of the server's workers began (attempt 1)."""
    for count in range(1, 20):
        for began in server.wait_for(SLOW_BEGAN, count, timeout=30)[count - 1 :]:
            if began.group(2) in ids and began.group(3) == "1":
                return began
    raise AssertionError(f"no worker ran the slow job:\n{server.text()}")
