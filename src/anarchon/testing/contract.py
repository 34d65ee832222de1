"""The backend contract's conformance suite, shipped: run it on your own backend with one fixture.

Subclass :class:`LeaseBackendContract` (or :class:`BackendContract` for a broker that keeps no
leases) in a test module and give it a ``backend_factory`` fixture: a callable that returns a
new, *unstarted* backend on a fresh, empty store (one store per test)::

    import pytest
    from anarchon.testing.contract import LeaseBackendContract

    class TestMyBackend(LeaseBackendContract):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return lambda: MyBackend(tmp_path / "store")

The tests are async: they need pytest-asyncio (``asyncio_mode = "auto"``, or the classes' own
``asyncio`` mark, which they carry). They check every call of :mod:`anarchon.backend` as its
docstrings specify: one winner per slot, idempotent claims, rising fences, history order (one
job's, and many jobs' at once), pruning, takeovers, release, overlap, batches, pauses, run
requests and missed records (:mod:`anarchon.control`), the registry's records and definitions sets
(:mod:`anarchon.registry`, one of 100 000 jobs), and claim notices (``subscribe_claims``;
skipped for a backend that announces none). A few wait for short leases (0.6 s) to expire.
anarchon's own backends run the same classes (``tests/conformance/test_contract.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from ..backend import (
    BEHIND,
    HANDED_OVER,
    TOO_LATE,
    Backend,
    ClaimStatus,
    FinishRequest,
    LeaseBackend,
    SkipCause,
    TakeoverStatus,
)
from ..errors import BackendError, LeaseLost
from ..kit import Overlap, RunStatus, Trigger
from ._control import ControlContract
from ._notices import NoticesContract
from ._registry import RegistryContract
from ._requests import LEASE_MS, SLOT, lease, request, takeover

__all__ = ["LEASE_MS", "SLOT", "BackendContract", "LeaseBackendContract", "request", "takeover"]


@pytest.mark.asyncio
class BackendContract(ControlContract, RegistryContract, NoticesContract):
    """The calls every backend answers (:class:`~anarchon.backend.Backend`).

    Provide the fixture ``backend_factory``: a callable returning a new, unstarted backend on a
    fresh store. The fixture ``backend`` is that backend, started, and stopped after the test.
    """

    @pytest.fixture
    def backend_factory(self) -> Callable[[], Backend]:
        """Override: return a callable that makes a new, unstarted backend on a fresh store."""
        pytest.fail("subclass the contract and provide a backend_factory fixture")

    @pytest.fixture
    async def backend(self, backend_factory: Callable[[], Backend]) -> AsyncIterator[Backend]:
        """The backend under test, started; stopped after the test."""
        instance = backend_factory()
        await instance.start()
        try:
            yield instance
        finally:
            await instance.stop()

    async def test_one_winner_per_slot(self, backend: Backend) -> None:
        """One winner per slot."""
        first, second = request(**lease(backend)), request(instance="i2", **lease(backend))
        [won] = await backend.claim([first])
        [lost] = await backend.claim([second])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        assert won.ticket.token == first.token
        assert won.run.status is RunStatus.RUNNING and won.run.instance == "i1"
        assert lost.status is ClaimStatus.LOST and lost.ticket is None
        assert lost.run.run_id == first.run_id and lost.run.instance == "i1"

    async def test_claim_is_idempotent_per_token(self, backend: Backend) -> None:
        """Claim is idempotent per token."""
        req = request(**lease(backend))
        [first] = await backend.claim([req])
        [again] = await backend.claim([req])
        assert first.status is again.status is ClaimStatus.WON
        assert first.ticket and again.ticket and first.ticket.fence == again.ticket.fence

    async def test_concurrent_claims_have_one_winner(self, backend: Backend) -> None:
        """Concurrent claims have one winner."""
        reqs = [request(instance=f"i{n}", **lease(backend)) for n in range(8)]
        outcomes = await asyncio.gather(*(backend.claim([r]) for r in reqs))
        statuses = [o[0].status for o in outcomes]
        assert statuses.count(ClaimStatus.WON) == 1, statuses

    async def test_batch_claims_answer_in_order(self, backend: Backend) -> None:
        """Batch claims answer in order."""
        reqs = [request(job=f"job{n}", **lease(backend)) for n in range(5)]
        outcomes = await backend.claim(reqs)
        assert [o.run.job for o in outcomes] == [f"job{n}" for n in range(5)]
        assert all(o.status is ClaimStatus.WON for o in outcomes)

    async def test_fence_rises_per_job(self, backend: Backend) -> None:
        """Fence rises per job."""
        fences = []
        for n in range(3):
            [won] = await backend.claim([request(slot=SLOT + n * 1000, **lease(backend))])
            assert won.ticket is not None and won.ticket.fence is not None
            fences.append(won.ticket.fence)
        assert fences == sorted(fences) and len(set(fences)) == 3

    async def test_finish_records_result_and_history_is_newest_first(
        self, backend: Backend
    ) -> None:
        """Finish records result and history is newest first."""
        for n in range(3):
            [won] = await backend.claim([request(slot=SLOT + n * 1000, **lease(backend))])
            assert won.ticket is not None
            status = RunStatus.FAILED if n == 1 else RunStatus.SUCCEEDED
            run = await backend.finish(won.ticket, status, "boom" if n == 1 else None)
            assert run.status is status and run.finished_at is not None
        history = await backend.history("job", limit=10)
        assert [r.slot_ms for r in history] == [SLOT + 2000, SLOT + 1000, SLOT]
        assert history[1].error == "boom" and history[1].status is RunStatus.FAILED
        assert await backend.last_run("job") == history[0]
        assert len(await backend.history("job", limit=2)) == 2
        assert await backend.history("nobody", limit=5) == []

    async def test_histories_answer_each_jobs_history(self, backend: Backend) -> None:
        """histories answers, for several jobs at once, what history answers for each: the
        same runs in the same order (newest first), ``limit`` per job, ``[]`` for a job with no
        records, one key per distinct name."""
        ended = {"a": [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.SUCCEEDED], "b": []}
        for job, statuses in ended.items():
            for n, status in enumerate(statuses):
                [won] = await backend.claim([request(job, SLOT + n * 1000, **lease(backend))])
                assert won.ticket is not None
                error = "boom" if status is RunStatus.FAILED else None
                await backend.finish(won.ticket, status, error)
        skip = request("a", SLOT + 5000, skip_reason="too late: test", **lease(backend))
        running = request("b", SLOT, **lease(backend))
        manual = request("b", None, trigger=Trigger.MANUAL, **lease(backend))
        await backend.claim([skip, running, manual])
        jobs = ["a", "nobody", "b", "a"]
        for limit in (100, 3, 1):
            found = await backend.histories(jobs, limit)
            assert sorted(found) == ["a", "b", "nobody"]
            for job in found:
                assert found[job] == await backend.history(job, limit), (job, limit)
        newest = await backend.histories(jobs)  # the default limit
        assert [(r.slot_ms, r.status) for r in newest["a"]] == [
            (SLOT + 5000, RunStatus.SKIPPED),
            (SLOT + 2000, RunStatus.SUCCEEDED),
            (SLOT + 1000, RunStatus.FAILED),
            (SLOT, RunStatus.SUCCEEDED),
        ]
        assert newest["a"][2].error == "boom" and newest["nobody"] == []
        assert {(r.slot_ms, r.trigger) for r in newest["b"]} == {
            (SLOT, Trigger.SCHEDULE),
            (None, Trigger.MANUAL),
        }
        assert all(r.status is RunStatus.RUNNING for r in newest["b"])
        two = await backend.histories(jobs, 2)
        assert {job: len(runs) for job, runs in two.items()} == {"a": 2, "b": 2, "nobody": 0}
        assert await backend.histories(jobs, 0) == {"a": [], "nobody": [], "b": []}
        assert await backend.histories([]) == {}

    async def test_runs_recorded_in_one_millisecond_keep_their_order(
        self, backend: Backend
    ) -> None:
        """Runs recorded in one millisecond keep their order."""
        # One batch of claims is decided at one instant of the backend's clock on most backends.
        slots = [SLOT + n * 1000 for n in range(4)]
        outcomes = await backend.claim([request(slot=s, **lease(backend)) for s in slots])
        assert all(o.status is ClaimStatus.WON for o in outcomes)
        history = await backend.history("job", limit=10)
        assert [r.slot_ms for r in history] == slots[::-1]
        assert await backend.last_run("job") == history[0]

    async def test_manual_runs_have_slot_keys_of_their_own(self, backend: Backend) -> None:
        """Manual runs have slot keys of their own."""
        a = request(slot=None, trigger=Trigger.MANUAL, **lease(backend))
        b = request(slot=None, trigger=Trigger.MANUAL, **lease(backend))
        outcomes = await backend.claim([a, b])
        assert [o.status for o in outcomes] == [ClaimStatus.WON, ClaimStatus.WON]
        assert outcomes[0].run.slot is None and outcomes[0].run.trigger is Trigger.MANUAL

    async def test_skip_reason_records_a_skip_unless_claimed(self, backend: Backend) -> None:
        """Skip reason records a skip unless claimed."""
        [won] = await backend.claim([request(**lease(backend))])
        [late] = await backend.claim([request(skip_reason="too late: test", **lease(backend))])
        assert won.status is ClaimStatus.WON and late.status is ClaimStatus.LOST
        other = SLOT + 60_000
        [skip] = await backend.claim(
            [request(slot=other, skip_reason="too late: t", **lease(backend))]
        )
        assert skip.status is ClaimStatus.SKIPPED and skip.run.reason == "too late: t"
        [after] = await backend.claim([request(slot=other, **lease(backend))])
        assert after.status is ClaimStatus.SKIPPED
        runs = {r.slot_ms: r for r in await backend.history("job")}
        assert runs[other].status is RunStatus.SKIPPED

    async def test_a_skip_carries_its_cause_whatever_its_words(self, backend: Backend) -> None:
        """A skip record carries the request's ``skip_cause``, however its reason is worded (the
        core reads the cause, never the words): in the answer of the claim that records it, in
        another instance's answer and in history. A run has none."""
        kw = lease(backend)
        reworded = [
            request(skip_reason="worded 0", skip_cause=SkipCause.TOO_LATE, **kw),
            request(slot=SLOT + 1000, skip_reason="worded 1", skip_cause=SkipCause.BEHIND, **kw),
        ]
        answers = await backend.claim(reworded)
        assert [(a.status, a.run.skip_cause) for a in answers] == [
            (ClaimStatus.SKIPPED, SkipCause.TOO_LATE),
            (ClaimStatus.SKIPPED, SkipCause.BEHIND),
        ]
        assert [a.run.reason for a in answers] == ["worded 0", "worded 1"]
        # anarchon's own words (a record stored without a cause is read back by these).
        words = f"{TOO_LATE}i1 reached the slot 70000 ms after it (max_late_ms=60000)"
        slot = SLOT + 2000
        [first] = await backend.claim(
            [request(slot=slot, skip_reason=words, skip_cause=SkipCause.TOO_LATE, **kw)]
        )
        [other] = await backend.claim([request(slot=slot, instance="i2", **kw)])
        assert first.status is other.status is ClaimStatus.SKIPPED
        assert first.run.skip_cause is other.run.skip_cause is SkipCause.TOO_LATE
        [stored] = [r for r in await backend.history("job") if r.slot_ms == slot]
        assert (stored.reason, stored.skip_cause) == (words, SkipCause.TOO_LATE)
        [won] = await backend.claim([request(slot=SLOT + 3000, **kw)])
        assert won.status is ClaimStatus.WON and won.run.skip_cause is None

    async def test_a_skip_record_keeps_its_cause(self, backend: Backend) -> None:
        """A skip record keeps the cause it was stored with, whatever its reason's words say (a
        store that read it back from the words would answer None, or the words' cause): in
        another instance's claim of the slot, in history and in ``slot_records``."""
        kw = lease(backend)
        stored = {
            SLOT: ("worded 0", SkipCause.TOO_LATE),
            SLOT + 1000: ("worded 1", SkipCause.BEHIND),
            SLOT + 2000: (f"{BEHIND}words of another cause", SkipCause.TOO_LATE),
        }
        await backend.claim(
            [
                request(slot=slot, skip_reason=words, skip_cause=cause, **kw)
                for slot, (words, cause) in stored.items()
            ]
        )
        others = await backend.claim([request(slot=slot, instance="i2", **kw) for slot in stored])
        assert [(o.status, o.run.reason, o.run.skip_cause) for o in others] == [
            (ClaimStatus.SKIPPED, words, cause) for words, cause in stored.values()
        ]
        history = {r.slot_ms: (r.reason, r.skip_cause) for r in await backend.history("job")}
        assert history == stored
        for slot, (words, cause) in stored.items():
            found = await backend.slot_records("job", slot)
            if found is not None:  # optional: explain reads the newest records instead
                assert [(r.reason, r.skip_cause) for r in found.runs] == [(words, cause)]

    async def test_slot_records_answer_one_slot_oldest_first(self, backend: Backend) -> None:
        """slot_records, where a backend has it: the slot's attempts and its retries' (never
        another slot's or a manual run's), oldest first, and the job's earliest slot or start."""
        [won] = await backend.claim([request(**lease(backend))])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.FAILED, "boom")
        retry = request(trigger=Trigger.RETRY, key=f"{SLOT}-retry-1", **lease(backend))
        others = [request(slot=SLOT + 1000, **lease(backend))]
        others.append(request(slot=None, trigger=Trigger.MANUAL, **lease(backend)))
        assert [o.status for o in await backend.claim([retry, *others])] == [ClaimStatus.WON] * 3
        found = await backend.slot_records("job", SLOT)
        if found is None:
            return  # optional: explain reads the newest records instead
        history = await backend.history("job", limit=10)
        assert found.runs == [r for r in reversed(history) if r.slot_ms == SLOT]
        assert [(r.trigger, r.status) for r in found.runs] == [
            (Trigger.SCHEDULE, RunStatus.FAILED),
            (Trigger.RETRY, RunStatus.RUNNING),
        ]
        starts = [round(r.started_at.timestamp() * 1000) for r in history]
        assert found.oldest_ms == min([SLOT, SLOT + 1000, *starts])
        empty = await backend.slot_records("job", SLOT + 5000)
        assert empty is not None and empty.runs == []
        assert await backend.slot_records("nobody", SLOT) == ([], None)

    async def test_server_time_is_close_to_ours(self, backend: Backend) -> None:
        """Server time is close to ours."""
        server = await backend.server_time_ms()
        if server is not None:
            assert abs(server - time.time() * 1000) < 5_000

    async def test_finish_many_decides_each_result(self, backend: Backend) -> None:
        """Finish many decides each result."""
        won = []
        for n in range(3):
            [outcome] = await backend.claim([request(slot=SLOT + n * 1000, **lease(backend))])
            assert outcome.ticket is not None
            won.append(outcome.ticket)
        results = await backend.finish_many(
            [
                FinishRequest(won[0], RunStatus.SUCCEEDED, None),
                FinishRequest(won[1], RunStatus.FAILED, "boom"),
                FinishRequest(won[0], RunStatus.FAILED, "a second, different result"),
                FinishRequest(won[2], RunStatus.SUCCEEDED, None),
            ]
        )
        statuses = [getattr(r, "status", None) for r in results]
        assert [statuses[0], statuses[1], statuses[3]] == [
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.SUCCEEDED,
        ]
        if backend.is_lease_backend:
            assert isinstance(results[2], LeaseLost), "a second result for one attempt was accepted"
        history = {r.slot_ms: r for r in await backend.history("job")}
        assert history[SLOT + 1000].error == "boom"
        assert history[SLOT].status is RunStatus.SUCCEEDED
        # The same result again (a retry whose answer was lost) is not an error.
        [again] = await backend.finish_many([FinishRequest(won[0], RunStatus.SUCCEEDED, None)])
        assert not isinstance(again, BackendError) and again.run_id == won[0].run_id


