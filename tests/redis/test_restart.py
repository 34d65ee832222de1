"""Real scheduler processes against a private redis-server that is killed and restarted.

While Redis is down the schedulers log, retry with backoff and run nothing; they never exit;
after the restart (without persistence: an empty data set) they resume by themselves, and no
slot runs twice, including slots whose claims were retried across the restart.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conformance.procs import Fleet
from tests.redis.servers import RedisServer, redis_server

pytestmark = pytest.mark.slow

DOWN_S = 4.0


def test_schedulers_survive_a_redis_restart(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        fleet = Fleet(f"{server.url}?prefix=restart:", tmp_path)
        try:
            _run(server, fleet)
        finally:
            fleet.stop_all()


def _run(server: RedisServer, fleet: Fleet) -> None:
    workers = fleet.spawn(
        2, seconds=60, jitter_ms=300, lease_ms=3_000, sleep_ms=300, max_late_ms=20_000
    )
    fleet.wait_ready(workers)
    time.sleep(4.0)  # past the fresh server's restart margin: a few slots run
    killed_at = time.time()
    server.kill()
    time.sleep(DOWN_S)
    restarted_at = time.time()
    server.start()
    time.sleep(7.0)
    alive = [w.proc.poll() is None for w in workers]
    ended_at = time.time()
    fleet.stop_all()
    logs = fleet.logs()
    print(f"\nredis restart: down {restarted_at - killed_at:.1f}s")

    assert alive == [True, True], f"a scheduler exited while Redis was down\n{logs}"
    assert all(w.proc.returncode == 0 for w in workers), logs
    assert len(fleet.records("exit")) == 2, "the schedulers did not stop gracefully"

    starts = fleet.records("start")
    per_slot = Counter(r["slot"] for r in starts)
    assert {s: n for s, n in per_slot.items() if n > 1} == {}, logs

    before = [r for r in starts if r["t"] < killed_at]
    during = [r for r in starts if killed_at + 0.1 < r["t"] < restarted_at]
    after = [r for r in starts if r["t"] > restarted_at]
    assert len(before) >= 2, f"nothing ran before the kill\n{logs}"
    assert during == [], f"ran while Redis was down: {during}"
    # Slots after the restart (and its margin) run again: the schedulers recovered by themselves.
    resumed = {r["slot"] for r in after if r["slot"] > (restarted_at + 3) * 1000}
    expected = {s * 1000 for s in range(int(restarted_at) + 4, int(ended_at) - 1)}
    assert expected and expected <= resumed, (sorted(expected - resumed), logs)

    # They said so, with backoff rather than a storm of retries, and never crash-looped.
    assert "ConnectionError" in logs, f"the outage went unlogged\n{logs}"
    # Claims of slots that fell due while Redis was down are retried after the restart, and
    # refused: the empty server cannot know whether they ran before it died.
    assert "not run: unknown: Redis holds no record" in logs, logs
    warnings = len(re.findall(r" WARNING ", logs))
    assert warnings < 200, f"{warnings} warnings in {DOWN_S}s: no backoff?\n{logs}"
    assert "Traceback" not in logs, logs
    print(f"redis restart: {len(before)} runs before, {len(after)} after, {warnings} warnings")
