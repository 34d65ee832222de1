"""Faults with a real worker process: connections killed by the server, and a server that
cannot be reached for seconds (a TCP proxy the test cuts; the shared server keeps running)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from anarchon import BackendUnavailable
from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN, url_of
from tests.conformance.procs import Fleet
from tests.postgres.proxy import TcpProxy

pytestmark = pytest.mark.slow


async def _sessions(app: str, terminate: bool = False) -> list[tuple[int, str]]:
    """The server sessions of ``app`` (pid, last query); with ``terminate``, end them all."""
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        )
        rows = await cur.fetchall()
        if terminate:
            for pid, _ in rows:
                await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return [(int(pid), str(query)) for pid, query in rows]


def _runs(fleet: Fleet) -> tuple[Counter[int], list[dict[str, Any]]]:
    starts = fleet.records("start")
    return Counter(r["slot"] for r in starts), starts


def _exit_metrics(fleet: Fleet) -> dict[str, Any]:
    [record] = fleet.records("exit")
    metrics: dict[str, Any] = record["metrics"]
    return metrics


async def test_terminated_connections_are_replaced_and_slots_go_on(
    schema: str, tmp_path: Path
) -> None:
    app = f"anarchon_fault_{uuid.uuid4().hex[:8]}"
    fleet = Fleet(url_of(schema, application_name=app), tmp_path)
    try:
        [worker] = fleet.spawn(1, seconds=60, jitter_ms=0, sleep_ms=400, lease_ms=3_000)
        fleet.wait_ready([worker])
        began = time.time()
        kills = []
        for _ in range(2):
            await asyncio.sleep(3.2)
            before = await _sessions(app, terminate=True)
            kills.append((time.time(), before))
        await asyncio.sleep(4)
        after = await _sessions(app)
        ended = time.time()
    finally:
        fleet.stop_all()
    assert worker.proc.returncode == 0, fleet.logs()
    for _, killed in kills:
        # The pool's connection(s) and the listener's, at least.
        assert len(killed) >= 2, killed
        assert any(q.startswith("LISTEN") for _, q in killed), killed
    old_pids = {pid for _, killed in kills for pid, _ in killed}
    assert after and not {pid for pid, _ in after} & old_pids, "nothing reconnected"
    assert any(q.startswith("LISTEN") for _, q in after), f"the listener is not back: {after}"
    per_slot, _ = _runs(fleet)
    expected = {s * 1000 for s in range(int(began) + 1, int(ended) - 1)}
    assert {s: n for s, n in per_slot.items() if n > 1} == {}, fleet.logs()
    assert sorted(expected - set(per_slot)) == [], fleet.logs()
    metrics = _exit_metrics(fleet)
    assert metrics.get("runs_failed", 0) == 0, metrics
    print(f"\npostgres: 2 x pg_terminate_backend, {len(expected)} slots all ran once; {metrics}")


async def test_unreachable_server_fails_closed_retries_and_recovers(
    schema: str, tmp_path: Path
) -> None:
    with TcpProxy() as proxy:
        dsn = f"postgresql://127.0.0.1:{proxy.port}/test"
        fleet = Fleet(url_of(schema, dsn, timeout_ms="2000"), tmp_path)
        try:
            [worker] = fleet.spawn(1, seconds=60, jitter_ms=0, sleep_ms=100, lease_ms=3_000)
            fleet.wait_ready([worker])
            began = time.time()
            await asyncio.sleep(3)
            cut_at = time.time()
            proxy.cut()
            await asyncio.sleep(6)
            restored_at = time.time()
            proxy.restore()
            await asyncio.sleep(9)
            ended = time.time()
        finally:
            fleet.stop_all()
    assert worker.proc.returncode == 0, fleet.logs()
    per_slot, starts = _runs(fleet)
    # Fail closed: no handler started while the server could not be reached.
    during = [r for r in starts if cut_at + 0.5 < r["t"] < restored_at]
    assert during == [], during
    # Nothing ran twice, before, during or after.
    assert {s: n for s, n in per_slot.items() if n > 1} == {}, fleet.logs()
    # Before the cut every slot ran; after the restore the scheduler recovered by itself.
    before = {s * 1000 for s in range(int(began) + 1, int(cut_at) - 1)}
    assert sorted(before - set(per_slot)) == [], fleet.logs()
    after = [r for r in starts if r["t"] >= restored_at]
    assert after, f"no run after the server came back\n{fleet.logs()}"
    recovered_in = min(r["t"] for r in after) - restored_at
    settled = {s * 1000 for s in range(int(restored_at) + 7, int(ended) - 1)}
    assert sorted(settled - set(per_slot)) == [], fleet.logs()
    # Retried with backoff, not in a tight loop (and no crash: the exit record is there).
    metrics = _exit_metrics(fleet)
    assert 0 < metrics.get("claim_errors", 0) < 100, metrics
    # The slots of the outage were claimed when the server came back: each is in history
    # once, run late or skipped because the first of them still held its lease (overlap).
    backend = PostgresBackend(DSN, schema=schema)
    await backend.start()
    try:
        history = await backend.history("tick", limit=1000)
    finally:
        await backend.stop()
    outage = {s * 1000 for s in range(int(cut_at) + 1, int(restored_at))}
    recorded = Counter(r.slot_ms for r in history if r.slot_ms in outage)
    assert set(recorded.values()) <= {1}, recorded
    fates = Counter(
        (r.status.value, (r.reason or "").split(":")[0]) for r in history if r.slot_ms in outage
    )
    assert set(fates) <= {("succeeded", ""), ("skipped", "overlap")}, fates
    print(
        f"\npostgres: server unreachable {restored_at - cut_at:.1f} s; first run "
        f"{recovered_in:.2f} s after it came back; outage slots: {dict(fates)} "
        f"({len(outage) - sum(fates.values())} dropped); claim errors "
        f"{metrics.get('claim_errors')}"
    )


async def test_a_silent_network_fails_calls_within_the_timeout(schema: str) -> None:
    """Packets dropped, connections open: calls fail after ``timeout_ms`` instead of hanging,
    and the backend works again once the network does."""
    with TcpProxy() as proxy:
        backend = PostgresBackend(
            f"postgresql://127.0.0.1:{proxy.port}/test", schema=schema, timeout_ms=1_000
        )
        await backend.start()
        try:
            assert await backend.history("job") == []
            proxy.hold()
            for call in (backend.history("job"), backend.server_time_ms(), backend.last_slot("j")):
                began = time.monotonic()
                with pytest.raises(BackendUnavailable, match="timeout_ms=1000"):
                    await call
                assert time.monotonic() - began < 2.5
            proxy.restore()
            restored = time.monotonic()
            while True:
                try:
                    assert await backend.history("job") == []
                    break
                except BackendUnavailable:
                    assert time.monotonic() < restored + 15, "the backend did not recover"
                    await asyncio.sleep(0.2)
            took = time.monotonic() - restored
            print(f"\npostgres: silent network: calls failed in 1 s; recovered in {took:.2f} s")
        finally:
            await backend.stop()


def _actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.action
        for r in caplog.records
        if r.name == "anarchon.backends.postgres" and hasattr(r, "action")
    ]


async def test_an_outage_is_logged_once_and_so_is_its_end(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Many failed calls and reconnections, one line each for the outage and its end: for
    the calls (backend_unavailable, backend_recovered) and for LISTEN (notifications_lost,
    notifications_resumed)."""
    caplog.set_level(logging.DEBUG, logger="anarchon.backends.postgres")
    with TcpProxy() as proxy:
        backend = PostgresBackend(
            f"postgresql://127.0.0.1:{proxy.port}/test", schema=schema, timeout_ms=2_000
        )
        await backend.start()
        try:
            await backend.subscribe(lambda job, key, released: None)
            assert await backend.history("job") == []
            proxy.cut()
            for _ in range(3):
                with pytest.raises(BackendUnavailable):
                    await backend.history("job")
            await asyncio.sleep(1.5)  # the listener fails to reconnect a few times meanwhile
            proxy.restore()
            deadline = time.monotonic() + 20
            while not {"notifications_resumed", "backend_recovered"} <= set(_actions(caplog)):
                assert time.monotonic() < deadline, _actions(caplog)
                with contextlib.suppress(BackendUnavailable):
                    await backend.history("job")
                await asyncio.sleep(0.2)
        finally:
            await backend.stop()
    # Not outage actions: the schema set-up, and the listener's DEBUG "listening on" record.
    assert sorted(a for a in _actions(caplog) if a not in ("migrated", "listen")) == [
        "backend_recovered",
        "backend_unavailable",
        "notifications_lost",
        "notifications_resumed",
    ], caplog.text


