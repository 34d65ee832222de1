"""The NATS registry's cost per heartbeat: one read of the records, not two.

A beat removes the silent records and then reads the registry (anarchon._heartbeat). On NATS a
read is a listing and a get per record; read twice a beat, 100 instances of a bench fleet took
5 s a beat on one event loop, and rank delays ranked by views that old.

And a prune of a definitions set racing a save of the same digest (driven here from a wrapped
key-value call): the prune removes only what was stored before the manifest it deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

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


async def _set_keys(store: NatsRegistry, digest: str) -> set[str]:
    """The definitions keys of ``digest`` that hold a message (a delete marker counts), without
    the store's prefix token."""
    listed = await store._backend._conn.bucket_keys(store._sets_bucket, f"{store._space}.{digest}.")
    return {key.split(".", 1)[1] for key in listed}


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


async def test_a_set_saved_again_while_a_prune_removes_it_keeps_its_chunks(
    make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune deletes an old set's manifest, then its chunks; another instance that saves the
    same digest in between (its touch finds no manifest, so it writes the chunks and a new
    manifest) keeps a whole set: the prune removes only the chunks of the manifest it deleted.
    The save runs deterministically in that gap, from the prune's manifest delete."""
    pruner, saver = (await make()).registry(), (await make()).registry()
    data = bytes(range(256)) * 64
    await pruner.save_definitions("d1", data, 1_000)
    kv: Any = pruner._sets_kv
    delete = kv.delete

    async def delete_then_save(key: str, last: int | None = None, **options: Any) -> bool:
        deleted = bool(await delete(key, last=last, **options))
        if last is not None:  # the manifest's compare-and-set delete: the gap
            await saver.save_definitions("d1", data, 9_000)
        return deleted

    monkeypatch.setattr(kv, "delete", delete_then_save)
    assert await pruner.prune_definitions(set(), 2_000) == ["d1"]
    assert await saver.definitions("d1") == data
    assert await pruner.definitions("d1") == data
    monkeypatch.undo()
    assert await pruner.prune_definitions(set(), 9_000) == []  # saved at 9 000
    assert await pruner.prune_definitions(set(), 9_001) == ["d1"]
    assert await saver.definitions("d1") is None
    assert await _set_keys(pruner, "d1") == {"d1.m"}  # the manifest's delete marker alone
