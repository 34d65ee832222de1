"""The NATS registry's cost per heartbeat: one read of the records, not two, and a read's
requests do not grow with the records.

A beat removes the silent records and then reads the registry (anarchon._heartbeat). On NATS a
read was a listing and a get per record; read twice a beat, 100 instances of a bench fleet took
5 s a beat on one event loop, and rank delays ranked by views that old.

And a prune of a definitions set racing a save of the same digest (driven here from a wrapped
key-value call): the prune removes only what was stored before the manifest it deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nats.js.errors import KeyWrongLastSequenceError

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
    listed = await store._backend._buckets.bucket_keys(
        store._sets_bucket, f"{store._space}.{digest}."
    )
    return {key.split(".", 1)[1] for key in listed}


async def _instance_keys(store: NatsRegistry) -> set[str]:
    """The registry's keys that hold a message (a delete marker counts)."""
    return set(await store._backend._buckets.bucket_keys(store._bucket, f"{store._space}."))


def _count_reads(store: NatsRegistry) -> list[int]:
    """Count the store's reads of the registry's records."""
    reads = [0]
    buckets: Any = store._backend._buckets
    read_bucket = buckets.read_bucket

    async def counting(bucket: str, start: str) -> list[tuple[str, Any]]:
        reads[0] += 1
        return list(await read_bucket(bucket, start))

    buckets.read_bucket = counting
    return reads


async def test_removing_silent_records_after_a_read_reads_nothing_again(
    make: Callable[..., Any],
) -> None:
    """remove_silent works from the last read (instances()) instead of reading again, and
    removes exactly the silent records of that read."""
    store = (await make()).registry()
    for n, beat in enumerate((1_000, 5_000, 9_000)):
        await store.record(_record(f"i{n}", beat))
    reads = _count_reads(store)
    assert sorted(r.id for r in await store.instances()) == ["i0", "i1", "i2"]
    assert reads == [1]
    assert await store.remove_silent(6_000) == ["i0", "i1"]
    assert reads == [1]  # no second read in the beat
    assert [r.id for r in await store.instances()] == ["i2"]
    # A record first written after the read is not in it; once the read is used, the next
    # call reads the records itself.
    await store.record(_record("i3", 2_000))
    assert await store.remove_silent(6_000) == []
    assert reads == [2]
    assert await store.remove_silent(6_000) == ["i3"]
    assert reads == [3]


async def test_a_read_costs_the_same_requests_for_3_records_as_for_60(
    make: Callable[..., Any],
) -> None:
    """A read is one consumer on the bucket's stream, whatever the number of records (it was a
    listing and a get per record: each beat of each instance of a fleet of N cost N + 1
    requests). Counted as the messages the client sent."""
    store = (await make()).registry()
    nc = store._backend._conn.nc

    async def read_cost(expected: int) -> int:
        before = nc.stats["out_msgs"]
        records = await store.instances()
        assert len(records) == expected
        return int(nc.stats["out_msgs"] - before)

    for n in range(3):
        await store.record(_record(f"i{n}", 1_000))
    small = await read_cost(3)
    for n in range(3, 60):
        await store.record(_record(f"i{n}", 1_000))
    assert await read_cost(60) == small
    assert small <= 4


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
    buckets: Any = pruner._backend._buckets
    delete_key = buckets.delete_key

    async def delete_then_save(bucket: str, key: str, last: int) -> int | None:
        marker = await delete_key(bucket, key, last)  # the manifest's delete: the gap
        await saver.save_definitions("d1", data, 9_000)
        return marker  # type: ignore[no-any-return]

    monkeypatch.setattr(buckets, "delete_key", delete_then_save)
    assert await pruner.prune_definitions(set(), 2_000) == ["d1"]
    assert await saver.definitions("d1") == data
    assert await pruner.definitions("d1") == data
    monkeypatch.undo()
    assert await pruner.prune_definitions(set(), 9_000) == []  # saved at 9 000
    assert await pruner.prune_definitions(set(), 9_001) == ["d1"]
    assert await saver.definitions("d1") is None
    assert await _set_keys(pruner, "d1") == set()  # no delete marker left behind


