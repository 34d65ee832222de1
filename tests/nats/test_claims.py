"""The claim protocol on real servers (2.9.10 and current): message ids, the duplicate path,
results, history and the server's clock."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from anarchon import Run, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.nats import NatsBackend
from tests.nats.servers import connect, read_subject

SLOT = 1_800_000_000_000
Make = Callable[..., Any]


def same_run(answered: Run, stored: Run) -> bool:
    """True if ``answered`` (what finish() returned from its ack) is the ``stored`` run but for
    its times, which are the runner's clock rather than the stream's (within 2 s here)."""
    close = all(
        a is not None and b is not None and abs((a - b).total_seconds()) < 2
        for a, b in (
            (answered.started_at, stored.started_at),
            (answered.finished_at, stored.finished_at),
        )
    )
    retimed = replace(answered, started_at=stored.started_at, finished_at=stored.finished_at)
    return close and retimed == stored


def request(job: str = "sync", slot: int | None = SLOT, token: str | None = None, **kw: Any):
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=kw.pop("run_id", uuid.uuid4().hex),
        token=token or uuid.uuid4().hex,
        instance=kw.pop("instance", "i1"),
        trigger=kw.pop("trigger", Trigger.SCHEDULE if slot is not None else Trigger.MANUAL),
        **kw,
    )


async def test_claim_header_is_job_and_slot(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    req = request()
    [won] = await backend.claim([req])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    [msg] = await read_subject(server_url, backend.stream, f"{backend.prefix}sync.claims")
    assert msg.headers == {"Nats-Msg-Id": f"sync:{SLOT}"}
    body = json.loads(msg.data)
    assert body["token"] == req.token and body["run_id"] == req.run_id
    assert body["instance"] == "i1" and body["trigger"] == "schedule" and body["slot"] == SLOT
    assert won.ticket.fence == msg.seq, "the fence is the claim's stream sequence"
    # Won on the ack alone: the ticket starts on the local clock, and so does the run finish()
    # returns (answered from its ack too); history starts it at the claim's stream timestamp.
    # RawStreamMsg.time is newer than nats-py 2.9 (make compat): there the stream's timestamp
    # of the claim is read from history alone.
    stored_ms = msg.time.timestamp() * 1000 if hasattr(msg, "time") else None
    if stored_ms is not None:
        assert abs(won.ticket.started_at_ms - stored_ms) < 2_000
    run = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    assert run.started_at.timestamp() * 1000 == won.ticket.started_at_ms
    [shown] = await backend.history("sync")
    if stored_ms is not None:
        assert abs(shown.started_at.timestamp() * 1000 - stored_ms) < 1
    else:
        assert abs(shown.started_at.timestamp() * 1000 - won.ticket.started_at_ms) < 2_000
    assert same_run(run, shown)


async def test_duplicate_with_our_token_wins_with_another_loses(
    make: Make, server_url: str
) -> None:
    backend: NatsBackend = await make()
    mine = request()
    # The first attempt of a publish whose ack was lost: stored, but the client never heard.
    seq = await store_unheard(server_url, backend, mine)
    [retried] = await backend.claim([mine])
    assert retried.status is ClaimStatus.WON, "a retried publish with our token is ours"
    assert retried.ticket is not None and retried.ticket.fence == seq
    [other] = await backend.claim([request(instance="i2")])
    assert other.status is ClaimStatus.LOST
    assert other.run.run_id == mine.run_id and other.run.instance == "i1"
    assert other.run.fence == seq and other.run.status is RunStatus.RUNNING
    claims = await read_subject(server_url, backend.stream, f"{backend.prefix}sync.claims")
    assert len(claims) == 1


async def test_a_duplicate_is_logged_with_its_slot_in_ms_and_iso(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    # docs/logging.md: a record about a slot carries job, slot and slot_iso (the duplicate's
    # record had no slot_iso).
    backend: NatsBackend = await make()
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON
    with caplog.at_level(logging.DEBUG, logger="anarchon.backends.nats"):
        [lost] = await backend.claim([request(instance="i2")])
    assert lost.status is ClaimStatus.LOST
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "claim_duplicate"]
    assert (record.job, record.slot) == ("sync", SLOT)  # type: ignore[attr-defined]
    assert record.slot_iso == "2027-01-15T08:00:00.000+00:00"  # type: ignore[attr-defined]


async def test_duplicate_of_a_trimmed_claim_loses(make: Make) -> None:
    backend: NatsBackend = await make(history_size=2)
    [first] = await backend.claim([request()])
    assert first.status is ClaimStatus.WON
    for n in (1, 2):
        [won] = await backend.claim([request(slot=SLOT + n * 1000)])
        assert won.status is ClaimStatus.WON
    # The winner of SLOT is gone (2 claims per subject are kept) but its id is remembered.
    [late] = await backend.claim([request(instance="i2")])
    assert late.status is ClaimStatus.LOST
    assert late.run.reason is not None and "trimmed" in late.run.reason


async def test_results_are_stored_once_and_merged_into_history(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    [a] = await backend.claim([request(slot=SLOT)])
    [b] = await backend.claim([request(slot=SLOT + 1000)])
    [c] = await backend.claim([request(slot=SLOT + 2000)])
    assert a.ticket and b.ticket and c.ticket
    # b finishes first, a later (overlapping runs), c never: it stays running.
    done_b = await backend.finish(b.ticket, RunStatus.SUCCEEDED, None)
    done_a = await backend.finish(a.ticket, RunStatus.FAILED, "boom")
    again = await backend.finish(a.ticket, RunStatus.FAILED, "boom")  # a retried finish
    assert same_run(done_a, again), "a duplicate ack answers with the stored run"
    results = await read_subject(server_url, backend.stream, f"{backend.prefix}sync.results")
    assert [json.loads(m.data)["run_id"] for m in results] == [b.run.run_id, a.run.run_id]
    history = await backend.history("sync")
    assert [r.slot_ms for r in history] == [SLOT + 2000, SLOT + 1000, SLOT]
    assert history[0].status is RunStatus.RUNNING and history[0].finished_at is None
    assert same_run(done_b, history[1]) and history[2] == again
    assert history[2].error == "boom" and history[2].fence == a.ticket.fence
    assert await backend.last_run("sync") == history[0]
    done_c = await backend.finish(c.ticket, RunStatus.SUCCEEDED, None)
    newest = await backend.last_run("sync")
    assert newest is not None and same_run(done_c, newest)
    assert newest == (await backend.history("sync", 1))[0]
    assert await backend.history("sync", limit=2) == [newest, history[1]]
    assert await backend.history("nobody") == [] and await backend.last_run("nobody") is None


async def test_manual_runs_claim_under_their_own_id(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    req = request(slot=None, run_id="r1")
    [won] = await backend.claim([req])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    [msg] = await read_subject(server_url, backend.stream, f"{backend.prefix}sync.claims")
    assert msg.headers == {"Nats-Msg-Id": "sync:manual-r1"}
    reads = _count_reads(backend)
    run = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    assert run.trigger is Trigger.MANUAL and run.slot is None
    assert len(reads) == 2, "a manual run's result is read back with its claim"
    assert await backend.last_run("sync") == run, "run_now() returns the stored run"


class PeakPublishes:
    """Counts how many publishes of ``backend`` are in flight at once, at most (``peak``)."""

    def __init__(self, backend: NatsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.in_flight = self.peak = 0
        publish = backend._conn.publish

        async def counted(*args: Any) -> Any:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                return await publish(*args)
            finally:
                self.in_flight -= 1

        monkeypatch.setattr(backend._conn, "publish", counted)


async def test_a_large_batch_is_published_concurrently(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: NatsBackend = await make()
    publishes = PeakPublishes(backend, monkeypatch)
    reqs = [request(job=f"j{n % 100}", slot=SLOT + (n // 100) * 1000) for n in range(10_000)]
    began = time.monotonic()
    outcomes = await backend.claim(reqs)
    took = time.monotonic() - began
    assert [o.status for o in outcomes] == [ClaimStatus.WON] * len(reqs)
    assert [o.run.run_id for o in outcomes] == [r.run_id for r in reqs]
    assert len({o.ticket.fence for o in outcomes if o.ticket}) == len(reqs)
    assert publishes.peak >= 100, f"at most {publishes.peak} publishes were in flight at once"
    assert took < 30, f"{len(reqs)} claims took {took:.1f} s"


async def test_server_time_is_the_servers_and_leaves_nothing_behind(
    make: Make, server_url: str
) -> None:
    backend: NatsBackend = await make()
    for _ in range(2):
        server = await backend.server_time_ms()
        assert server is not None and abs(server - time.time() * 1000) < 2_000
    probes = await read_subject(server_url, backend.stream, f"{backend.prefix}_clock")
    assert probes == []


async def test_concurrent_instances_one_winner_each_slot(make: Make) -> None:
    instances: list[NatsBackend] = [await make() for _ in range(3)]
    slots = [SLOT + n * 1000 for n in range(30)]

    async def contend(n: int, backend: NatsBackend) -> list[ClaimStatus]:
        outcomes = await backend.claim([request(slot=s, instance=f"i{n}") for s in slots])
        return [o.status for o in outcomes]

    answers = await asyncio.gather(*(contend(n, b) for n, b in enumerate(instances)))
    for column in zip(*answers, strict=True):
        assert sorted(column) == [ClaimStatus.LOST, ClaimStatus.LOST, ClaimStatus.WON]
    history = await instances[0].history("sync", limit=100)
    assert sorted(r.slot_ms or 0 for r in history) == slots


@pytest.mark.parametrize("version", ["current"])
async def test_invalid_job_names_are_refused_in_queries(make: Make) -> None:
    from anarchon import InvalidJobName

    backend: NatsBackend = await make()
    with pytest.raises(InvalidJobName, match="NATS subjects"):
        await backend.history("a.*")


def _count_reads(backend: NatsBackend) -> list[dict[str, Any]]:
    """Spy on the backend's reads by sequence; returns the list of requests made."""
    seen: list[dict[str, Any]] = []
    get = backend._conn.get

    async def counting(request: dict[str, Any], wait_s: float) -> Any:
        seen.append(request)
        return await get(request, wait_s)

    backend._conn.get = counting  # type: ignore[method-assign]
    return seen


