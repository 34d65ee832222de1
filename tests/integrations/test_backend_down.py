"""The FastAPI guide's application under real uvicorn and gunicorn processes whose backend (a
private Redis) is out of reach when the workers start: a deploy during a blip of the cron store,
or a worker recycled by gunicorn's ``max_requests`` meanwhile. The web application serves
anyway, and each worker's scheduler starts once the backend answers; before, a worker's failed
lifespan ended the whole server (uvicorn exits; gunicorn's master halts on a worker that fails
to boot)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integrations.procs import BIN, EXAMPLES, STARTED, STOPPED, TICK, per_slot, processes
from tests.integrations.test_asgi import WORKERS, environment, get_json, server_command
from tests.ports import any_free
from tests.redis.servers import RedisServer

pytestmark = pytest.mark.slow

START_FAILED = re.compile(r"scheduler (\S+) could not start: .*tried again in")


def pid_of(instance: str) -> str:
    return instance.rsplit("-", 2)[1]


def status(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return int(response.status)


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_the_app_serves_while_the_backend_is_down_and_the_scheduler_starts_later(
    kind: str, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path / "redis")  # its port chosen; the server not started yet
    port = any_free()
    env = environment(redis.url, port, tmp_path, 30_000)  # every option at its default
    with processes(tmp_path) as procs:
        server = procs.start(server_command(kind, port), env)
        failed = server.wait_for(START_FAILED, WORKERS, timeout=30)
        assert status(port, "/docs") == 200  # the web application serves meanwhile
        assert not server.found(STARTED)
        redis.start()
        try:
            started = server.wait_for(STARTED, WORKERS, timeout=30)
            server.wait_for(TICK, 3, timeout=30)
            code, _ = server.stop(signal.SIGTERM)
        finally:
            redis.stop()
    logs = server.text()
    assert code == 0, logs
    ids = sorted(m.group(1) for m in started)
    # The same workers (by pid) whose start failed started later; none was restarted.
    assert {pid_of(m.group(1)) for m in failed} == {pid_of(i) for i in ids}, logs
    assert sorted(m.group(1) for m in STOPPED.finditer(logs)) == ids, logs
    assert set(per_slot(list(TICK.finditer(logs))).values()) == {1}, logs
    assert "Traceback" not in logs, logs


REQUEST_S = 8


def test_a_stop_signal_while_the_start_is_retried_keeps_the_scheduler_from_starting(
    tmp_path: Path,
) -> None:
    # gunicorn (the guide's configuration, every anarchon option at its default) whose backend is
    # down at start; SIGTERM while a worker serves a request, and the backend comes back at once.
    # The scheduler must not start to claim after the signal: it would run slots until the
    # request ends (or gunicorn's SIGKILL), which a scheduler started in time no longer does.
    redis = RedisServer(tmp_path / "redis")
    port = any_free()
    env = environment(redis.url, port, tmp_path, 30_000, SLOW_S="1")
    env["PYTHONPATH"] = f"{Path(__file__).parent}:{env['PYTHONPATH']}"
    command = [str(BIN / "gunicorn"), "asgi_app:app", "-c", str(EXAMPLES / "gunicorn.conf.py")]
    answers: list[object] = []
    with processes(tmp_path) as procs:
        server = procs.start(command, env)
        server.wait_for(START_FAILED, WORKERS, timeout=30)
        path = f"/slow-request?seconds={REQUEST_S}"
        asking = threading.Thread(target=lambda: answers.append(get_json(port, path)))
        asking.start()
        time.sleep(1)  # the request reaches a worker
        os.kill(server.proc.pid, signal.SIGTERM)
        redis.start()
        try:
            code, _ = server.stop(signal.SIGTERM)  # waits for the exit (the signal is sent)
            asking.join(30)
        finally:
            redis.stop()
    logs = server.text()
    assert code == 0, logs
    assert answers == [{"slept": REQUEST_S}], logs  # the request was served to its end
    # A start under way at the signal may end; that scheduler is stopped at once, claiming
    # nothing. Before, the workers' schedulers started and ran ticks until the request ended.
    started = sorted(m.group(1) for m in server.found(STARTED))
    assert sorted(m.group(1) for m in STOPPED.finditer(logs)) == started, logs
    assert not server.found(TICK), logs
    assert "slow began" not in logs, logs
    assert "Traceback" not in logs, logs
