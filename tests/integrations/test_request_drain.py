"""SIGTERM to gunicorn (the guide's configuration, every anarchon option at its default) while
a worker still serves a request: the worker's scheduler stops claiming at the signal and drains
meanwhile, instead of claiming and running slots until the request ends and the server runs
the lifespan's shutdown (with a long-lived connection, until gunicorn's SIGKILL)."""

from __future__ import annotations

import asyncio
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.backends.sqlite import HARNESS as SQLITE
from tests.integrations.procs import BIN, EXAMPLES, STARTED, STOPPED, TICK, per_slot, processes
from tests.integrations.test_asgi import WORKERS, environment, get_json
from tests.ports import any_free

pytestmark = pytest.mark.slow

REQUEST_S = 6
AWAIT_S = 1.0


async def test_a_worker_stops_claiming_at_sigterm_while_a_request_finishes(
    tmp_path: Path,
) -> None:
    async with SQLITE.namespace(tmp_path) as ns:
        assert ns.url is not None
        port = any_free()
        env = environment(ns.url, port, tmp_path, 30_000, SLOW_S="1")  # the default grace
        env["PYTHONPATH"] = f"{Path(__file__).parent}:{env['PYTHONPATH']}"
        command = [str(BIN / "gunicorn"), "asgi_app:app", "-c", str(EXAMPLES / "gunicorn.conf.py")]
        answers: list[object] = []
        with processes(tmp_path) as procs:
            server = procs.start(command, env)
            ids = {m.group(1) for m in server.wait_for(STARTED, WORKERS)}
            server.wait_for(TICK, 2)
            path = f"/slow-request?seconds={REQUEST_S}"
            asking = threading.Thread(target=lambda: answers.append(get_json(port, path)))
            asking.start()
            await asyncio.sleep(AWAIT_S)  # the request reaches a worker
            signalled = datetime.now(UTC)
            code, took = server.stop(signal.SIGTERM)
            asking.join(30)
    logs = server.text()
    assert code == 0, logs
    assert answers == [{"slept": REQUEST_S}], logs  # the request was served to its end
    assert took >= REQUEST_S - AWAIT_S - 0.5, took
    # No slot claimed after the signal (a claim begun in that second may still run).
    late = [
        m.group(0)
        for m in TICK.finditer(logs)
        if datetime.fromisoformat(m.group(1)) > signalled + timedelta(seconds=1.5)
    ]
    assert late == [], logs
    assert set(per_slot(list(TICK.finditer(logs))).values()) == {1}, logs
    assert sorted(STOPPED.findall(logs)) == sorted(ids), logs
