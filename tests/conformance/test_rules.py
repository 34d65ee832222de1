"""The rules every lease backend shares (issue 11): takeover races, idempotent takeovers, late
results after ``exhausted``, retried claims, pruning, ``last_slot``, notifications, overlap
reasons, fences and requests a backend cannot store, on every lease backend's real service."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest

from anarchon import BackendError, LeaseBackend, LeaseLost, Overlap, RunStatus, Trigger
from anarchon.backend import ClaimStatus, FinishRequest, TakeoverStatus
from anarchon.testing.contract import LEASE_MS, SLOT, request, takeover
from tests.harness import Harness, Namespace

Make = Callable[[], LeaseBackend]


@pytest.fixture
async def instances(
    lease_harness: Harness, ns: Namespace
) -> AsyncIterator[Callable[[], asyncio.Future[LeaseBackend]]]:
    """``await instances()``: another started backend on the namespace (an app instance)."""
    made: list[LeaseBackend] = []

    async def make() -> LeaseBackend:
        backend = ns.make()
        assert isinstance(backend, LeaseBackend)
        await backend.start()
        made.append(backend)
        return backend

    try:
        yield make  # type: ignore[misc]
    finally:
        for backend in made:
            await backend.stop()


async def expire() -> None:
    await asyncio.sleep(LEASE_MS / 1000 + 0.3)


async def test_takeover_race_losers_are_told_held(instances, lease_harness: Harness) -> None:
    """20 hand-overs, 4 backups woken at once each time (as NOTIFY and pub/sub wake them): one
    takes over, the other three are told HELD and keep watching; none is told ENDED."""
    runner = await instances()
    backups = [await instances() for _ in range(4)]
    told: Counter[str] = Counter()
    for n in range(20):
        [won] = await runner.claim([request(slot=SLOT + n * 1000, lease_ms=60_000)])
        assert won.ticket is not None
        await runner.release(won.ticket, "handed over")
        outcomes = await asyncio.gather(
            *(
                b.take_over(takeover("job", won.ticket.slot_key, instance=f"b{k}", lease_ms=60_000))
                for k, b in enumerate(backups)
            )
        )
        told.update(o.status.value for o in outcomes)
    print(f"\n{lease_harness.name}: 20 hand-overs x 4 backups: {dict(sorted(told.items()))}")
    assert told == {"taken": 20, "held": 60}, told


async def test_concurrent_takeovers_of_an_expired_lease(instances) -> None:
    runner = await instances()
    backups = [await instances() for _ in range(6)]
    [won] = await runner.claim([request(lease_ms=LEASE_MS)])
    assert won.ticket is not None
    await expire()
    outcomes = await asyncio.gather(
        *(b.take_over(takeover("job", won.ticket.slot_key)) for b in backups)
    )
    statuses = Counter(o.status for o in outcomes)
    assert statuses == {TakeoverStatus.TAKEN: 1, TakeoverStatus.HELD: 5}, statuses


async def test_a_retried_takeover_is_taken_again(instances) -> None:
    backend = await instances()
    [won] = await backend.claim([request(lease_ms=LEASE_MS)])
    assert won.ticket is not None
    await expire()
    req = takeover("job", won.ticket.slot_key)
    first = await backend.take_over(req)
    again = await backend.take_over(req)  # the first answer was lost; same request again
    assert first.status is again.status is TakeoverStatus.TAKEN
    assert first.ticket is not None and again.ticket is not None
    assert (again.ticket.attempt, again.ticket.fence) == (first.ticket.attempt, first.ticket.fence)
    assert again.ticket.token == req.token
    other = await backend.take_over(takeover("job", won.ticket.slot_key))
    assert other.status is TakeoverStatus.HELD
    assert [r.attempt for r in await backend.history("job")] == [2, 1]


async def test_late_results_after_exhausted_are_refused_alike(instances) -> None:
    backend = await instances()
    [won] = await backend.claim([request(lease_ms=LEASE_MS)])
    assert won.ticket is not None
    await expire()
    out = await backend.take_over(takeover("job", won.ticket.slot_key, max_attempts=1))
    assert out.status is TakeoverStatus.EXHAUSTED
    with pytest.raises(LeaseLost):
        await backend.finish(won.ticket, RunStatus.FAILED, "boom")
    with pytest.raises(LeaseLost):
        await backend.finish(won.ticket, RunStatus.FAILED, None)
    with pytest.raises(LeaseLost):
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    [run] = await backend.history("job")
    assert run.status is RunStatus.FAILED and run.reason == "lease lost"


async def test_a_retried_claim_of_an_ended_attempt_is_not_won(instances) -> None:
    backend = await instances()
    req = request(lease_ms=LEASE_MS)
    [won] = await backend.claim([req])
    assert won.ticket is not None
    await expire()
    out = await backend.take_over(takeover("job", won.ticket.slot_key, max_attempts=1))
    assert out.status is TakeoverStatus.EXHAUSTED
    [again] = await backend.claim([req])  # the claim's answer was lost and it is retried
    assert again.status is ClaimStatus.LOST and again.ticket is None
    assert again.run.status is RunStatus.FAILED


async def test_a_run_longer_than_the_ttl_keeps_its_record(instances) -> None:
    backend = await instances()
    ttl = 400
    [won] = await backend.claim([request(lease_ms=5_000, history_ttl_ms=ttl)])
    assert won.ticket is not None
    await asyncio.sleep(ttl / 1000 + 0.3)
    run = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    assert [r.run_id for r in await backend.history("job")] == [run.run_id]
    again = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)  # a retry
    assert again.run_id == run.run_id and again.status is RunStatus.SUCCEEDED


async def test_pruning_by_age_keeps_a_slot_whose_last_attempt_ended_recently(instances) -> None:
    backend = await instances()
    ttl = 1_000
    [first] = await backend.claim([request(lease_ms=LEASE_MS, history_ttl_ms=ttl)])
    assert first.ticket is not None
    await expire()
    taken = await backend.take_over(
        dataclasses.replace(takeover("job", first.ticket.slot_key), history_ttl_ms=ttl)
    )
    assert taken.ticket is not None
    await asyncio.sleep(ttl / 1000)  # attempt 1 ended more than the TTL ago, attempt 2 runs
    await backend.finish(taken.ticket, RunStatus.SUCCEEDED, None)
    [other] = await backend.claim([request(slot=SLOT + 1000, lease_ms=5_000, history_ttl_ms=ttl)])
    assert other.ticket is not None
    await backend.finish(other.ticket, RunStatus.SUCCEEDED, None)  # prunes by age
    runs = [(r.slot_ms, r.attempt) for r in await backend.history("job")]
    assert runs == [(SLOT + 1000, 1), (SLOT, 2), (SLOT, 1)], "a slot is pruned whole"
    await asyncio.sleep(ttl / 1000 + 0.2)
    [third] = await backend.claim([request(slot=SLOT + 2000, lease_ms=5_000, history_ttl_ms=ttl)])
    assert third.ticket is not None
    await backend.finish(third.ticket, RunStatus.SUCCEEDED, None)
    assert [(r.slot_ms, r.attempt) for r in await backend.history("job")] == [(SLOT + 2000, 1)]


async def test_running_slots_are_never_pruned(instances) -> None:
    backend = await instances()
    ttl = 400
    [held] = await backend.claim([request(lease_ms=60_000, history_ttl_ms=ttl)])
    assert held.ticket is not None
    await asyncio.sleep(ttl / 1000 + 0.2)
    [other] = await backend.claim([request(slot=SLOT + 1000, lease_ms=5_000, history_ttl_ms=ttl)])
    assert other.ticket is not None
    await backend.finish(other.ticket, RunStatus.SUCCEEDED, None)
    assert [r.slot_ms for r in await backend.history("job")] == [SLOT + 1000, SLOT]
    await backend.renew(held.ticket)


async def test_last_slot_is_remembered_after_pruning(instances) -> None:
    backend = await instances()
    ttl = 400
    [won] = await backend.claim([request(lease_ms=5_000, history_ttl_ms=ttl)])
    assert won.ticket is not None
    await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    await asyncio.sleep(ttl / 1000 + 0.3)
    [manual] = await backend.claim(
        [request(slot=None, trigger=Trigger.MANUAL, lease_ms=5_000, history_ttl_ms=ttl)]
    )
    assert manual.ticket is not None
    await backend.finish(manual.ticket, RunStatus.SUCCEEDED, None)
    assert [r.slot_ms for r in await backend.history("job")] == [None], "the slot was pruned"
    assert await backend.last_slot("job") == SLOT
    assert await backend.last_slots(["job", "nobody"]) == {"job": SLOT, "nobody": None}


async def test_a_refused_result_prunes_nothing(instances) -> None:
    backend = await instances()
    ttl = 400
    [old] = await backend.claim([request(lease_ms=5_000, history_ttl_ms=ttl)])
    [stale] = await backend.claim([request(slot=SLOT + 1000, lease_ms=LEASE_MS)])
    assert old.ticket is not None and stale.ticket is not None
    await backend.finish(old.ticket, RunStatus.SUCCEEDED, None)
    await asyncio.sleep(max(ttl, LEASE_MS) / 1000 + 0.3)
    taken = await backend.take_over(takeover("job", stale.ticket.slot_key))
    assert taken.status is TakeoverStatus.TAKEN
    late = dataclasses.replace(stale.ticket, history_ttl_ms=ttl)
    with pytest.raises(LeaseLost):
        await backend.finish(late, RunStatus.SUCCEEDED, None)
    assert SLOT in [r.slot_ms for r in await backend.history("job")], "a refused result pruned"


async def test_exhausted_is_announced_like_a_result(instances) -> None:
    runner, watcher = await instances(), await instances()
    heard: list[tuple[str, str, bool]] = []
    told = asyncio.Event()

    def on_change(job: str, key: str, released: bool) -> None:
        heard.append((job, key, released))
        told.set()

    await watcher.subscribe(on_change)
    [won] = await runner.claim([request(lease_ms=LEASE_MS)])
    assert won.ticket is not None
    await expire()
    out = await runner.take_over(takeover("job", won.ticket.slot_key, max_attempts=1))
    assert out.status is TakeoverStatus.EXHAUSTED
    await asyncio.wait_for(told.wait(), 3)
    assert heard == [("job", won.ticket.slot_key, False)]


async def test_the_overlap_reason_names_the_first_recorded_holder(instances) -> None:
    backend = await instances()
    [first] = await backend.claim([request(lease_ms=60_000)])
    [second] = await backend.claim([request(slot=SLOT + 1000, lease_ms=20_000)])
    assert first.status is second.status is ClaimStatus.WON
    [skip] = await backend.claim([request(slot=SLOT + 2000, lease_ms=5_000, overlap=Overlap.SKIP)])
    assert skip.status is ClaimStatus.SKIPPED and skip.run.reason is not None
    assert first.run.run_id in skip.run.reason, skip.run.reason


async def test_fences_start_at_the_backend_clock_and_rise(instances) -> None:
    backend = await instances()
    fences = []
    for n in range(3):
        [won] = await backend.claim([request(slot=SLOT + n * 1000, lease_ms=LEASE_MS)])
        assert won.ticket is not None and won.ticket.fence is not None
        assert won.ticket.backend_now_ms is not None
        assert won.ticket.fence >= won.ticket.backend_now_ms - 1_000
        fences.append(won.ticket.fence)
    assert fences == sorted(set(fences))


async def test_a_request_the_backend_cannot_store_fails_alone(instances) -> None:
    backend = await instances()
    good = [request(slot=SLOT + n * 1000, lease_ms=5_000) for n in range(3)]
    bad = request(slot=SLOT + 9000, lease_ms=10**19)
    outcomes = await backend.claim([good[0], bad, good[1], good[2]])
    assert [o.status for o in outcomes] == [
        ClaimStatus.WON,
        ClaimStatus.LOST,
        *[ClaimStatus.WON] * 2,
    ]
    assert outcomes[1].error is not None and "lease_ms=10000000000000000000" in str(
        outcomes[1].error
    )
    assert not isinstance(outcomes[1].error, LeaseLost) and outcomes[1].ticket is None
    assert SLOT + 9000 not in [r.slot_ms for r in await backend.history("job")]
    tickets = [o.ticket for o in outcomes if o.ticket is not None]
    # A TTL beyond what any backend stores means "keep everything"; the results are recorded.
    forever = [dataclasses.replace(t, history_ttl_ms=10**19) for t in tickets]
    renewed = await backend.renew_many(
        [forever[0], dataclasses.replace(forever[1], lease_ms=10**19), forever[2]]
    )
    assert not isinstance(renewed[0], BackendError) and not isinstance(renewed[2], BackendError)
    assert isinstance(renewed[1], BackendError) and not isinstance(renewed[1], LeaseLost)
    results = await backend.finish_many(
        [FinishRequest(t, RunStatus.SUCCEEDED, None) for t in forever]
    )
    assert [getattr(r, "status", r) for r in results] == [RunStatus.SUCCEEDED] * 3
