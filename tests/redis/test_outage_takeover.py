"""A Redis outage longer than the lease must not run a finished slot again.

Found by a QA probe: the handler finished while Redis was unreachable, its result waiting to be
retried; the lease ran out meanwhile (nobody could renew it), and the backup took the run over the
moment Redis answered again, running the handler a second time; the first result was refused
2 s later. The backup now gives the holder a grace after the outage (see
``anarchon._watcher.outage_grace_ms``), and the result lands first.

The private redis-server keeps its data (appendonly, fsync always), is killed (SIGKILL) and
started again on its port 25 s later; every scheduler option at its default (lease_ms 15 s).
(A server stopped with SIGSTOP does not show it: the result sent before the stop waits in its
socket and is applied first when it resumes.)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from anarchon import Run, RunStatus, Scheduler
from anarchon.backends.redis import RedisBackend
from tests.conformance.procs import Fleet
from tests.conformance.test_failover import plan_one_slot, wait_for
from tests.redis.servers import redis_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

OUTAGE_S = 25.0  # past the default 15 s lease
# Jobs, each run by one of its two instances and watched by the other: whether a backup's retry
# or the runner's comes first after the outage is a race, so several are run at once.
JOBS = ("a", "b", "c", "d")


async def test_slots_finished_during_an_outage_are_not_run_again(tmp_path: Path) -> None:
    with redis_server(tmp_path, "--appendonly", "yes", "--appendfsync", "always") as server:
        prefix = "outage:"
        fleet = Fleet(f"{server.url}?prefix={prefix}", tmp_path)
        try:
            plan, job_of = tmp_path / "plan", {}
            for job in JOBS:
                workers = fleet.spawn(2, job=job, schedule_from=plan, seconds=180, sleep_ms=4_000)
                job_of.update({w.pid: job for w in workers})
            slot = plan_one_slot(fleet, fleet.workers, plan)
            for job in JOBS:
                wait_for(fleet, lambda r, j=job: _start(r, slot) and job_of[r["pid"]] == j, 60, job)
            await asyncio.sleep(1.0)
            server.kill()
            down_at = time.monotonic()
            for job in JOBS:
                wait_for(fleet, lambda r, j=job: _end(r, slot) and job_of[r["pid"]] == j, 30, job)
            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            server.start()
            async with Scheduler(RedisBackend(server.url, prefix=prefix)) as scheduler:
                # Until no run of the slot is left running: each result has landed (then the
                # backend refuses any takeover of it), or a takeover's run has ended.
                runs = await _settled(scheduler, slot, timeout_s=90)
            fleet.stop_all()
            logs = fleet.logs()
            starts = Counter(job_of[r["pid"]] for r in fleet.records("start") if _start(r, slot))
            assert starts == dict.fromkeys(JOBS, 1), f"slots run again: {starts}\n{logs}"
            for job in JOBS:
                assert [(r.attempt, r.status) for r in runs[job]] == [(1, RunStatus.SUCCEEDED)]
        finally:
            fleet.stop_all()


async def _settled(scheduler: Scheduler, slot: int, timeout_s: float) -> dict[str, list[Run]]:
    """Each job's runs of ``slot`` once none is running (and there is one), polled."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = {j: [r for r in await scheduler.history(j) if r.slot_ms == slot] for j in JOBS}
        if all(r and all(run.status is not RunStatus.RUNNING for run in r) for r in runs.values()):
            return runs
        assert time.monotonic() < deadline, f"runs of the slot still running: {runs}"
        await asyncio.sleep(0.2)


def _start(record: dict[str, Any], slot: int) -> bool:
    return bool(record["event"] == "start" and record["slot"] == slot)


def _end(record: dict[str, Any], slot: int) -> bool:
    return bool(record["event"] == "end" and record["slot"] == slot)
