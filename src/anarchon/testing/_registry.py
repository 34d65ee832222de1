"""The contract of :meth:`~anarchon.backend.Backend.registry`: instance records and definitions
sets (:mod:`anarchon.registry`). Part of :class:`~anarchon.testing.contract.BackendContract`."""

from __future__ import annotations

import logging
import os
import time
import uuid

import pytest

from .. import _records
from ..backend import Backend
from ..registry import (
    InstanceRecord,
    JobDefinition,
    OptionValue,
    RegistryStore,
    encode_definitions,
    read_instances,
    record_instance,
)

__all__ = ["RegistryContract"]

#: The jobs of the largest set the contract saves and reads back on every backend.
MANY_JOBS = 100_000


def _store(backend: Backend) -> RegistryStore:
    store = backend.registry()
    if store is None:
        pytest.skip(f"{backend.name} keeps no registry (registry() is None)")
    assert isinstance(store, RegistryStore)
    return store


def _jobs(count: int, expression: str = "*/2 * * * *") -> tuple[JobDefinition, ...]:
    options: dict[str, OptionValue] = {"lease_ms": 15_000, "catch_up": "latest", "handover": True}
    return tuple(
        JobDefinition(name=f"job-{n:06d}", expression=expression, zone="UTC", options=options)
        for n in range(count)
    )


def _record(instance_id: str, heartbeat_ms: int, jobs: tuple[JobDefinition, ...]) -> InstanceRecord:
    return InstanceRecord(
        id=instance_id,
        host="h",
        pid=1,
        version="0.1.0",
        started_ms=heartbeat_ms - 10,
        heartbeat_ms=heartbeat_ms,
        interval_ms=5_000,
        clock_offset_ms=None,
        jobs=jobs,
    )


def _forget() -> None:
    """Forget every set this process encoded or decoded, so the next read asks the store."""
    _records._decodings.clear()
    _records._encodings.clear()