async def _failing_get(request: dict[str, Any], wait_s: float) -> Any:
    import nats.errors

    raise nats.errors.TimeoutError


async def test_a_non_duplicate_ack_wins_without_reading_back(make: Make) -> None:
    backend: NatsBackend = await make()
    reads = _count_reads(backend)
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    assert reads == [], "the seed reads the stored claim back only for a duplicate ack"
    # A result whose ack is not a duplicate is answered from what was published too.
    run = await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    assert reads == [], "finish() reads back only for a duplicate ack"
    assert run.status is RunStatus.SUCCEEDED and run.fence == won.ticket.fence
    assert run.finished_at is not None and run.finished_at >= run.started_at
    [shown] = await backend.history("sync")
    assert same_run(run, shown)


async def test_a_duplicate_result_ack_reads_the_stored_run_back(make: Make) -> None:
    """A finish() retried after its answer was lost gets a duplicate ack: the stored result and
    its claim are read back, so the run answered carries the stream's timestamps."""
    backend: NatsBackend = await make()
    [won] = await backend.claim([request()])
    assert won.ticket is not None
    first = await backend.finish(won.ticket, RunStatus.FAILED, "boom")
    reads = _count_reads(backend)
    again = await backend.finish(won.ticket, RunStatus.FAILED, "boom")
    assert len(reads) == 2, "the stored result and the claim, read together"
    assert [again] == await backend.history("sync")
    assert same_run(first, again)


