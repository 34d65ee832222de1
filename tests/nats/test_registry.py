"""The NATS registry's cost per heartbeat: one read of the records, not two.

A beat removes the silent records and then reads the registry (anarchon._heartbeat). On NATS a
read is a listing and a get per record; read twice a beat, 100 instances of a bench fleet took
5 s a beat on one event loop, and rank delays ranked by views that old.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anarchon.backends.nats._registry import NatsRegistry
from anarchon.registry import InstanceRecord


def _record(instance: str, heartbeat_ms: int) -> InstanceRecord:
    return InstanceRecord(
        id=instance,
        host="h",
        pid=1,
        version="0",
        started_ms=heartbeat_ms,
        heartbeat_ms=heartbeat_ms,
        interval_ms=1_000,
        clock_offset_ms=0,
        jobs=(),
    )


def _count_listings(store: NatsRegistry) -> list[int]:
    """Count the store's listings of the registry's keys (one per read of the records)."""
    listed = [0]
    conn: Any = store._backend._conn
    list_keys = conn.bucket_keys

    async def counting(bucket: str, start: str) -> list[str]:
        listed[0] += 1
        return list(await list_keys(bucket, start))

    conn.bucket_keys = counting
    return listed


async def test_removing_silent_records_after_a_read_reads_nothing_again(
    make: Callable[..., Any],
) -> None:
    """remove_silent works from the last read (instances()) instead of reading again, and
    removes exactly the silent records of that read."""
    store = (await make()).registry()
    for n, beat in enumerate((1_000, 5_000, 9_000)):
        await store.record(_record(f"i{n}", beat))
    listed = _count_listings(store)
    assert sorted(r.id for r in await store.instances()) == ["i0", "i1", "i2"]
    assert listed == [1]
    assert await store.remove_silent(6_000) == ["i0", "i1"]
    assert listed == [1]  # no second read in the beat
    assert [r.id for r in await store.instances()] == ["i2"]
    # A record first written after the read is not in it; once the read is used, the next
    # call reads the records itself.
    await store.record(_record("i3", 2_000))
    assert await store.remove_silent(6_000) == []
    assert listed == [2]
    assert await store.remove_silent(6_000) == ["i3"]
    assert listed == [3]


async def test_a_record_refreshed_after_the_read_is_not_removed(make: Callable[..., Any]) -> None:
    """The read is a snapshot: a record silent in it but written again since (a new revision)
    is kept, by the compare-and-set delete."""
    store = (await make()).registry()
    await store.record(_record("slow", 1_000))
    await store.record(_record("fresh", 9_000))
    await store.instances()
    await store.record(_record("slow", 8_000))  # it beat again after the read
    assert await store.remove_silent(6_000) == []
    assert sorted(r.id for r in await store.instances()) == ["fresh", "slow"]
