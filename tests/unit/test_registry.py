"""The registry's pure parts and the heartbeat, with the in-memory backend and a fake clock."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import pytest

from anarchon import InvalidOption, Run, RunContext, RunStatus, Scheduler
from anarchon._heartbeat import PRUNE_EVERY, PRUNE_GRACE_MS, Heartbeat
from anarchon.backend import Backend, ClaimOutcome, ClaimRequest, Ticket
from anarchon.backends.memory import MemoryRegistry
from anarchon.control import RunRequest
from anarchon.errors import BackendUnavailable
from anarchon.registry import (
    InstanceRecord,
    JobDefinition,
    RegistryStore,
    build_view,
    decode_definitions,
    describe_jobs,
    encode_definitions,
    read_instances,
    record_instance,
)
from anarchon.testing import FakeClock, MemoryBackend
from tests.records import claim_request, instance_record


def definition(expression: str = "*/2 * * * *", **options: int) -> JobDefinition:
    return JobDefinition(name="sync", expression=expression, zone="UTC", options=options)


def record(instance_id: str, *jobs: JobDefinition, beat: int = 1_000) -> InstanceRecord:
    return instance_record(instance_id, *jobs, beat=beat, clock_offset_ms=3)


def test_the_fingerprint_is_stable_and_ignores_spacing_and_option_order() -> None:
    one = JobDefinition(name="a", expression="*/2  * * * *", zone="UTC", options={"x": 1, "y": 2})
    two = JobDefinition(name="a", expression="*/2 * * * *", zone="UTC", options={"y": 2, "x": 1})
    assert one.fingerprint == two.fingerprint == "ebf3461187332e73"
    assert definition(lease_ms=1).fingerprint != definition(lease_ms=2).fingerprint


def test_records_read_back_and_unreadable_documents_are_skipped() -> None:
    original = record("a", definition(lease_ms=15_000))
    read = InstanceRecord.from_json(original.to_json())
    digest = encode_definitions(original.jobs)[0]
    assert read == replace(original, jobs=(), definitions=digest, job_count=1)
    assert read is not None and read.carried == 1 and len(original.to_json()) < 400
    assert InstanceRecord.from_json("not json") is None
    assert InstanceRecord.from_json('{"record_version": 99}') is None


def test_drift_names_each_definition_with_its_instances_and_the_options_that_differ() -> None:
    view = build_view(
        [
            record("c", definition("*/3 * * * *", lease_ms=1)),
            record("a", definition(lease_ms=1)),
            record("b", definition(lease_ms=2)),
        ],
        now_ms=5,
    )
    (drift,) = view.drift
    assert [ids for _, ids in drift.variants] == [("a",), ("b",), ("c",)]
    assert drift.differing_options() == ["lease_ms"]
    assert drift.describe() == (
        "job 'sync' is defined differently: '*/2 * * * *' in UTC (lease_ms=1) on a; "
        "'*/2 * * * *' in UTC (lease_ms=2) on b; '*/3 * * * *' in UTC (lease_ms=1) on c"
    )
    agreed = build_view([record("a", definition()), record("b", definition())], now_ms=5)
    assert agreed.drift == () and agreed.carriers("sync") == ("a", "b")


@pytest.mark.parametrize("value", [0, 99, 3_600_001, "5000", True, None])
def test_a_bad_heartbeat_is_refused(value: object) -> None:
    with pytest.raises(InvalidOption, match=r"heartbeat_ms=.* for Scheduler"):
        Scheduler(MemoryBackend(), heartbeat_ms=value)  # type: ignore[arg-type]


class FailingRegistry(MemoryRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def record(self, instance: InstanceRecord) -> None:
        if self.down:
            raise BackendUnavailable("registry down")
        await super().record(instance)


def beating(
    store: RegistryStore, interval_ms: int, instance: str, *jobs: str
) -> tuple[Heartbeat, FakeClock, Scheduler]:
    """A heartbeat of ``instance`` on ``store`` on a fake clock, carrying a scheduler's
    ``jobs`` (each due once a year); the scheduler, to add more."""
    clock = FakeClock()
    scheduler = Scheduler(MemoryBackend(clock=clock), clock=clock)

    async def handler(ctx: RunContext) -> None:
        pass

    for name in jobs:
        scheduler.add(name, "0 0 1 1 *", handler)
    beat = Heartbeat(store, clock, interval_ms, instance, scheduler._jobs.values, lambda: None)
    return beat, clock, scheduler


async def test_an_outage_is_logged_once_and_the_drift_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FailingRegistry()
    beat, clock, _ = beating(store, 1_000, "me", "sync")
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    for _ in range(3):
        assert await beat.beat() is None
    store.down = False
    await store.record(record("other", definition("0 0 2 1 *"), beat=clock.now_ms()))
    for _ in range(3):
        assert await beat.beat() is not None
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["registry_unavailable", "registry_recovered", "definition_drift"]
    await clock.advance(6_001)  # six of this instance's heartbeats, not of other's (5 s)
    view = await beat.beat()
    assert view is not None and [i.id for i in view.instances] == ["me", "other"]
    await clock.advance(24_000)  # "other" silent for over 6 of its own heartbeats of 5 s
    view = await beat.beat()
    assert view is not None and [i.id for i in view.instances] == ["me"]


def test_retry_options_are_part_of_the_definition() -> None:
    from anarchon._heartbeat import definition_of

    async def handler(ctx: RunContext) -> None:
        pass

    definitions = []
    for retries in (0, 2):
        scheduler = Scheduler(MemoryBackend())
        scheduler.add("job", "* * * * *", handler, retries=retries)
        definitions.append(definition_of(scheduler._jobs["job"]))
    assert definitions[0].options["retries"] == 0
    assert definitions[1].options["retry_backoff_ms"] == 1000
    drift = build_view([record(f"i{n}", d) for n, d in enumerate(definitions)], now_ms=0).drift
    assert [d.differing_options() for d in drift] == [["retries"]]


def v1_text(instance: InstanceRecord) -> str:
    """``instance`` as version 1 wrote it: the definitions inline, ``jobs`` last."""
    head = {k: v for k, v in instance.to_dict().items() if k not in ("definitions", "job_count")}
    jobs = head.pop("jobs")
    head["record_version"] = 1
    return json.dumps({**head, "jobs": jobs}, separators=(",", ":"))


def test_version_1_records_are_still_read_whatever_their_layout() -> None:
    jobs = (definition("*/2 * * * *", lease_ms=1), definition("*/3 * * * *"))
    first = record("i1", *jobs, beat=5)
    text = v1_text(first)
    assert text.endswith("]}") and json.loads(text)["jobs"][0]["fingerprint"]
    assert InstanceRecord.from_json(text) == first
    later = InstanceRecord.from_json(v1_text(record("i1", *jobs, beat=9)))
    assert later is not None and later.heartbeat_ms == 9 and later.jobs == jobs
    # A document with its keys sorted (as earlier versions wrote it) reads the same.
    sorted_text = json.dumps(json.loads(text), sort_keys=True)
    assert InstanceRecord.from_json(sorted_text) == first
    # The marker inside a string does not confuse the reader.
    odd = record("i2", JobDefinition(name="sync", expression='x,"jobs":[', zone="UTC"))
    assert InstanceRecord.from_json(v1_text(odd)) == odd
    assert InstanceRecord.from_json(text[:-3] + "}") is None  # damaged: skipped


def test_a_heartbeat_builds_its_definitions_again_only_when_the_jobs_change() -> None:
    async def handler(ctx: RunContext) -> None:
        pass

    scheduler = Scheduler(MemoryBackend())
    scheduler.add("a", "* * * * *", handler)
    beat = Heartbeat(
        MemoryRegistry(),
        FakeClock(),
        5_000,
        "i",
        lambda: scheduler._jobs.values(),
        lambda: None,
    )
    first = beat.record().jobs
    assert beat.record().jobs is first and [d.name for d in first] == ["a"]
    scheduler.add("b", "* * * * *", handler)
    assert [d.name for d in beat.record().jobs] == ["a", "b"]


async def test_record_instance_returns_the_record_as_stored() -> None:
    """The record as a reader finds it: stamped with its definitions digest and job count (it
    returned nothing, and the heartbeat put its unstamped record in each view)."""
    store = MemoryRegistry()
    jobs = (JobDefinition(name="a", expression="* * * * *", zone="UTC"), definition())
    mine = record("me", *jobs, beat=2_000)
    assert mine.definitions is None and mine.job_count is None
    stored = await record_instance(store, mine)
    assert stored.definitions == encode_definitions(mine.jobs)[0] and stored.job_count == 2
    assert stored.jobs is mine.jobs
    assert stored == replace(mine, definitions=stored.definitions, job_count=2)
    [read] = await read_instances(store)
    assert read == stored
    assert await record_instance(store, stored) == stored  # stamped already: as it is


async def test_a_lone_heartbeat_keeps_its_own_definitions_set() -> None:
    """The heartbeat prunes the sets that no stored record names, its own record included:
    alone, with its own record in the view unstamped (no digest), it pruned its own set once
    the set was a minute old, and readers lost its jobs until the set was saved again."""
    store = MemoryRegistry()
    beat, clock, _ = beating(store, 5_000, "me", "sync")
    first = await beat.beat()
    assert first is not None
    [mine] = first.instances
    digest = encode_definitions(mine.jobs)[0]
    for _ in range(PRUNE_EVERY):  # past the prune's grace, to a beat that prunes
        await clock.advance(PRUNE_GRACE_MS // PRUNE_EVERY + 1_000)
        assert await beat.beat() is not None
    assert await store.has_definitions(digest), "the heartbeat pruned its own set"
    [read] = await read_instances(store, clock.now_ms())
    assert [j.name for j in read.jobs] == ["sync"]
    view = await beat.beat()
    assert view is not None
    [mine] = view.instances
    assert mine.definitions == digest and mine.job_count == 1, "the view has it as stored"


async def test_instances_that_decode_to_the_same_definitions_give_the_same_view() -> None:
    jobs = (definition("*/3 * * * *"), JobDefinition(name="a", expression="* * * * *", zone="UTC"))
    store = MemoryRegistry()
    for n in range(3):
        await record_instance(store, record(f"i{n}", *tuple(jobs)))
    shared = await read_instances(store)
    assert len({id(r.jobs) for r in shared}) == 1  # one decoded tuple: the quick path
    separate = [record(f"i{n}", *jobs) for n in range(3)]  # equal, distinct tuples
    quick, full = build_view(shared, now_ms=1), build_view(separate, now_ms=1)
    assert quick.definitions._built is None  # type: ignore[attr-defined]  # until first read
    assert list(quick.definitions) == list(full.definitions) == ["a", "sync"]
    assert quick.definitions == full.definitions and quick.drift == full.drift == ()
    assert quick.definitions.get("a") == full.definitions["a"] and "b" not in quick.definitions
    assert len(quick.definitions) == 2 and dict(quick.definitions.items()) == full.definitions
    assert quick.carriers("a") == ("i0", "i1", "i2")


def test_shared_and_separate_options_dicts_encode_alike() -> None:
    """encode_definitions sorts each shared options dict once: jobs sharing one dict, jobs with
    equal dicts of their own, and a dict of other values all encode as separate dicts would."""
    shared = {"lease_ms": 1, "jitter_ms": 0}
    names = ("a", "b", "c")
    one = tuple(
        JobDefinition(name=n, expression="* * * * *", zone="UTC", options=shared) for n in names
    )
    own = tuple(
        JobDefinition(name=n, expression="* * * * *", zone="UTC", options=dict(shared))
        for n in names
    )
    assert encode_definitions(one) == encode_definitions(own)
    other = (*one[:2], replace(one[2], options={"lease_ms": 2, "jitter_ms": 0}))
    assert decode_definitions(encode_definitions(other)[1]) == other


def test_a_definitions_set_round_trips_and_its_digest_does_not_depend_on_the_tuple() -> None:
    jobs = (definition(lease_ms=1), definition("0 * * * *"))
    digest, data = encode_definitions(jobs)
    assert len(digest) == 64 and encode_definitions(tuple(jobs))[0] == digest
    assert decode_definitions(data) == jobs
    assert encode_definitions((definition(lease_ms=2),))[0] != digest
    with pytest.raises(ValueError, match="damaged"):
        decode_definitions(b"not zlib")


class EarlierRegistry:
    """A store written for the RegistryStore before touch_definitions: a MemoryRegistry
    without it, counting the sets it is sent."""

    def __init__(self) -> None:
        self.inner = MemoryRegistry()
        self.sent = 0

    def __getattr__(self, name: str) -> Any:
        if name == "touch_definitions":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        self.sent += 1
        await self.inner.save_definitions(digest, data, saved_ms)


async def test_a_store_without_touch_has_the_first_record_s_set_saved() -> None:
    """A store without touch_definitions (an outside backend's, written before it) keeps
    working: each first record of a digest saves the set, which moves its saved time, so the
    race of a prune read before the record stays fixed there too. RegistryStore's own default
    (for a store that subclasses it) answers False: save."""
    store = EarlierRegistry()
    assert not hasattr(store, "touch_definitions")
    jobs = (definition(lease_ms=7),)
    await record_instance(cast(RegistryStore, store), record("old", *jobs, beat=1_000))
    await store.inner.remove("old")
    await record_instance(cast(RegistryStore, store), record("new", *jobs, beat=5_000), {})
    assert store.sent == 2
    assert await store.inner.prune_definitions(set(), 2_000) == []
    assert not await RegistryStore.touch_definitions(cast(RegistryStore, store), "d", 1)


def test_a_record_is_live_for_six_of_its_own_heartbeats() -> None:
    """One rule for every reader: is_live, and build_view's instances, carriers, definitions
    and silent records follow it."""
    from anarchon.registry import SILENT_HEARTBEATS, carrier_warning, is_live

    assert SILENT_HEARTBEATS == 6
    slow = instance_record("slow", definition(), beat=0, interval_ms=10_000)
    a = JobDefinition(name="a", expression="* * * * *", zone="UTC")
    fast = instance_record("fast", a, beat=0, interval_ms=1_000)
    assert is_live(fast, 6_000) and not is_live(fast, 6_001)
    assert is_live(slow, 60_000) and not is_live(slow, 60_001)
    view = build_view([slow, fast], now_ms=6_001)
    assert [i.id for i in view.instances] == ["slow"] and [i.id for i in view.silent] == ["fast"]
    assert list(view.definitions) == ["sync"] and view.carriers("a") == ()
    assert carrier_warning(view, "a", "trigger") == (
        "no live instance carries job 'a': the request waits until one does"
    )
    assert carrier_warning(view, "a", "pause") == (
        "no live instance carries job 'a': the pause holds once one carries it"
    )
    assert carrier_warning(view, "sync", "trigger") is None
    assert carrier_warning(view, "*", "pause") is None
    gone = build_view([slow, fast], now_ms=60_001)
    assert gone.instances == () and gone.definitions == {} and len(gone.silent) == 2


async def test_every_instance_dead_none_is_live_though_the_records_stay() -> None:
    """Nobody is left to remove the records of instances killed with kill -9: readers leave
    them out all the same, and do not read their definitions sets."""
    store = MemoryRegistry()
    await record_instance(store, record("w0", definition("0 0 1 1 *"), beat=1_000))
    await record_instance(store, record("w1", definition("0 0 2 1 *"), beat=1_000))
    now = 1_000 + 6 * 5_000 + 1
    assert {r.id for r in await read_instances(store)} == {"w0", "w1"}  # still stored
    unresolved = await read_instances(store, now)
    assert [r.jobs for r in unresolved] == [(), ()] and [r.carried for r in unresolved] == [1, 1]
    view = build_view(unresolved, now)
    assert view.instances == () and view.definitions == {} and view.drift == ()
    assert [i.id for i in view.silent] == ["w0", "w1"]


async def test_a_heartbeat_removes_a_record_only_once_it_is_silent_by_its_own_interval() -> None:
    """An instance that beats every 100 ms leaves alone a live one beating every 10 s (the old
    rule, six of the remover's own heartbeats, removed it after 0.6 s of silence), and removes
    it after 60 s."""
    clock = FakeClock()
    store = MemoryRegistry()
    beat = Heartbeat(store, clock, 100, "fast", lambda: (), lambda: None)
    slow = instance_record("slow", definition(), beat=clock.now_ms(), interval_ms=10_000)
    await store.record(slow)
    await clock.advance(9_000)
    view = await beat.beat()
    assert view is not None and [i.id for i in view.instances] == ["fast", "slow"]
    assert {r.id for r in await store.instances()} == {"fast", "slow"}
    await clock.advance(51_001)
    view = await beat.beat()
    assert view is not None and [i.id for i in view.instances] == ["fast"]
    assert {r.id for r in await store.instances()} == {"fast"}


class _SlowHistory(Backend):
    """A backend from outside anarchon, written before ``Backend.histories`` existed: it
    implements only the abstract calls, on a :class:`MemoryBackend`. Each history read takes
    20 ms of the event loop's time; counts the reads in flight."""

    def __init__(self, failing: str | None = None) -> None:
        self.inner = MemoryBackend()
        self.failing = failing
        self.in_flight = self.most = 0

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        return await self.inner.claim(requests)

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        return await self.inner.finish(ticket, status, error, retry)

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            if job == self.failing:
                raise BackendUnavailable(f"history of {job}: connection lost (test)")
            return await self.inner.history(job, limit)
        finally:
            self.in_flight -= 1


async def _ran(backend: Backend, job: str, slot: int, status: RunStatus) -> None:
    [won] = await backend.claim([claim_request(job, slot, "w0", lease_ms=0)])
    assert won.ticket is not None
    if status is not RunStatus.RUNNING:
        await backend.finish(won.ticket, status, "boom" if status is RunStatus.FAILED else None)


async def test_the_default_histories_answers_each_jobs_history() -> None:
    """A backend without a histories of its own answers it from its history, job by job."""
    backend = _SlowHistory()
    assert "histories" not in vars(type(backend))
    for n, status in enumerate([RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.RUNNING]):
        await _ran(backend, "a", 60_000 * (n + 1), status)
    await _ran(backend, "b", 60_000, RunStatus.SUCCEEDED)
    jobs = ["a", "nobody", "b", "a"]
    found = await backend.histories(jobs)  # the default limit
    assert found == {job: await backend.history(job) for job in jobs}
    assert [(r.slot_ms, r.status) for r in found["a"]] == [
        (180_000, RunStatus.RUNNING),
        (120_000, RunStatus.FAILED),
        (60_000, RunStatus.SUCCEEDED),
    ]
    assert found["nobody"] == [] and [r.slot_ms for r in found["b"]] == [60_000]
    assert await backend.histories(jobs, 2) == {job: await backend.history(job, 2) for job in jobs}
    assert [len(r) for r in (await backend.histories(jobs, 2)).values()] == [2, 0, 1]
    assert await backend.histories(jobs, 0) == {"a": [], "nobody": [], "b": []}


class _Counted(MemoryBackend):
    """The in-memory backend (it has a histories of its own), counting the reads."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        self.calls.append("history")
        return await super().history(job, limit)

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        self.calls.append(f"histories of {len(jobs)}")
        return await super().histories(jobs, limit)


async def test_describe_jobs_reads_every_history_in_one_call() -> None:
    """'anarchon jobs' read each job's history in a call of its own: 0.85 to 1.9 s at 3 000
    jobs on SQLite. A backend with a histories of its own answers them in one call."""
    backend = _Counted()
    for i in (0, 7, 2_999):
        await _ran(backend, f"job{i}", 60_000 * (i + 1), RunStatus.SUCCEEDED)
    await _ran(backend, "job7", 60_000 * 9, RunStatus.RUNNING)
    jobs = [JobDefinition(name=f"job{i}", expression="* * * * *", zone="UTC") for i in range(3_000)]
    view = build_view([record("w0", *jobs, beat=1_000)], 1_000)
    found = await describe_jobs(backend, view)  # every option at its default
    assert backend.calls == ["histories of 3000"]
    ran = {j.name: j.last_run.slot_ms for j in found if j.last_run is not None}
    assert ran == {"job0": 60_000, "job7": 480_000, "job2999": 180_000_000}, ran
    running = {j.name: [r.slot_ms for r in j.running] for j in found if j.running}
    assert running == {"job7": [540_000]}


async def test_describe_jobs_reads_histories_a_few_dozen_at_a_time() -> None:
    """'anarchon jobs' read each job's history one after another: 5.8 s at 3 006 jobs on
    SQLite. On a backend without a histories of its own (the default), it reads DESCRIBE_READS
    at a time, each job keeping its own runs."""
    backend = _SlowHistory()
    jobs = [JobDefinition(name=f"job{i}", expression="* * * * *", zone="UTC") for i in range(200)]
    for i in (0, 7, 199):
        await _ran(backend, f"job{i}", 60_000 * (i + 1), RunStatus.SUCCEEDED)
    view = build_view([record("w0", *jobs, beat=1_000)], 1_000)
    started = time.perf_counter()
    found = await describe_jobs(backend, view)  # every option at its default
    took = time.perf_counter() - started
    assert backend.most == 32, backend.most  # DESCRIBE_READS
    assert took < 200 * 0.02 / 2, took  # one after another: 4 s
    assert [j.name for j in found] == sorted(f"job{i}" for i in range(200))
    ran = {j.name: j.last_run.slot_ms for j in found if j.last_run is not None}
    assert ran == {"job0": 60_000, "job7": 480_000, "job199": 12_000_000}, ran


async def test_describe_jobs_raises_the_error_of_a_failed_read() -> None:
    """Not an ExceptionGroup: the commands turn a BackendError into their exit code."""
    backend = _SlowHistory(failing="job3")
    jobs = [JobDefinition(name=f"job{i}", expression="* * * * *", zone="UTC") for i in range(50)]
    view = build_view([record("w0", *jobs, beat=1_000)], 1_000)
    with pytest.raises(BackendUnavailable, match="history of job3: connection lost"):
        await describe_jobs(backend, view)
    assert backend.in_flight == 0  # the other reads ended too