async def test_a_won_claim_whose_read_back_would_fail_still_runs(make: Make) -> None:
    """Before: a non-duplicate ack was read back; when that read failed the claim (stored, ours)
    was reported unavailable, and a core that gave up left it `running` with no runner."""
    backend: NatsBackend = await make()
    backend._conn.get = _failing_get  # type: ignore[method-assign]
    began = time.monotonic()
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    assert time.monotonic() - began < 2


async def store_unheard(url: str, backend: NatsBackend, claim: ClaimRequest) -> int:
    """Store ``claim`` of job ``sync`` as its first publish would, through a client of its own
    (``backend`` never hears the ack); return its sequence."""
    from anarchon.backends.nats import _records

    nc = await connect(url)
    try:
        ack = await nc.jetstream().publish(
            f"{backend.prefix}sync.claims",
            _records.encode_claim(claim),
            headers={"Nats-Msg-Id": f"sync:{claim.slot}"},
        )
        return int(ack.seq)
    finally:
        await nc.close()


async def _store_claim_of_another(url: str, backend: NatsBackend) -> int:
    return await store_unheard(url, backend, request(instance="other"))


async def test_a_duplicate_that_cannot_be_read_is_lost_and_logged(
    make: Make, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend: NatsBackend = await make()
    seq = await _store_claim_of_another(server_url, backend)
    backend._conn.get = _failing_get  # type: ignore[method-assign]
    [lost] = await backend.claim([request()])
    assert lost.status is ClaimStatus.LOST and lost.ticket is None
    assert lost.run.reason is not None
    assert f"(seq {seq}) is another instance's; reading it failed" in lost.run.reason
    assert "is another instance's, and reading it failed" in caplog.text


async def test_a_duplicate_that_may_be_our_own_claim_is_retried_not_lost(make: Make) -> None:
    """Our first publish is stored but its answer is lost; the retry's duplicate ack cannot be
    read: maybe ours, so the backend says unavailable (the core retries with the same token)
    rather than lost (which would leave our stored claim `running` with no runner)."""
    import nats.errors

    from anarchon import BackendUnavailable

    backend: NatsBackend = await make()
    publish = backend._conn.publish
    calls = 0

    async def answer_lost(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        ack = await publish(*args)
        if calls == 1:
            raise nats.errors.TimeoutError  # stored, but we never heard
        return ack

    backend._conn.publish = answer_lost  # type: ignore[method-assign,assignment]
    get = backend._conn.get
    backend._conn.get = _failing_get  # type: ignore[method-assign]
    mine = request()
    with pytest.raises(BackendUnavailable):
        await backend.claim([mine])
    backend._conn.get = get  # type: ignore[method-assign]
    [won] = await backend.claim([mine])  # the core's retry, same token
    assert won.status is ClaimStatus.WON and won.ticket is not None
    assert calls == 3


@pytest.mark.parametrize("version", ["current"])
async def test_no_claim_is_sent_later_than_the_margin_after_the_call(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every publish of a manual run's claim starts within CLAIM_RETRY_S of its claim() call,
    even for a request that waited behind the in-flight gate while the server answered slowly
    (MANUAL_SETTLE_AFTER_MS relies on it)."""
    from anarchon import BackendUnavailable
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 1.0)
    backend: NatsBackend = await make()
    backend._conn.in_flight = asyncio.Semaphore(1)
    starts: list[float] = []
    publish = backend._conn.publish

    async def slow(*args: Any) -> Any:
        starts.append(time.monotonic())
        await asyncio.sleep(0.4)  # a slow server: each answer takes 0.4 s
        return await publish(*args)

    backend._conn.publish = slow  # type: ignore[method-assign,assignment]
    began = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"not sent: 1\.[0-9] s passed while it waited"):
        await backend.claim([request(slot=None) for _ in range(5)])
    assert len(starts) == 3, [round(s - began, 2) for s in starts]
    assert max(starts) - began < 1.0, [round(s - began, 2) for s in starts]


async def test_no_scheduled_claim_is_sent_once_its_slot_is_too_late_at_its_turn(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduled claim is published only if its turn at the in-flight gate comes while its
    slot is at most max_late_ms old, and every publish of it starts within CLAIM_RETRY_S of
    that turn: so it is stored, if at all, within max_late_ms + CLAIM_MARGIN_MS of its slot,
    however long it waited behind a batch on a slow server. (It once took its CLAIM_RETRY_S
    from its claim() call instead: a claim that waited that long behind earlier ones was
    refused unsent, though its slot was still in time, and the whole batch retried.)"""
    from anarchon import Scheduler
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 0.3)
    backend: NatsBackend = await make()
    scheduler = Scheduler(backend)
    for n in range(6):
        scheduler.add(f"j{n}", "* * * * *", _noop, jitter_ms=0, max_late_ms=1_500)
    backend._conn.in_flight = asyncio.Semaphore(1)
    starts: list[float] = []
    publish = backend._conn.publish

    async def slow(*args: Any) -> Any:
        starts.append(time.time())
        await asyncio.sleep(0.4)  # longer than CLAIM_RETRY_S, each answered
        return await publish(*args)

    backend._conn.publish = slow  # type: ignore[method-assign,assignment]
    slot = int(time.time() * 1000) - 200
    outcomes = await backend.claim([request(job=f"j{n}", slot=slot) for n in range(6)])
    ages = [round(s - slot / 1000, 2) for s in starts]
    assert 3 <= len(starts) <= 4, ages  # 0.2, 0.6, 1.0 (1.4) s after the slot; then too late
    assert max(ages) <= 1.55, ages
    sent = len(starts)
    assert [o.status for o in outcomes] == [ClaimStatus.WON] * sent + [ClaimStatus.SKIPPED] * (
        6 - sent
    )
    for late in outcomes[sent:]:
        assert (late.run.reason or "").startswith("too late: i1 could send its claim only")
        assert await backend.history(late.run.job) == []  # not recorded


async def _noop(ctx: Any) -> None:
    pass


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "never-stored"])
async def test_a_claim_the_scheduler_gave_up_on_is_settled_not_left_running(
    make: Make, monkeypatch: pytest.MonkeyPatch, stored: bool
) -> None:
    """Our publish went out and its answer was lost, then NATS stayed unavailable until the slot
    was too late, so the scheduler gave up. Before, if the publish had been stored, history
    showed the slot `running` for good, with no runner. Now the backend settles it once the
    slot is past max_late_ms + the retry margin: a stored claim is closed `skipped`, and a slot
    whose claim never arrived is recorded `skipped`, both saying why."""
    import nats.errors

    from anarchon import BackendUnavailable, Scheduler
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "SETTLE_EVERY_S", 0.1)
    monkeypatch.setattr(_timings, "CLAIM_MARGIN_MS", 0)  # settled once max_late_ms is over
    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 1.0)
    backend: NatsBackend = await make()
    Scheduler(backend).add("sync", "* * * * *", _noop, jitter_ms=0, max_late_ms=1_000)
    publish = backend._conn.publish
    calls = 0

    async def answer_lost_then_down(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            if stored:
                await publish(*args)
            raise nats.errors.TimeoutError  # went out; no answer
        raise nats.errors.OutboundBufferLimitError  # disconnected: nothing is sent

    backend._conn.publish = answer_lost_then_down  # type: ignore[method-assign,assignment]
    # In time when claimed; past max_late_ms (the margin patched out) by the time the claim
    # fails: the core gives up on it.
    slot = int(time.time() * 1000) - 500
    mine = request(slot=slot)
    with pytest.raises(BackendUnavailable):
        await backend.claim([mine])
    backend._conn.publish = publish  # type: ignore[method-assign]
    runs: list[Any] = []
    for _ in range(50):
        runs = await backend.history("sync")
        if runs and runs[0].status is not RunStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    assert len(runs) == 1, runs
    [run] = runs
    assert run.status is RunStatus.SKIPPED, run
    assert run.run_id == mine.run_id and run.instance == "i1"
    assert run.reason is not None and run.reason.startswith(
        "not run: i1 could not confirm its claim while NATS was unavailable"
    )
    assert (run.fence is not None) is stored, "a closed claim keeps its fence"
    assert await backend.last_run("sync") == run


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "never-stored"])
async def test_a_claim_cancelled_unanswered_is_settled_when_the_backend_stops(
    make: Make, stored: bool
) -> None:
    """The claim call is cancelled (the scheduler stopping gave up on it) while its publish is
    out and unanswered. Before, the claim was forgotten: stored, it showed ``running`` for good.
    Now the backend's stop settles it at once: a stored claim is closed ``skipped``, and a slot
    whose claim never arrived gets a skip record, both saying why, ``before it stopped``."""
    backend: NatsBackend = await make()
    publish = backend._conn.publish
    out = asyncio.Event()

    async def never_answered(*args: Any) -> Any:
        if stored:
            await publish(*args)  # stored; its answer never heard
        out.set()
        await asyncio.Event().wait()

    backend._conn.publish = never_answered  # type: ignore[method-assign,assignment]
    mine = request()
    call = asyncio.ensure_future(backend.claim([mine]))
    async with asyncio.timeout(10):
        await out.wait()
    backend._conn.publish = publish  # type: ignore[method-assign]
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await backend.stop()
    runs = await (await make()).history("sync")
    assert len(runs) == 1, runs
    [run] = runs
    assert run.status is RunStatus.SKIPPED, run
    assert run.run_id == mine.run_id and run.instance == "i1"
    assert run.reason == (
        "not run: i1 could not confirm its claim while NATS was unavailable, before it stopped"
    )
    assert (run.fence is not None) is stored, "a closed claim keeps its fence"