async def test_an_outage_the_server_refuses_says_why(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The backend's role may no longer log in (a password rotated, a role disabled) and its
    connections end: the calls that find no connection in time say why the pool's connection
    attempts fail, not only that the pool timed out, and so does the outage's one log line.
    Every option at its default."""
    caplog.set_level(logging.DEBUG, logger="anarchon.backends.postgres")
    role = f"anarchon_refused_{uuid.uuid4().hex[:8]}"
    admin = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        backend = PostgresBackend(f"postgresql://{role}@127.0.0.1:5432/test", schema=schema)
        await backend.start()
        try:
            assert await backend.history("job") == []
            await admin.execute(f"ALTER ROLE {role} NOLOGIN")
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            # The first call may meet its connection's end (the server's goodbye); then the
            # call waits for the pool to connect, which it cannot, until timeout_ms.
            errors: list[str] = []
            while "connection attempt" not in (errors or [""])[-1]:
                assert len(errors) < 3, errors
                with pytest.raises(BackendUnavailable) as refused:
                    await backend.history("job")
                errors.append(str(refused.value))
            assert errors[-1].endswith(
                "; the pool's last connection attempt failed: connection failed: connection to "
                'server at "127.0.0.1", port 5432 failed: FATAL:  role '
                f'"{role}" is not permitted to log in'
            ), errors
            await admin.execute(f"ALTER ROLE {role} LOGIN")
            deadline = time.monotonic() + 30  # the pool retries with a backoff of its own
            while not await _answers(backend):
                assert time.monotonic() < deadline, caplog.text
                await asyncio.sleep(0.5)
        finally:
            await backend.stop()
        assert [a for a in _actions(caplog) if a != "migrated"] == [
            "backend_unavailable",
            "backend_recovered",
        ], caplog.text
    finally:
        await admin.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def _answers(backend: PostgresBackend) -> bool:
    """Whether a call on ``backend`` succeeds now."""
    try:
        await backend.history("job")
    except BackendUnavailable:
        return False
    return True
