"""Records made by hand: registry records, for tests that build a cluster view without
instances, and claim requests, for tests that call a backend without a scheduler."""

from __future__ import annotations

import uuid

from anarchon import Trigger
from anarchon.backend import ClaimRequest
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