async def test_a_result_of_another_run_for_the_slot_is_refused(make: Make) -> None:
    """Only a duplicate ack can refuse a result: the slot already has another run's result."""
    from anarchon import LeaseLost

    backend: NatsBackend = await make()
    [won] = await backend.claim([request()])
    assert won.ticket is not None
    await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    other = replace(won.ticket, run_id=uuid.uuid4().hex, token=uuid.uuid4().hex)
    with pytest.raises(LeaseLost, match="already has a result from run"):
        await backend.finish(other, RunStatus.SUCCEEDED, None)


async def test_a_batch_of_results_is_published_together_each_decided_on_its_own(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish_many publishes its results concurrently (one by one, a burst's 10 000 results
    took seconds); each item still gets its own answer, in order."""
    from anarchon import LeaseLost
    from anarchon.backend import FinishRequest

    backend: NatsBackend = await make()
    won = await backend.claim([request(job=f"j{n}") for n in range(3)])
    tickets = [o.ticket for o in won if o.ticket is not None]
    assert len(tickets) == 3
    taken = replace(tickets[1], run_id=uuid.uuid4().hex, token=uuid.uuid4().hex)
    await backend.finish(taken, RunStatus.SUCCEEDED, None)  # j1's slot has another's result
    publishes = PeakPublishes(backend, monkeypatch)
    results = await backend.finish_many(
        [
            FinishRequest(t, RunStatus.SUCCEEDED if t.job != "j2" else RunStatus.FAILED, "x")
            for t in tickets
        ]
    )
    assert publishes.peak == 3
    first, refused, last = results
    assert isinstance(first, Run) and first.status is RunStatus.SUCCEEDED
    assert first.run_id == tickets[0].run_id
    assert isinstance(refused, LeaseLost) and "already has a result from run" in str(refused)
    assert isinstance(last, Run) and last.status is RunStatus.FAILED and last.error == "x"
    stored = await backend.last_run("j2")
    assert stored is not None and stored.status is RunStatus.FAILED and stored.error == "x"


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"slot": None, "key": "manual-1", "trigger": Trigger.MANUAL, "requested_by": "cli"},
        {"skip_reason": 'too late: \u00e9t\u00e9 "quoted"', "skip_status": RunStatus.MISSED},
        {"instance": "h\u00f4te-1\n"},
    ],
)
def test_a_claims_payload_is_the_json_of_its_fields(changes: dict[str, Any]) -> None:
    """The payload is written out by hand for speed: it must stay the compact JSON of the
    claim's fields, in their order (other instances and history decode it)."""
    from anarchon.backends.nats import _records

    req = replace(request(), **changes)
    body: dict[str, Any] = {"v": 1, **_records.identity(req)}
    if req.requested_by is not None:
        body["requested_by"] = req.requested_by
    if req.skip_reason is not None:
        body["status"] = str(req.skip_status)
        body["reason"] = req.skip_reason
    assert _records.encode_claim(req) == json.dumps(body, separators=(",", ":")).encode()


async def test_a_claim_not_sent_at_its_turn_is_counted_unclaimed_not_skipped(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduled claim whose turn at the in-flight gate comes after max_late_ms is answered
    skipped with nothing stored (``...; not recorded``): history holds no record of it, so the
    scheduler counts it ``unclaimed`` (reason ``error``), not as a skip record. It was counted
    ``skipped`` and ``skipped_too_late``: summed, the counters exceeded history."""
    from anarchon import Scheduler
    from anarchon._metrics import skip_class
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 0.3)
    backend: NatsBackend = await make()
    scheduler = Scheduler(backend)
    jobs = [f"j{n}" for n in range(6)]
    for job in jobs:
        scheduler.add(job, "* * * * * *", _noop, jitter_ms=0, max_late_ms=1_500)
    publish = backend._conn.publish

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.4)  # a slow server: six claims a second take 2.4 s
        return await publish(*args)

    await scheduler.start()
    try:
        backend._conn.in_flight = asyncio.Semaphore(1)
        backend._conn.publish = slow  # type: ignore[method-assign,assignment]
        await asyncio.sleep(5)
    finally:
        backend._conn.publish = publish  # type: ignore[method-assign]
        await scheduler.stop()
    metrics = scheduler.metrics()
    await backend.start_reader()  # the scheduler stopped its backend
    try:
        history = [run for job in jobs for run in await backend.history(job, 100)]
    finally:
        await backend.stop()
    skips = [run for run in history if run.status is RunStatus.SKIPPED]
    assert metrics.skipped == len(skips), (metrics.skipped, skips)
    assert metrics.slots_unclaimed >= 1, metrics  # the set-up left claims behind
    for job in jobs:
        slots = metrics.by_job[job].slots
        mine = [run for run in history if run.job == job]
        assert slots["ran"] == sum(run.status is not RunStatus.SKIPPED for run in mine)
        for key in ("skipped_too_late", "skipped_other"):
            assert slots[key] == sum(
                run.status is RunStatus.SKIPPED and skip_class(run.skip_cause) == key
                for run in mine
            ), (job, slots, mine)


async def test_claims_too_late_at_their_turn_are_told_in_one_warning(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Claims not sent because their turn came after max_late_ms (the cluster beyond its
    capacity) are each logged at INFO, and counted in one WARNING per TOO_LATE_WARN_S at most.
    (Before, only the INFO lines said it.)"""
    from anarchon import Scheduler
    from anarchon.backends.nats import _timings

    backend: NatsBackend = await make()
    scheduler = Scheduler(backend)
    for n in range(10):
        scheduler.add(f"j{n}", "* * * * *", _noop, jitter_ms=0, max_late_ms=1_500)
    caplog.set_level(logging.INFO, "anarchon")
    slot = int(time.time() * 1000) - 5_000  # too late already at its turn

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "action", None) == "claims_too_late"]

    outcomes = await backend.claim([request(job=f"j{n}", slot=slot) for n in range(10)])
    assert [o.status for o in outcomes] == [ClaimStatus.SKIPPED] * 10
    await backend.claim([request(job=f"j{n}", slot=slot) for n in range(3)])
    told = warnings()
    assert len(told) == 1, [r.getMessage() for r in told]
    assert told[0].levelno == logging.WARNING and getattr(told[0], "slots", None) == 10
    assert told[0].getMessage().startswith("10 slot(s) not claimed: their claim's turn came")
    assert "docs/backends/nats.md" in told[0].getMessage()
    assert getattr(told[0], "late_ms", 0) >= 5_000
    monkeypatch.setattr(_timings, "TOO_LATE_WARN_S", 0.0)  # the next one is due: counts the 3
    await backend.claim([request(job="j0", slot=slot + 60_000)])  # in time: none added
    told = warnings()
    assert len(told) == 2 and getattr(told[1], "slots", None) == 3, told
    assert " in the last " in told[1].getMessage()


def test_too_late_warns_at_once_then_once_per_period_counting_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from anarchon.backends.nats._claims import TooLate
    from anarchon.backends.nats._timings import TOO_LATE_WARN_S

    caplog.set_level(logging.WARNING, "anarchon")
    too_late = TooLate()
    too_late.warn(100.0)  # nothing counted: nothing said
    for n in range(5):
        too_late.add(61_000 + n)
    too_late.warn(100.0)
    for second in range(1, int(TOO_LATE_WARN_S)):  # 7 000 more inside the period: silent
        for _ in range(1_000):
            too_late.add(62_000)
        too_late.warn(100.0 + second)
    too_late.warn(100.0 + TOO_LATE_WARN_S)
    told = [
        (getattr(r, "slots", None), getattr(r, "late_ms", None))
        for r in caplog.records
        if r.levelno == logging.WARNING
    ]
    assert told == [(5, 61_004), ((int(TOO_LATE_WARN_S) - 1) * 1_000, 62_000)], told
