"""The contract of :meth:`~anarchon.backend.Backend.control` and of the claim's pause check:
pauses, run requests, missed records, retry keys and ``requested_by``. Part of
:class:`~anarchon.testing.contract.BackendContract`."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import pytest

from ..backend import Backend, ClaimRequest, ClaimStatus, FinishRequest, SkipCause, Ticket
from ..control import (
    ALL_JOBS,
    PAUSED,
    ControlStore,
    Pause,
    RunRequest,
    cancelled_reason,
    retry_key,
)
from ..errors import LeaseLost
from ..kit import Run, RunStatus, Trigger
from ..steering import backend_now_ms, cancel_requests
from ._requests import SLOT, lease, request

__all__ = ["ControlContract"]


def _claim(backend: Backend, job: str = "job", slot: int | None = SLOT, **kw: Any) -> ClaimRequest:
    return request(job, slot, **lease(backend, **kw))


def _store(backend: Backend, required: bool) -> ControlStore:
    store = backend.control()
    if store is None:
        if required:
            pytest.fail(f"{backend.name} keeps no pauses or run requests (control() is None)")
        pytest.skip(f"{backend.name} keeps no pauses or run requests (control() is None)")
    return store


def _run_request(job: str, due_ms: int, **kw: Any) -> RunRequest:
    request_id = uuid.uuid4().hex
    return RunRequest(
        id=request_id,
        job=job,
        trigger=kw.pop("trigger", Trigger.MANUAL),
        key=kw.pop("key", f"manual-{request_id}"),
        slot=kw.pop("slot", None),
        due_ms=due_ms,
        requested_by=kw.pop("requested_by", "alice@ops"),
        requested_at_ms=due_ms,
        **kw,
    )


class ControlContract:
    """Pauses and run requests (:mod:`anarchon.control`), on every backend.

    A backend whose :meth:`~anarchon.backend.Backend.control` is None skips the tests of the
    store (its jobs cannot be paused or triggered from outside) unless :attr:`control_required`
    is set, as it is for anarchon's own backends; missed records, retry keys and
    ``requested_by`` are claim semantics every backend keeps.
    """

    #: Fail, rather than skip, when the backend has no control store.
    control_required = False

    async def test_pauses_are_stored_replaced_and_resumed(self, backend: Backend) -> None:
        """Pauses are stored, replaced and resumed."""
        store = _store(backend, self.control_required)
        assert await store.pauses() == []
        now = await backend_now_ms(backend)
        first = Pause(job="job", by="alice@ops", at_ms=now)
        await store.pause(first)
        assert await store.pauses() == [first]
        second = Pause(job="job", by="bob@ops", at_ms=now + 1, until_ms=now + 3_600_000)
        await store.pause(second)
        await store.pause(Pause(job=ALL_JOBS, by="carol@ops", at_ms=now))
        assert sorted(await store.pauses(), key=lambda p: p.job) == [
            Pause(job=ALL_JOBS, by="carol@ops", at_ms=now),
            second,
        ]
        assert await store.resume("job") == second
        assert await store.resume("job") is None
        assert [p.job for p in await store.pauses()] == [ALL_JOBS]

    async def test_a_paused_job_skips_its_slots_once_but_runs_manual_ones(
        self, backend: Backend
    ) -> None:
        """A paused job skips its slots once but runs manual ones."""
        store = _store(backend, self.control_required)
        await store.pause(Pause(job="job", by="alice@ops", at_ms=await backend_now_ms(backend)))
        [paused] = await backend.claim([_claim(backend)])
        assert paused.status is ClaimStatus.SKIPPED
        assert paused.run.status is RunStatus.SKIPPED
        assert paused.run.reason == f"{PAUSED}alice@ops"
        assert paused.run.skip_cause is SkipCause.PAUSED
        [again] = await backend.claim([_claim(backend, instance="i2")])
        assert again.status is ClaimStatus.SKIPPED
        [manual] = await backend.claim([_claim(backend, slot=None, trigger=Trigger.MANUAL)])
        assert manual.status is ClaimStatus.WON
        [other] = await backend.claim([_claim(backend, job="other")])
        assert other.status is ClaimStatus.WON
        slots = [r for r in await backend.history("job") if r.slot_ms == SLOT]
        assert [(r.status, r.reason) for r in slots] == [(RunStatus.SKIPPED, f"{PAUSED}alice@ops")]
        assert [r.skip_cause for r in slots] == [SkipCause.PAUSED]
        await store.resume("job")
        [after] = await backend.claim([_claim(backend, slot=SLOT + 1000)])
        assert after.status is ClaimStatus.WON

    async def test_a_cluster_pause_holds_every_job_and_a_pause_ends_by_itself(
        self, backend: Backend
    ) -> None:
        """A cluster pause holds every job and a pause ends by itself."""
        store = _store(backend, self.control_required)
        now = await backend_now_ms(backend)
        await store.pause(Pause(job=ALL_JOBS, by="ops", at_ms=now))
        await store.pause(Pause(job="ended", by="ops", at_ms=now - 2000, until_ms=now - 1000))
        [held] = await backend.claim([_claim(backend, job="any")])
        assert held.status is ClaimStatus.SKIPPED
        assert held.run.reason is not None and held.run.reason.startswith(f"{PAUSED}ops")
        assert "(all jobs)" in held.run.reason
        await store.resume(ALL_JOBS)
        [ended] = await backend.claim([_claim(backend, job="ended")])
        assert ended.status is ClaimStatus.WON
        until = now + 3_600_000
        await store.pause(Pause(job="later", by="ops", at_ms=now, until_ms=until))
        [later] = await backend.claim([_claim(backend, job="later", trigger=Trigger.CATCH_UP)])
        assert later.status is ClaimStatus.SKIPPED
        assert later.run.reason is not None and " until " in later.run.reason

    async def test_a_slot_nobody_ran_is_recorded_missed(self, backend: Backend) -> None:
        """A slot nobody ran is recorded missed."""
        reason = "missed: no instance carried the job from a to b"
        [missed] = await backend.claim(
            [_claim(backend, skip_reason=reason, skip_status=RunStatus.MISSED)]
        )
        assert missed.status is ClaimStatus.SKIPPED
        assert missed.run.status is RunStatus.MISSED and missed.run.reason == reason
        [again] = await backend.claim([_claim(backend, instance="i2")])
        assert again.status is ClaimStatus.SKIPPED and again.run.status is RunStatus.MISSED
        [stored] = await backend.history("job")
        assert stored.status is RunStatus.MISSED and stored.reason == reason

    async def test_a_retry_is_a_run_of_its_own_key_and_keeps_who_asked(
        self, backend: Backend
    ) -> None:
        """A retry is a run of its own key and keeps who asked."""
        [first] = await backend.claim([_claim(backend)])
        assert first.ticket is not None
        await backend.finish(first.ticket, RunStatus.FAILED, "boom")
        key = retry_key(str(SLOT), 1)
        retry = _claim(backend, key=key, trigger=Trigger.RETRY, requested_by="retry of x")
        [won] = await backend.claim([retry])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        assert won.ticket.slot_key == key and won.run.slot_ms == SLOT
        [lost] = await backend.claim([_claim(backend, key=key, trigger=Trigger.RETRY)])
        assert lost.status is ClaimStatus.LOST
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
        runs = [r for r in await backend.history("job") if r.slot_ms == SLOT]
        assert [(r.trigger, r.status) for r in runs] == [
            (Trigger.RETRY, RunStatus.SUCCEEDED),
            (Trigger.SCHEDULE, RunStatus.FAILED),
        ]
        assert runs[0].requested_by == "retry of x" and runs[1].requested_by is None
        request_id = uuid.uuid4().hex
        manual = _claim(
            backend,
            slot=None,
            key=f"manual-{request_id}",
            trigger=Trigger.MANUAL,
            requested_by="alice@ops",
        )
        [triggered] = await backend.claim([manual])
        assert triggered.status is ClaimStatus.WON
        assert triggered.run.requested_by == "alice@ops"
        [twice] = await backend.claim([replace(manual, token=uuid.uuid4().hex)])
        assert twice.status is ClaimStatus.LOST

    async def test_run_requests_are_stored_once_listed_due_first_and_removed(
        self, backend: Backend
    ) -> None:
        """Run requests are stored once, listed due first and removed."""
        store = _store(backend, self.control_required)
        assert await store.requests() == []
        now = await backend_now_ms(backend)
        later = _run_request("job", now + 5000)
        sooner = _run_request("job", now, trigger=Trigger.RETRY, slot=SLOT, retry=2)
        other = _run_request("other", now)
        assert await store.request(later) is True
        assert await store.request(later) is False
        assert await store.request(sooner) is True
        assert await store.request(other) is True
        assert await store.requests(["job"]) == [sooner, later]
        assert {r.id for r in await store.requests()} == {later.id, sooner.id, other.id}
        assert await store.requests(["nobody"]) == []
        await store.done(sooner.id)
        await store.done(sooner.id)
        assert await store.requests(["job", "other"]) == [other, later]

    async def test_a_failed_result_and_its_retry_are_stored_together(
        self, backend: Backend
    ) -> None:
        """A failed result and its retry are stored together: the retry when the result is
        accepted, once however often the result is sent, and none with a refused result."""
        store = _store(backend, self.control_required)
        now = await backend_now_ms(backend)
        outcomes = await backend.claim([_claim(backend, slot=SLOT + n * 1000) for n in range(3)])
        tickets = [o.ticket for o in outcomes]
        assert all(t is not None for t in tickets), outcomes
        first, second, third = (t for t in tickets if t is not None)

        def retry_of(ticket: Ticket) -> RunRequest:
            return _run_request(
                "job",
                now + 60_000,
                trigger=Trigger.RETRY,
                key=retry_key(ticket.slot_key, 1),
                slot=ticket.slot,
                requested_by=f"retry 1 of 1 after run {ticket.run_id}",
                retry=1,
            )

        retries = [retry_of(first), retry_of(second), retry_of(third)]
        run = await backend.finish(first, RunStatus.FAILED, "boom", retries[0])
        assert run.status is RunStatus.FAILED and run.error == "boom"
        assert await store.requests(["job"]) == [retries[0]], "the retry was not stored"
        # The same result again (its answer was lost): the retry is stored once.
        again = await backend.finish(first, RunStatus.FAILED, "boom", retries[0])
        assert again.run_id == first.run_id and again.status is RunStatus.FAILED
        assert await store.requests(["job"]) == [retries[0]]
        # A batch: each result with its own retry; a refused result (lease backends: a token
        # that does not hold the attempt) stores neither.
        forged = replace(third, token=uuid.uuid4().hex)
        answers = await backend.finish_many(
            [
                FinishRequest(second, RunStatus.FAILED, "boom 2", retries[1]),
                *(
                    [FinishRequest(forged, RunStatus.FAILED, "forged", retries[2])]
                    if backend.is_lease_backend
                    else []
                ),
            ]
        )
        assert isinstance(answers[0], Run) and answers[0].status is RunStatus.FAILED, answers
        if backend.is_lease_backend:
            assert isinstance(answers[1], LeaseLost), answers
        stored = {r.id: r for r in await store.requests(["job"])}
        assert stored == {r.id: r for r in retries[:2]}, "a retry and its result were split"
        runs = {r.slot_ms: r for r in await backend.history("job")}
        assert (runs[SLOT].status, runs[SLOT + 1000].status) == (RunStatus.FAILED,) * 2
        assert runs[SLOT + 2000].status is RunStatus.RUNNING

    async def _requests_of(self, backend: Backend, now: int) -> tuple[RunRequest, RunRequest]:
        """A trigger and a retry of ``job``, stored, due now."""
        store = _store(backend, self.control_required)
        manual = _run_request("job", now)
        retry = _run_request(
            "job", now, trigger=Trigger.RETRY, key=retry_key(str(SLOT), 1), slot=SLOT, retry=1
        )
        for stored in (manual, retry):
            assert await store.request(stored) is True
        return manual, retry

    @staticmethod
    def _claim_of(backend: Backend, request: RunRequest, instance: str) -> ClaimRequest:
        """An instance's claim of ``request``, as the request poller makes it."""
        claim = _claim(
            backend, slot=request.slot, key=request.key, trigger=request.trigger, instance=instance
        )
        return replace(claim, run_id=request.id, requested_by=request.requested_by)

    async def test_a_cancelled_request_never_runs(self, backend: Backend) -> None:
        """A cancelled trigger or retry leaves a skip record under its key (cause CANCELLED,
        reason ``cancelled by <who>``) and is removed: an instance's claim of it afterwards is
        answered skipped, and nobody runs it."""
        store = _store(backend, self.control_required)
        manual, retry = await self._requests_of(backend, await backend_now_ms(backend))
        done = await cancel_requests(backend, [manual, retry], by="bob@ops")
        assert [(c.request, c.cancelled) for c in done] == [(manual, True), (retry, True)]
        for cancelled in done:
            assert cancelled.run.status is RunStatus.SKIPPED, cancelled
            assert cancelled.run.skip_cause is SkipCause.CANCELLED, cancelled
            assert cancelled.run.reason == cancelled_reason("bob@ops")
        assert await store.requests() == []
        for late in (manual, retry):
            [answer] = await backend.claim([self._claim_of(backend, late, "i2")])
            assert answer.status is ClaimStatus.SKIPPED, (late, answer)
            assert answer.ticket is None and answer.run.skip_cause is SkipCause.CANCELLED
        runs = await backend.history("job")
        assert {(r.status, r.skip_cause, r.reason, r.trigger) for r in runs} == {
            (RunStatus.SKIPPED, SkipCause.CANCELLED, "cancelled by bob@ops", Trigger.MANUAL),
            (RunStatus.SKIPPED, SkipCause.CANCELLED, "cancelled by bob@ops", Trigger.RETRY),
        }
        # Cancelling again (a request read before the first cancellation removed it) is
        # answered by the first one's record.
        [again] = await cancel_requests(backend, [manual], by="carol@ops")
        assert again.cancelled and again.run.reason == cancelled_reason("bob@ops")

    async def test_a_request_claimed_before_its_cancellation_runs(self, backend: Backend) -> None:
        """A cancellation that comes after an instance's claim of the request was decided is
        too late: it answers that run (``cancelled`` False), removes the request, and the run
        keeps its ticket and finishes."""
        store = _store(backend, self.control_required)
        manual, _ = await self._requests_of(backend, await backend_now_ms(backend))
        [won] = await backend.claim([self._claim_of(backend, manual, "i2")])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        [late] = await cancel_requests(backend, [manual], by="bob@ops")
        assert not late.cancelled
        assert (late.run.run_id, late.run.instance) == (manual.id, "i2")
        assert late.run.status is RunStatus.RUNNING
        assert [r.id for r in await store.requests()] != [manual.id]
        finished = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
        assert finished.status is RunStatus.SUCCEEDED

    async def test_a_cancellation_racing_claims_leaves_exactly_one_decision(
        self, backend: Backend
    ) -> None:
        """Cancellations sent at the same moment as instances' claims of the same requests:
        for each request either the instance won and the cancellation says it came too late,
        or the cancellation was recorded and the instance was answered skipped; never both,
        never neither."""
        store = _store(backend, self.control_required)
        now = await backend_now_ms(backend)
        requests = [_run_request("job", now) for _ in range(8)]
        for stored in requests:
            assert await store.request(stored) is True
        claims = [self._claim_of(backend, r, "i2") for r in requests]
        answers, done = await asyncio.gather(
            backend.claim(claims), cancel_requests(backend, requests, by="bob@ops")
        )
        by_id = {c.request.id: c for c in done}
        assert set(by_id) == {r.id for r in requests}
        for claim, answer in zip(claims, answers, strict=True):
            cancellation = by_id[claim.run_id]
            if answer.status is ClaimStatus.WON:
                assert not cancellation.cancelled, (answer, cancellation)
                assert cancellation.run.run_id == claim.run_id
            else:
                assert answer.status is ClaimStatus.SKIPPED, answer
                assert answer.run.skip_cause is SkipCause.CANCELLED, answer
                assert cancellation.cancelled, cancellation
        assert await store.requests() == []