class RegistryContract:
    """Instance records and definitions sets (:class:`~anarchon.registry.RegistryStore`), on
    every backend whose :meth:`~anarchon.backend.Backend.registry` is not None."""

    async def test_reading_an_empty_registry_creates_nothing(self, backend: Backend) -> None:
        """Reading an empty registry creates nothing."""
        store = _store(backend)
        assert await store.instances() == []
        assert await store.remove_silent(10**12) == []
        await store.remove("nobody")
        assert await store.definitions("0" * 64) is None
        assert not await store.has_definitions("0" * 64)
        assert not await store.touch_definitions("0" * 64, 1_000)
        assert not await store.has_definitions("0" * 64)
        assert await store.prune_definitions(set(), 10**15) == []
        assert not await store.exists()

    async def test_records_are_replaced_whole_and_removed(self, backend: Backend) -> None:
        """Records are replaced whole and removed; they name their definitions by digest."""
        store = _store(backend)
        await record_instance(store, _record("a", 1_000, _jobs(2)))
        await record_instance(store, _record("b/ü x", 2_000, _jobs(1)))  # any printable id
        await record_instance(store, _record("a", 3_000, _jobs(3, "*/3 * * * *")))
        assert await store.exists()
        raw = {r.id: r for r in await store.instances()}
        assert raw["a"].jobs == () and raw["a"].job_count == 3
        assert raw["a"].definitions == encode_definitions(_jobs(3, "*/3 * * * *"))[0]
        assert len(raw["a"].to_json()) < 400  # the record does not carry the definitions
        _forget()
        by_id = {r.id: r for r in await read_instances(store)}
        assert set(by_id) == {"a", "b/ü x"}
        assert by_id["a"].heartbeat_ms == 3_000
        assert by_id["a"].jobs == _jobs(3, "*/3 * * * *")
        assert by_id["b/ü x"].jobs == _jobs(1)
        await store.remove("a")
        assert [r.id for r in await store.instances()] == ["b/ü x"]
        await store.remove("b/ü x")
        assert await store.instances() == []
        assert await store.exists()  # no instance now is not "never any instance"

    async def test_silent_instances_are_removed_and_fresh_ones_kept(self, backend: Backend) -> None:
        """Silent instances are removed; one that beat at the cutoff is kept."""
        store = _store(backend)
        for n, beat in enumerate((1_000, 2_000, 3_000)):
            await record_instance(store, _record(f"i{n}", beat, _jobs(1)))
        assert sorted(await store.remove_silent(2_000)) == ["i0"]
        assert sorted(r.id for r in await store.instances()) == ["i1", "i2"]
        assert sorted(await store.remove_silent(10_000)) == ["i1", "i2"]
        assert await store.instances() == []

    async def test_a_set_is_saved_once_and_pruned_only_when_old_and_unnamed(
        self, backend: Backend
    ) -> None:
        """A definitions set is kept per digest; saving it again moves its saved time only;
        pruning removes the sets that are old and named by no live record."""
        store = _store(backend)
        one, two = b"\x00\xffone" * 10, b"two"
        await store.save_definitions("d1", one, 1_000)
        await store.save_definitions("d2", two, 1_000)
        await store.save_definitions("d1", b"ignored: a digest's data never changes", 5_000)
        assert await store.has_definitions("d1") and await store.has_definitions("d2")
        assert await store.definitions("d1") == one
        assert await store.definitions("d2") == two
        assert await store.prune_definitions({"d2"}, 5_000) == []  # d1 saved at the cutoff
        assert await store.prune_definitions(set(), 2_000) == ["d2"]
        assert await store.definitions("d2") is None and not await store.has_definitions("d2")
        assert await store.prune_definitions({"d1"}, 10**15) == []
        assert await store.prune_definitions(set(), 10**15) == ["d1"]
        assert await store.definitions("d1") is None
        await store.save_definitions("d1", one, 9_000)  # saved again after a prune
        assert await store.definitions("d1") == one

    async def test_a_set_found_by_a_new_record_outlives_a_prune_read_before_it(
        self, backend: Backend
    ) -> None:
        """An instance that starts (or changes its jobs) with a set that is kept but old and
        named by nobody (a rollback, say) records itself naming it while another instance's
        beat may have read the records just before and prunes just after: the set's saved
        time moves with that first record, so the prune keeps it (it does not drop a set a
        live record names for the minute until the next check)."""
        store = _store(backend)
        jobs = _jobs(3, "*/7 * * * *")
        digest = encode_definitions(jobs)[0]
        await record_instance(store, _record("old", 1_000, jobs))  # saved at 1 000
        await store.remove("old")  # nobody names it now
        keep = {r.definitions for r in await store.instances() if r.definitions}  # a beat
        await record_instance(store, _record("new", 5_000, jobs), {})  # finds it, names it
        assert await store.prune_definitions(keep, 2_000) == []  # touched at 5 000
        assert await store.has_definitions(digest)
        await store.remove("new")

    async def test_touching_a_set_moves_its_saved_time_only_if_it_is_kept(
        self, backend: Backend
    ) -> None:
        """Touching a kept set moves its saved time (never back) and answers True; touching a
        missing one answers False and saves nothing."""
        store = _store(backend)
        assert not await store.touch_definitions("t1", 1_000)
        assert not await store.has_definitions("t1")
        await store.save_definitions("t1", b"one", 1_000)
        assert await store.touch_definitions("t1", 5_000)
        assert await store.touch_definitions("t1", 2_000)  # stays at 5 000
        assert await store.prune_definitions(set(), 5_000) == []
        assert await store.definitions("t1") == b"one"
        assert await store.prune_definitions(set(), 5_001) == ["t1"]
        assert not await store.touch_definitions("t1", 9_000)
        assert not await store.has_definitions("t1") and await store.definitions("t1") is None

    async def test_a_first_record_of_a_kept_set_does_not_send_it_again(
        self, backend: Backend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An instance's first record of a digest the store keeps (every start but the first
        one's, in a deploy) moves the set's saved time without sending its bytes (100 000 jobs
        are megabytes); a set pruned since is sent again."""
        store = _store(backend)
        jobs = _jobs(5, "*/11 * * * *")
        digest = encode_definitions(jobs)[0]
        await record_instance(store, _record("first", 1_000, jobs))
        sent: list[str] = []
        save = store.save_definitions

        async def counted(digest: str, data: bytes, saved_ms: int) -> None:
            sent.append(digest)
            await save(digest, data, saved_ms)

        monkeypatch.setattr(store, "save_definitions", counted)
        await record_instance(store, _record("second", 5_000, jobs), {})
        assert sent == []
        assert await store.prune_definitions(set(), 5_000) == []  # touched at 5 000
        assert await store.prune_definitions(set(), 5_001) == [digest]
        await record_instance(store, _record("third", 6_000, jobs), {})
        assert sent == [digest]
        _forget()
        assert {r.id: r.jobs for r in await read_instances(store)}["third"] == jobs

    async def test_a_set_larger_than_one_message_round_trips(self, backend: Backend) -> None:
        """A set of 3 MB that does not compress (larger than a NATS message) is kept whole."""
        store = _store(backend)
        data = os.urandom(3_000_000)
        await store.save_definitions("large", data, 1_000)
        assert await store.definitions("large") == data
        assert await store.prune_definitions(set(), 2_000) == ["large"]
        assert await store.definitions("large") is None

    async def test_a_record_naming_a_missing_set_is_read_without_jobs(
        self, backend: Backend, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A record whose set nobody saved is read with its job count and no jobs, and logged
        once (``definitions_missing``)."""
        store = _store(backend)
        jobs = _jobs(4)
        name = f"a-{uuid.uuid4().hex}"  # logged once per instance and digest, per process
        await record_instance(store, _record(name, 1_000, jobs))
        digest = encode_definitions(jobs)[0]
        assert await store.prune_definitions(set(), 10**15) == [digest]
        _forget()
        caplog.set_level(logging.WARNING, logger="anarchon.scheduler")
        for _ in range(2):
            [read] = await read_instances(store)
            assert read.jobs == () and read.job_count == 4 and read.definitions == digest
        missing = [r for r in caplog.records if getattr(r, "action", None) == "definitions_missing"]
        assert len(missing) == 1 and name in missing[0].getMessage()
        saved: dict[str, float] = {}
        await record_instance(store, _record(name, 2_000, jobs), saved)  # saves it again
        _forget()
        [read] = await read_instances(store)
        assert read.jobs == jobs

    async def test_a_set_of_100_000_jobs_round_trips(self, backend: Backend) -> None:
        """A set of 100 000 jobs is saved once and read back whole; the record stays small."""
        store = _store(backend)
        jobs = _jobs(MANY_JOBS)
        began = time.perf_counter()
        await record_instance(store, _record("big", 1_000, jobs))
        saved_s = time.perf_counter() - began
        [raw] = await store.instances()
        assert raw.job_count == MANY_JOBS and len(raw.to_json()) < 400
        began = time.perf_counter()
        await record_instance(store, _record("big", 2_000, jobs), {})  # kept: touched, not sent
        beat_s = time.perf_counter() - began
        assert beat_s < max(saved_s, 0.5), (beat_s, saved_s)
        _forget()
        [read] = await read_instances(store)
        assert read.heartbeat_ms == 2_000
        assert len(read.jobs) == MANY_JOBS and read.jobs[-1] == jobs[-1] and read.jobs == jobs
