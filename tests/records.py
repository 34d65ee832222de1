"""Records made by hand: registry records, for tests that build a cluster view without
instances; claim requests, for tests that call a backend without a scheduler; and run requests
waiting in a control store."""

from __future__ import annotations

import uuid

from anarchon import Trigger
from anarchon.backend import ClaimRequest
from anarchon.control import RunRequest, retry_key
from anarchon.registry import InstanceRecord, JobDefinition


def instance_record(
    instance: str,
    *jobs: JobDefinition,
    beat: int = 1_000,
    interval_ms: int = 5_000,
    clock_offset_ms: int | None = 0,
    version: str = "0",
) -> InstanceRecord:
    """A record of ``instance`` carrying ``jobs``, last beating at ``beat`` (backend ms)."""
    return InstanceRecord(
        id=instance,
        host="h",
        pid=1,
        version=version,
        started_ms=0,
        heartbeat_ms=beat,
        interval_ms=interval_ms,
        clock_offset_ms=clock_offset_ms,
        jobs=jobs,
    )


def claim_request(job: str, slot: int, instance: str, lease_ms: int = 5_000) -> ClaimRequest:
    """A scheduled claim of ``job``'s ``slot`` by ``instance``, with a fresh run id and token."""
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=instance,
        trigger=Trigger.SCHEDULE,
        lease_ms=lease_ms,
    )


def waiting_retry(
    job: str, slot: int, now_ms: int, *, due_in_ms: int = 3_600_000, request_id: str = "b" * 32
) -> RunRequest:
    """The first retry of the run of ``job``'s ``slot``, requested at ``now_ms`` (backend ms)
    and due ``due_in_ms`` later: a pending request that no instance claims before then."""
    return RunRequest(
        id=request_id,
        job=job,
        trigger=Trigger.RETRY,
        key=retry_key(str(slot), 1),
        slot=slot,
        due_ms=now_ms + due_in_ms,
        requested_by=f"retry 1 of 2 after run run{slot}",
        requested_at_ms=now_ms,
        retry=1,
    )