async def test_a_set_touched_while_a_prune_reads_it_is_kept(
    make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune read an old manifest; another instance touches the set before the prune's
    compare-and-set delete: the delete loses, the prune goes on to the next set and keeps this
    one (it is in use again)."""
    pruner, toucher = (await make()).registry(), (await make()).registry()
    data = b"definitions" * 100
    await pruner.save_definitions("d1", data, 1_000)
    await pruner.save_definitions("d2", data, 1_000)
    buckets: Any = pruner._backend._buckets
    delete_key = buckets.delete_key

    async def touch_then_delete(bucket: str, key: str, last: int) -> int | None:
        if ".d1." in key:
            assert await toucher.touch_definitions("d1", 9_000)
        return await delete_key(bucket, key, last)  # type: ignore[no-any-return]

    monkeypatch.setattr(buckets, "delete_key", touch_then_delete)
    assert await pruner.prune_definitions(set(), 2_000) == ["d2"]
    assert await pruner.definitions("d1") == data
    assert await pruner.definitions("d2") is None


async def test_a_pruned_set_leaves_no_message_and_a_left_marker_goes_at_the_next_prune(
    make: Callable[..., Any],
) -> None:
    """A prune purges the set's chunks and its manifest's delete marker: nothing of a pruned set
    stays in the bucket, so the prunes of a long-lived cluster do not read more and more
    markers. A marker a prune left (stopped between its delete and its purge) is purged by the
    next prune, which reports only the sets it deleted itself."""
    store = (await make()).registry()
    data = bytes(range(256)) * 64
    for digest in ("d1", "d2"):
        await store.save_definitions(digest, data, 1_000)
    assert await _set_keys(store, "d1") == {"d1.0", "d1.m"}
    kv: Any = store._sets_kv
    await kv.delete(store._set_key("d2", "m"))  # the delete of a prune that stopped there
    assert await store.prune_definitions(set(), 2_000) == ["d1"]
    assert await _set_keys(store, "d1") == set()
    assert await _set_keys(store, "d2") == set()
    # The digest is saved again afterwards: a whole new set.
    await store.save_definitions("d2", data, 3_000)
    assert await store.definitions("d2") == data


async def test_a_save_whose_marker_is_purged_under_its_create_creates_again(
    make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save found the manifest's delete marker (its create updates on the marker's revision);
    a prune purges the marker before that update: the create fails, and the save, finding no
    manifest, creates again instead of taking the failure for another instance's save."""
    store, pruner = (await make()).registry(), (await make()).registry()
    data = b"definitions" * 100
    await store.save_definitions("d1", data, 1_000)
    kv: Any = store._sets_kv
    await kv.delete(store._set_key("d1", "m"))  # a marker left by a stopped prune
    create = kv.create
    creates = []

    async def purge_then_create(key: str, value: bytes, **options: Any) -> int:
        creates.append(key)
        if len(creates) == 1:
            # nats-py's create read the marker; a prune purges it before the create's update on
            # the marker's revision, which then fails as here.
            assert await pruner.prune_definitions(set(), 2_000) == []
            raise KeyWrongLastSequenceError()
        return await create(key, value, **options)  # type: ignore[no-any-return]

    monkeypatch.setattr(kv, "create", purge_then_create)
    await store.save_definitions("d1", data, 3_000)
    assert len(creates) == 2
    assert await store.definitions("d1") == data


async def test_removed_instances_leave_no_message_behind(make: Callable[..., Any]) -> None:
    """An instance that stops (remove) or falls silent (remove_silent) leaves nothing in the
    bucket: every read delivers each key's last message, so a delete marker per instance ever
    stopped would make each heartbeat of a long-lived cluster read more. A marker a removal
    left (stopped between its delete and its purge) is purged by the next remove_silent; a
    record written after a removal's read is kept."""
    store = (await make()).registry()
    for n, beat in enumerate((1_000, 2_000, 9_000, 9_000)):
        await store.record(_record(f"i{n}", beat))
    await store.remove("i2")
    kv: Any = store._kv
    await kv.delete(store._key("i3"))  # the delete of a removal that stopped there
    assert await _instance_keys(store) == {store._key(i) for i in ("i0", "i1", "i3")}
    assert sorted(r.id for r in await store.instances()) == ["i0", "i1"]
    await store.record(_record("i1", 8_000))  # i1 beat again after the read: kept
    assert await store.remove_silent(6_000) == ["i0"]
    assert await _instance_keys(store) == {store._key("i1")}
    assert [r.id for r in await store.instances()] == ["i1"]
