"""What the SQLite and PostgreSQL long-history tests share: the generated job (a per-second job,
one run per slot, each started 5 ms after its slot, every 500th failed), its claims, and the
reads that must hold at 1 000 000 runs."""

from __future__ import annotations

import uuid

from anarchon import Backend, RunStatus, Trigger
from anarchon.backend import ClaimRequest
from anarchon.explain import Fate, explain
from anarchon.registry import JobDefinition

ROWS = 1_000_000
FIRST = 1_700_000_000_000  # 2023-11-14T22:13:20Z, a whole second
LAST = FIRST + (ROWS - 1) * 1000
JOB = "big"
PER_SECOND = JobDefinition(name=JOB, expression="* * * * * *", zone="UTC")


def claim_request(slot: int) -> ClaimRequest:
    """A schedule claim of ``slot`` of the job by instance w0."""
    return ClaimRequest(
        job=JOB,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="w0",
        trigger=Trigger.SCHEDULE,
        lease_ms=30_000,
    )


async def check_reads(backend: Backend) -> None:
    """history, last_run and explain of a job holding all ROWS generated runs."""
    history = await backend.history(JOB, limit=100)
    assert [r.slot_ms for r in history] == [LAST - n * 1000 for n in range(100)]
    assert await backend.last_run(JOB) == history[0]
    now = LAST + 60_000
    for slot in (LAST - 10_000, FIRST + 1000 * 1000, FIRST):
        fate = await explain(backend, JOB, slot, definition=PER_SECOND, now_ms=now)
        assert fate.fate is Fate.RAN, fate.describe()
        failed = (slot - FIRST) // 1000 % 500 == 0
        expected = RunStatus.FAILED if failed else RunStatus.SUCCEEDED
        assert fate.outcome is expected and fate.records_read == 1
        assert [a.started_ms for a in fate.attempts] == [slot + 5]
        assert fate.oldest_record_ms == FIRST
    before = await explain(backend, JOB, FIRST - 1000, definition=PER_SECOND, now_ms=now)
    assert before.fate is Fate.NO_RECORD and before.history_pruned is True
    assert "older than the oldest record" in (before.reason or "")