class LeaseBackendContract(BackendContract):
    """The calls of a lease backend (:class:`~anarchon.backend.LeaseBackend`) besides those of
    :class:`BackendContract`. A backend that is not a LeaseBackend skips them."""

    @pytest.fixture
    def lease_backend(self, backend: Backend) -> LeaseBackend:
        """The backend under test, when it keeps leases; the test is skipped otherwise."""
        if not isinstance(backend, LeaseBackend):
            pytest.skip(f"{backend.name} is a broker: no leases, backups, overlap, hand-over")
        return backend

    async def test_renew_extends_on_the_backend_clock(self, lease_backend: LeaseBackend) -> None:
        """Renew extends on the backend clock."""
        [won] = await lease_backend.claim([request(lease_ms=LEASE_MS)])
        assert won.ticket is not None and won.ticket.lease_expires_at_ms is not None
        await asyncio.sleep(0.2)
        renewed = await lease_backend.renew(won.ticket)
        assert renewed.lease_expires_at_ms is not None and renewed.backend_now_ms is not None
        assert renewed.lease_expires_at_ms > won.ticket.lease_expires_at_ms
        assert renewed.lease_expires_at_ms - renewed.backend_now_ms == LEASE_MS

    async def test_takeover_waits_for_expiry_then_raises_attempt_and_fence(
        self,
        lease_backend: LeaseBackend,
    ) -> None:
        """Takeover waits for expiry then raises attempt and fence."""
        [won] = await lease_backend.claim([request(lease_ms=LEASE_MS)])
        assert won.ticket is not None
        key = won.ticket.slot_key
        held = await lease_backend.take_over(takeover("job", key))
        assert held.status is TakeoverStatus.HELD and held.lease_expires_at_ms is not None
        await asyncio.sleep(LEASE_MS / 1000 + 0.3)
        taken = await lease_backend.take_over(takeover("job", key))
        assert taken.status is TakeoverStatus.TAKEN and taken.ticket is not None
        assert taken.ticket.attempt == 2
        assert taken.ticket.fence is not None and won.ticket.fence is not None
        assert taken.ticket.fence > won.ticket.fence
        # Only one backup wins the compare-and-set.
        again = await lease_backend.take_over(takeover("job", key))
        assert again.status is TakeoverStatus.HELD
        # The stale runner is fenced off: no renew, no result.
        with pytest.raises(LeaseLost):
            await lease_backend.renew(won.ticket)
        with pytest.raises(LeaseLost):
            await lease_backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
        await lease_backend.finish(taken.ticket, RunStatus.SUCCEEDED, None)
        history = await lease_backend.history("job")
        assert [(r.attempt, r.status) for r in history] == [
            (2, RunStatus.SUCCEEDED),
            (1, RunStatus.FAILED),
        ]
        assert history[1].reason == "lease lost" and history[1].fence == won.ticket.fence
        assert history[0].fence == taken.ticket.fence
        ended = await lease_backend.take_over(takeover("job", key))
        assert ended.status is TakeoverStatus.ENDED

    async def test_concurrent_takeovers_have_one_winner(self, lease_backend: LeaseBackend) -> None:
        """Concurrent takeovers have one winner."""
        [won] = await lease_backend.claim([request(lease_ms=LEASE_MS)])
        assert won.ticket is not None
        await asyncio.sleep(LEASE_MS / 1000 + 0.3)
        # The winner's lease is long: a short one could expire while the race is still being
        # served on a loaded machine, and a second takeover after it would rightly win too.
        outcomes = await asyncio.gather(
            *(
                lease_backend.take_over(takeover("job", won.ticket.slot_key, lease_ms=60_000))
                for _ in range(6)
            )
        )
        # One winner; the losers are told HELD (the winner's lease), never ENDED, so they keep
        # watching (tests/conformance/test_rules.py races separate instances too).
        statuses = [o.status for o in outcomes]
        assert statuses.count(TakeoverStatus.TAKEN) == 1, statuses
        assert statuses.count(TakeoverStatus.HELD) == 5, statuses

    async def test_open_runs_are_the_running_attempts_since_a_time(
        self, lease_backend: LeaseBackend
    ) -> None:
        """Open runs are the attempts still running (released too) since a time, with keys."""
        made = [
            request(job="a", lease_ms=60_000),
            request(job="a", slot=SLOT + 1_000, lease_ms=60_000),
            request(job="b", slot=None, trigger=Trigger.MANUAL, lease_ms=60_000),
            request(job="b", lease_ms=60_000),
            request(job="c", lease_ms=60_000),
        ]
        tickets = []
        for req in made:
            [won] = await lease_backend.claim([req])
            assert won.ticket is not None
            tickets.append(won.ticket)
        done, live, manual, released, _other = tickets
        await lease_backend.finish(done, RunStatus.SUCCEEDED, None)
        await lease_backend.release(released, "handed over")
        runs = await lease_backend.open_runs(["a", "b", "missing"], 0)
        assert sorted((r.job, r.slot_key, r.run_id) for r in runs) == sorted(
            (t.job, t.slot_key, t.run_id) for t in (live, manual, released)
        )
        assert {r.status for r in runs} == {RunStatus.RUNNING}
        an_hour_on = int(time.time() * 1000) + 3_600_000
        assert await lease_backend.open_runs(["a", "b"], an_hour_on) == []

    async def test_release_hands_over_at_once(self, lease_backend: LeaseBackend) -> None:
        """Release hands over at once."""
        [won] = await lease_backend.claim([request(lease_ms=60_000)])
        assert won.ticket is not None
        await lease_backend.release(won.ticket, "handed over")
        taken = await lease_backend.take_over(takeover("job", won.ticket.slot_key, lease_ms=60_000))
        assert taken.status is TakeoverStatus.TAKEN
        history = await lease_backend.history("job")
        assert history[1].reason == "handed over"
        with pytest.raises(LeaseLost):
            await lease_backend.release(won.ticket, "handed over")

    async def test_attempts_are_bounded(self, lease_backend: LeaseBackend) -> None:
        """Attempts are bounded."""
        [won] = await lease_backend.claim([request(lease_ms=LEASE_MS)])
        assert won.ticket is not None
        await asyncio.sleep(LEASE_MS / 1000 + 0.3)
        out = await lease_backend.take_over(takeover("job", won.ticket.slot_key, max_attempts=1))
        assert out.status is TakeoverStatus.EXHAUSTED
        [last] = await lease_backend.history("job")
        assert last.status is RunStatus.FAILED and last.error is not None
        assert "max_attempts=1" in last.error

    async def test_renewed_lease_is_not_taken_over(self, lease_backend: LeaseBackend) -> None:
        """Renewed lease is not taken over."""
        [won] = await lease_backend.claim([request(lease_ms=LEASE_MS)])
        ticket = won.ticket
        assert ticket is not None
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ticket = await lease_backend.renew(ticket)
            out = await lease_backend.take_over(takeover("job", ticket.slot_key))
            assert out.status is TakeoverStatus.HELD
            await asyncio.sleep(LEASE_MS / 3000)

    async def test_overlap_skip_is_recorded_once(self, lease_backend: LeaseBackend) -> None:
        """Overlap skip is recorded once."""
        [first] = await lease_backend.claim([request(lease_ms=5_000)])
        nxt = SLOT + 1000
        a = request(slot=nxt, lease_ms=5_000, overlap=Overlap.SKIP)
        b = request(slot=nxt, lease_ms=5_000, overlap=Overlap.SKIP, instance="i2")
        [skip_a], [skip_b] = await asyncio.gather(
            lease_backend.claim([a]), lease_backend.claim([b])
        )
        assert skip_a.status is skip_b.status is ClaimStatus.SKIPPED
        assert skip_a.run.run_id == skip_b.run.run_id
        assert skip_a.run.reason and "overlap" in skip_a.run.reason
        assert skip_a.run.skip_cause is skip_b.run.skip_cause is SkipCause.OVERLAP
        assert first.run.run_id in skip_a.run.reason
        allowed = request(slot=SLOT + 2000, lease_ms=5_000)
        [won] = await lease_backend.claim([allowed])
        assert won.status is ClaimStatus.WON, "overlap='allow' runs concurrently"
        history = await lease_backend.history("job")
        assert sum(1 for r in history if r.slot_ms == nxt) == 1

    async def test_last_slot(self, lease_backend: LeaseBackend) -> None:
        """Last slot."""
        assert await lease_backend.last_slot("job") is None
        await lease_backend.claim([request(slot=SLOT + 5000, lease_ms=LEASE_MS)])
        await lease_backend.claim([request(slot=SLOT, lease_ms=LEASE_MS)])
        await lease_backend.claim([request(slot=None, trigger=Trigger.MANUAL, lease_ms=LEASE_MS)])
        assert await lease_backend.last_slot("job") == SLOT + 5000

    async def test_history_is_pruned_by_age_and_pruned_slots_stay_claimed(
        self,
        lease_backend: LeaseBackend,
    ) -> None:
        """History is pruned by age and pruned slots stay claimed."""
        ttl = 400
        for n in range(3):
            [won] = await lease_backend.claim(
                [request(slot=SLOT + n * 1000, lease_ms=LEASE_MS, history_ttl_ms=ttl)]
            )
            assert won.ticket is not None
            await lease_backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
        await asyncio.sleep(ttl / 1000 + 0.3)
        [fresh] = await lease_backend.claim(
            [request(slot=SLOT + 10_000, lease_ms=LEASE_MS, history_ttl_ms=ttl)]
        )
        assert fresh.ticket is not None
        await lease_backend.finish(fresh.ticket, RunStatus.SUCCEEDED, None)
        assert [r.slot_ms for r in await lease_backend.history("job")] == [SLOT + 10_000]
        # A very late instance claiming a slot whose record was pruned must not run it again:
        # refused, nothing recorded, with the skip cause PRUNED (the core reads no words).
        [late] = await lease_backend.claim([request(slot=SLOT + 1000, lease_ms=LEASE_MS)])
        assert (late.status, late.run.skip_cause, late.error) == (
            ClaimStatus.LOST,
            SkipCause.PRUNED,
            None,
        )

    async def test_last_slots_answers_for_many_jobs(self, lease_backend: LeaseBackend) -> None:
        """Last slots answers for many jobs."""
        jobs = [f"job{n}" for n in range(1200)]
        await lease_backend.claim(
            [request(job=j, slot=SLOT + n, lease_ms=LEASE_MS) for n, j in enumerate(jobs[:700])]
        )
        found = await lease_backend.last_slots(jobs)
        assert found == {j: (SLOT + n if n < 700 else None) for n, j in enumerate(jobs)}

    async def test_renew_many_refuses_only_stale_tickets(self, lease_backend: LeaseBackend) -> None:
        """Renew many refuses only stale tickets."""
        [a] = await lease_backend.claim([request(slot=SLOT, lease_ms=LEASE_MS)])
        [b] = await lease_backend.claim([request(slot=SLOT + 1000, lease_ms=LEASE_MS)])
        assert a.ticket is not None and b.ticket is not None
        await lease_backend.release(b.ticket, "handed over")
        renewed = await lease_backend.renew_many([a.ticket, b.ticket])
        assert not isinstance(renewed[0], BackendError) and isinstance(renewed[1], LeaseLost)
        assert f"was {HANDED_OVER}" in str(renewed[1]), "not the lease rules' words (handed_over)"
        assert renewed[0].lease_expires_at_ms is not None
