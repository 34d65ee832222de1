"""Hand-over without LISTEN (PgBouncer in transaction mode): backups poll and still act fast.

With notifications on, the conformance suite's hand-over test shows NOTIFY waking the backup
(its lease is 20 s, so only a notification explains a take-over within 3 s). Here the same
SIGTERM hand-over runs with ``notifications=off`` in the URL: no LISTEN connection at all, and
the backups find the released lease by polling every ``release_poll_ms`` (500 ms).
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from anarchon import RunStatus
from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN, url_of
from tests.conformance.procs import Fleet
from tests.conformance.test_failover import one_slot, runner_of, wait_for
from tests.postgres.test_faults import _sessions

pytestmark = pytest.mark.slow


async def test_hand_over_by_polling_without_notifications(schema: str, tmp_path: Path) -> None:
    app = f"anarchon_poll_{uuid.uuid4().hex[:8]}"
    fleet = Fleet(url_of(schema, notifications="off", application_name=app), tmp_path)
    # 12 s ahead: three workers start in 2-3 s on a quiet machine, and took more than the usual
    # 6 s on a loaded CI machine, after which the slot had passed and nothing ran it.
    schedule, slot = one_slot(lead_s=12)
    try:
        workers = fleet.spawn(
            3,
            schedule=schedule,
            seconds=60,
            sleep_ms=6_000,
            jitter_ms=0,
            lease_ms=20_000,
            grace_ms=300,
        )
        fleet.wait_ready(workers)
        assert time.time() * 1000 < slot, "workers started too slowly for the planned slot"
        sessions = await _sessions(app)
        assert sessions and not any(q.startswith("LISTEN") for _, q in sessions), sessions
        first = wait_for(fleet, lambda r: r["event"] == "start" and r["slot"] == slot, 30, "start")
        stopped_at = time.time()
        runner_of(fleet, first).kill(signal.SIGTERM)
        second = wait_for(
            fleet,
            lambda r: r["event"] == "start" and r["slot"] == slot and r["attempt"] == 2,
            15,
            "the hand-over",
        )
        delay = second["t"] - stopped_at
        wait_for(fleet, lambda r: r["event"] == "end" and r["attempt"] == 2, 20, "attempt 2 end")
    finally:
        fleet.stop_all()
    print(f"\npostgres (notifications off): hand-over {delay:.2f}s after SIGTERM (grace 0.3 s)")
    assert delay < 0.3 + 0.5 + 1.5, f"hand-over took {delay:.2f}s"
    backend = PostgresBackend(DSN, schema=schema)
    await backend.start()
    try:
        runs = [r for r in await backend.history("tick") if r.slot_ms == slot]
    finally:
        await backend.stop()
    assert [(r.attempt, r.status, r.reason) for r in runs] == [
        (2, RunStatus.SUCCEEDED, None),
        (1, RunStatus.FAILED, "handed over"),
    ]
