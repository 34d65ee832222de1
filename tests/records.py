"""Registry records made by hand, for tests that build a cluster view without instances."""

from __future__ import annotations

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
