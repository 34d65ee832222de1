"""Pauses and run requests on real servers (2.9.10 and current): the key-value bucket beside the
stream, the pause check before a claim, missed records, retries and ``requested_by``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from anarchon import RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats._timings import PAUSE_CACHE_S
from anarchon.control import ALL_JOBS, Pause, RunRequest, paused_reason, retry_key
from tests.nats.servers import connect, read_subject

SLOT = 1_800_000_000_000
Make = Callable[..., Any]


def request(job: str = "sync", slot: int | None = SLOT, **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=kw.pop("instance", "i1"),
        trigger=kw.pop("trigger", Trigger.SCHEDULE if slot is not None else Trigger.MANUAL),
        **kw,
    )


async def bucket_exists(server_url: str, backend: NatsBackend) -> bool:
    import nats.js.errors

    nc = await connect(server_url)
    try:
        await nc.jetstream().key_value(backend.control().bucket)
    except nats.js.errors.BucketNotFoundError:
        return False
    finally:
        await nc.close()
    return True


async def test_reads_and_claims_create_no_bucket(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    store = backend.control()
    assert store is backend.control()  # one store per backend: claims share its pause cache
    assert await store.pauses() == []
    assert await store.requests() == []
    assert await store.resume("sync") is None
    await store.done(uuid.uuid4().hex)
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON
    assert not await bucket_exists(server_url, backend)
    await store.pause(Pause(job="sync", by="ops", at_ms=int(time.time() * 1000)))
    assert await bucket_exists(server_url, backend)
    assert backend.control().bucket == f"{backend.stream}_control"


async def test_a_pause_stored_elsewhere_holds_within_the_cache_time(make: Make) -> None:
    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    [first] = await runner.claim([request()])  # reads (and remembers) "no pause"
    assert first.status is ClaimStatus.WON
    pause = Pause(job=ALL_JOBS, by="ops", at_ms=int(time.time() * 1000))
    await operator.control().pause(pause)
    await asyncio.sleep(PAUSE_CACHE_S + 0.2)
    [held] = await runner.claim([request(slot=SLOT + 1000)])
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)
    assert await operator.control().resume(ALL_JOBS) == pause
    await asyncio.sleep(PAUSE_CACHE_S + 0.2)
    [after] = await runner.claim([request(slot=SLOT + 2000)])
    assert after.status is ClaimStatus.WON


async def test_a_batch_reads_only_the_pauses_the_bucket_lists(make: Make) -> None:
    # A burst of many jobs lists the bucket's pause keys once instead of reading each job's.
    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    pause = Pause(job="j7", by="ops", at_ms=int(time.time() * 1000))
    await operator.control().pause(pause)
    await operator.control().pause(Pause(job="resumed", by="ops", at_ms=pause.at_ms))
    assert await operator.control().resume("resumed") is not None
    control = runner.control()
    reads: list[str] = []
    read_pause = control._read_pause

    async def counted(kv: Any, job: str) -> Any:
        reads.append(job)
        return await read_pause(kv, job)

    control._read_pause = counted  # type: ignore[method-assign]
    jobs = [f"j{n}" for n in range(300)] + ["resumed"]
    outcomes = await runner.claim([request(job=job) for job in jobs])
    by_job = {o.run.job: o.status for o in outcomes}
    assert by_job.pop("j7") is ClaimStatus.SKIPPED
    assert set(by_job.values()) == {ClaimStatus.WON}
    assert sorted(reads) == ["j7", "resumed"], reads  # a resumed pause's key reads as none


async def test_a_paused_slot_claimed_before_the_pause_keeps_its_run(make: Make) -> None:
    backend: NatsBackend = await make()
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON
    await backend.control().pause(Pause(job="sync", by="ops", at_ms=int(time.time() * 1000)))
    [again] = await backend.claim([request(instance="i2")])
    assert again.status is ClaimStatus.LOST and again.run.run_id == won.run.run_id
    [run] = await backend.history("sync")
    assert run.status is RunStatus.RUNNING


async def test_skip_records_carry_their_status_and_who_asked(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    [missed] = await backend.claim(
        [request(skip_reason="missed: nobody", skip_status=RunStatus.MISSED)]
    )
    assert missed.status is ClaimStatus.SKIPPED and missed.run.status is RunStatus.MISSED
    key = f"manual-{uuid.uuid4().hex}"
    [manual] = await backend.claim(
        [request(slot=None, key=key, trigger=Trigger.MANUAL, requested_by="alice@ops")]
    )
    assert manual.status is ClaimStatus.WON and manual.ticket is not None
    assert manual.ticket.slot_key == key
    stored = await read_subject(server_url, backend.stream, f"{backend.prefix}sync.claims")
    bodies = [json.loads(m.data) for m in stored]
    assert bodies[0]["status"] == "missed" and "requested_by" not in bodies[0]
    assert bodies[1]["requested_by"] == "alice@ops" and bodies[1]["slot_key"] == key
    assert "status" not in bodies[1]
    assert [m.headers["Nats-Msg-Id"] for m in stored] == [f"sync:{SLOT}", f"sync:{key}"]
    await backend.finish(manual.ticket, RunStatus.SUCCEEDED, None)
    runs = await backend.history("sync")
    assert [(r.status, r.requested_by) for r in runs] == [
        (RunStatus.SUCCEEDED, "alice@ops"),
        (RunStatus.MISSED, None),
    ]
    last = await backend.last_run("sync")
    assert last is not None and last.requested_by == "alice@ops"


async def test_a_retry_of_a_slot_older_than_the_window_is_claimed(make: Make) -> None:
    backend: NatsBackend = await make(duplicate_window_ms=60_000)
    old = int(time.time() * 1000) - 3_600_000
    key = retry_key(str(old), 1)
    retry = request(slot=old, key=key, trigger=Trigger.RETRY, requested_by="retry of r1")
    [won] = await backend.claim([retry])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    assert won.ticket.slot_key == key and won.run.slot_ms == old
    [lost] = await backend.claim([request(slot=old, key=key, trigger=Trigger.RETRY)])
    assert lost.status is ClaimStatus.LOST


async def test_last_slots_reads_each_jobs_newest_slot(make: Make) -> None:
    backend: NatsBackend = await make()
    retried = SLOT + 2000
    for claim in (
        request(job="a"),
        request(job="a", slot=SLOT + 1000),
        request(job="b", skip_reason="too late: x"),
        request(job="c"),
        # Newest claims that are no slot's: the slot before them is read from the job's claims
        # (earlier, such a job had no last slot, and its missed slots were never recorded).
        request(job="c", slot=None),
        request(job="d", slot=SLOT),
        request(job="d", slot=retried),
        request(job="d", slot=retried, key=retry_key(str(retried), 1), trigger=Trigger.RETRY),
        request(job="e", slot=None),
    ):
        await backend.claim([claim])  # one at a time: a batch is published concurrently
    assert await backend.last_slots(["a", "b", "c", "d", "e", "nobody"]) == {
        "a": SLOT + 1000,
        "b": SLOT,
        "c": SLOT,
        "d": retried,
        "e": None,
        "nobody": None,
    }


async def test_slots_missed_after_a_manual_run_are_recorded(make: Make) -> None:
    from anarchon import RunContext, Scheduler

    backend: NatsBackend = await make()
    last = (int(time.time()) - 15) * 1000
    await backend.claim([request(job="tick", slot=last)])
    await backend.claim([request(job="tick", slot=None)])  # a manual run since: the newest claim

    async def noop(ctx: RunContext) -> None:
        pass

    scheduler = Scheduler(await make(), instance_id="second")
    scheduler.add("tick", "* * * * * *", noop, jitter_ms=0, max_late_ms=1000)
    missed: list[int] = []
    async with scheduler:
        deadline = time.monotonic() + 10
        while not missed and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            runs = await backend.history("tick", limit=100)
            missed = sorted(r.slot_ms or 0 for r in runs if r.status is RunStatus.MISSED)
    # The slots after the last one recorded, older than the start less max_late_ms and the
    # margin, are recorded at once (earlier, none: the manual run hid the last slot).
    assert missed and missed[0] == last + 1000, missed


async def test_last_slots_reads_only_the_jobs_that_have_claims(make: Make) -> None:
    # Start-up at 100 000 jobs: the stream's info lists the claimed subjects first, so the jobs
    # that were never claimed cost no read.
    backend: NatsBackend = await make()
    await backend.claim([request(job="a"), request(job="b", slot=SLOT + 1000)])
    reads: list[dict[str, Any]] = []
    get = backend._conn.get

    async def counted(req: dict[str, Any], wait_s: float) -> Any:
        reads.append(req)
        return await get(req, wait_s)

    backend._conn.get = counted  # type: ignore[method-assign, assignment]
    names = [f"new{n}" for n in range(2000)] + ["a", "b"]
    found = await backend.last_slots(names)
    assert found == {**dict.fromkeys(names), "a": SLOT, "b": SLOT + 1000}
    assert len(reads) == 2, reads


def _manual_request(at_ms: int) -> RunRequest:
    """A manual run of ``sync`` requested by ``ops`` at ``at_ms``, due then."""
    return RunRequest(
        id=uuid.uuid4().hex,
        job="sync",
        trigger=Trigger.MANUAL,
        key="manual-x",
        slot=None,
        due_ms=at_ms,
        requested_by="ops",
        requested_at_ms=at_ms,
    )


async def test_run_requests_leave_no_tombstones(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make()
    store = backend.control()
    now = int(time.time() * 1000)
    made = _manual_request(now)
    assert await store.request(made) is True
    assert await store.requests(["sync"]) == [made]
    await store.done(made.id)
    assert await store.requests() == []
    nc = await connect(server_url)
    try:
        info = await nc.jetstream().stream_info(f"KV_{store.bucket}")
    finally:
        await nc.close()
    assert info.state.messages == 0


async def test_a_poll_reads_only_the_requests_it_has_not_read(make: Make) -> None:
    """The request poller lists the requests every second: a request read once is not read
    again while it stays listed (it never changes), only new ones are; one removed (another
    instance claimed it) is gone from the answer, and one stored by another instance since the
    last poll is read."""
    poller, other = (await make()).control(), (await make()).control()
    now = int(time.time() * 1000)
    first, second = _manual_request(now), _manual_request(now + 1)
    for made in (first, second):
        assert await other.request(made)
    get = poller._get
    reads: list[str] = []

    async def counting(kv: Any, key: str, doing: str) -> bytes | None:
        reads.append(key)
        return await get(kv, key, doing)  # type: ignore[no-any-return]

    poller._get = counting
    assert await poller.requests(["sync"]) == [first, second]
    assert len(reads) == 2
    assert await poller.requests(["sync"]) == [first, second]
    assert await poller.requests(["other"]) == []
    assert len(reads) == 2  # nothing read again
    third = _manual_request(now + 2)
    assert await other.request(third)
    await other.done(first.id)
    assert await poller.requests(["sync"]) == [second, third]
    assert len(reads) == 3  # the new one alone
    assert await poller.requests() == [second, third]
    assert len(reads) == 3


async def test_a_bucket_the_claims_cannot_read_pauses_nothing(
    make: Make, monkeypatch: Any, caplog: Any
) -> None:
    from anarchon.errors import BackendError

    backend: NatsBackend = await make()
    control = backend.control()
    await control.pause(Pause(job="sync", by="ops", at_ms=int(time.time() * 1000)))
    control._cache.clear()

    async def refused(*_: Any) -> Any:
        raise BackendError("NATS: reading the pause failed: permissions violation")

    monkeypatch.setattr(control, "_read_pause", refused)
    [won] = await backend.claim([request()])
    assert won.status is ClaimStatus.WON
    assert "pauses not checked" in caplog.text


async def _until(check: Callable[[], bool], limit_s: float = 2.0) -> None:
    deadline = time.monotonic() + limit_s
    for _ in range(int(limit_s / 0.01)):
        if check() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.01)


async def test_a_pause_stored_elsewhere_reaches_the_claims_at_once(make: Make) -> None:
    """The watch on the bucket's pause subjects hears a pause (and a resume) stored by another
    instance as it is stored: the next claim holds, inside the listing's cache time."""
    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    [first] = await runner.claim([request()])  # lists "no pause", starts the watch
    assert first.status is ClaimStatus.WON
    control = runner.control()
    key = control._pause_key(ALL_JOBS)
    began = time.monotonic()
    pause = Pause(job=ALL_JOBS, by="ops", at_ms=int(time.time() * 1000))
    await operator.control().pause(pause)
    await _until(lambda: control._listed is not None and key in control._listed[1])
    [held] = await runner.claim([request(slot=SLOT + 1000)])
    assert time.monotonic() - began < PAUSE_CACHE_S  # the listing read first is still trusted
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)
    assert await operator.control().resume(ALL_JOBS) == pause
    await _until(lambda: control._cache.get(key, (0, pause))[1] is None)  # heard: no pause
    [after] = await runner.claim([request(slot=SLOT + 2000)])
    assert after.status is ClaimStatus.WON


async def test_a_claim_waits_for_the_pause_listing_only_without_the_watch(make: Make) -> None:
    """While the watch keeps the listing current, a claim whose listing is older than the
    cache time is not held up by reading it again (that read runs in the background); after
    a reconnect (the watch may have missed pauses meanwhile) the claim reads it first."""
    runner: NatsBackend = await make()
    [first] = await runner.claim([request()])
    assert first.status is ClaimStatus.WON
    control = runner.control()
    keys = control._keys
    listings: list[float] = []

    async def slow(kv: Any, kind: str) -> list[str]:
        listings.append(time.monotonic())
        await asyncio.sleep(0.5)
        return await keys(kv, kind)

    control._keys = slow  # type: ignore[method-assign]
    await operator_pause_elsewhere(make)  # the bucket exists: each listing reads it
    await asyncio.sleep(PAUSE_CACHE_S + 0.1)
    began = time.monotonic()
    [second] = await runner.claim([request(slot=SLOT + 1000)])
    assert time.monotonic() - began < 0.4
    assert second.status is ClaimStatus.SKIPPED  # the watch heard the pause
    await _until(lambda: len(listings) == 1)
    assert len(listings) == 1  # read again, in the background
    nc = runner._conn.nc
    assert nc is not None
    nc.stats["reconnects"] += 1  # as nats-py counts a reconnect
    began = time.monotonic()
    [third] = await runner.claim([request(slot=SLOT + 2000)])
    assert time.monotonic() - began >= 0.5
    assert third.status is ClaimStatus.SKIPPED


async def operator_pause_elsewhere(make: Make) -> Pause:
    pause = Pause(job="sync", by="ops", at_ms=int(time.time() * 1000))
    operator: NatsBackend = await make()
    await operator.control().pause(pause)
    return pause


def heard(control: Any, job: str, pause: Pause | None) -> None:
    """Hand the watch a message as the server would deliver it for ``job``'s pause subject."""
    from nats.aio.msg import Msg

    subject = f"$KV.{control.bucket}.{control._pause_key(job)}"
    if pause is None:
        msg = Msg(None, subject, "", b"", {"KV-Operation": "DEL"})  # type: ignore[arg-type]
    else:
        msg = Msg(None, subject, "", pause.to_json().encode(), None)  # type: ignore[arg-type]
    control._heard_pause(msg)


async def test_a_pause_heard_before_the_stream_stored_it_holds(make: Make) -> None:
    """The server may hand a pause's message to the watch before the bucket's stream has
    stored it: a listing or a read of the key at that moment answers the state before. What
    the watch heard holds anyway, and a listing read meanwhile keeps the key."""
    runner: NatsBackend = await make()
    await operator_pause_elsewhere(make)  # the bucket exists; "sync" is paused
    [first] = await runner.claim([request(job="other")])  # lists "sync" only; starts the watch
    assert first.status is ClaimStatus.WON
    control = runner.control()
    pause = Pause(job=ALL_JOBS, by="ops", at_ms=int(time.time() * 1000))
    heard(control, ALL_JOBS, pause)  # not stored: as if the stream had not stored it yet
    await control._list()  # a listing read now does not list it
    assert control._listed is not None and control._pause_key(ALL_JOBS) in control._listed[1]
    [held] = await runner.claim([request(job="other", slot=SLOT + 1000)])
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)
    heard(control, ALL_JOBS, None)  # a delete marker heard: no pause
    [after] = await runner.claim([request(job="other", slot=SLOT + 2000)])
    assert after.status is ClaimStatus.WON


async def test_a_read_begun_before_a_pause_was_heard_does_not_hide_it(make: Make) -> None:
    """A read of a job's pause that was under way when the watch heard the job paused answers
    the state before; it must not be remembered over what the watch heard."""
    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    await operator.control().pause(Pause(job="sync", by="ops", at_ms=int(time.time() * 1000)))
    assert await operator.control().resume("sync") is not None  # "sync" stays listed
    [first] = await runner.claim([request()])  # lists "sync", starts the watch
    assert first.status is ClaimStatus.WON
    control = runner.control()
    read_pause = control._read_pause
    release = asyncio.Event()
    reading = asyncio.Event()

    async def held_up(kv: Any, job: str) -> Any:
        answer = await read_pause(kv, job)  # no pause yet
        reading.set()
        await release.wait()
        return answer

    control._read_pause = held_up  # type: ignore[method-assign]
    control._cache.clear()  # the next claim reads the pause of "sync"
    racing = asyncio.ensure_future(runner.claim([request(slot=SLOT + 1000)]))
    await asyncio.wait_for(reading.wait(), 5)
    pause = Pause(job="sync", by="ops", at_ms=int(time.time() * 1000))
    await operator.control().pause(pause)
    key = control._pause_key("sync")
    await _until(lambda: control._cache.get(key, (0, None))[1] == pause)
    release.set()
    await racing  # raced the pause: either answer is right for it
    control._read_pause = read_pause  # type: ignore[method-assign]
    [held] = await runner.claim([request(slot=SLOT + 2000)])
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)


async def test_a_bucket_lookup_answered_before_the_first_pause_does_not_hide_it(
    make: Make, monkeypatch: Any
) -> None:
    """The first pause creates the bucket. A lookup of the bucket answered "no bucket" just
    before, but heard after the watch heard the pause, must not make the claims believe the
    bucket missing (before: for a second, and a listing read meanwhile listed no pause, so
    claims went on unpaused for about two seconds: a CI failure of the three-instance test)."""
    from nats.js.errors import BucketNotFoundError

    from anarchon.errors import BackendError

    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    [first] = await runner.claim([request()])  # no bucket: lists nothing, starts the watch
    assert first.status is ClaimStatus.WON
    control = runner.control()
    key = control._pause_key("sync")
    bounded = control._bounded
    pause = Pause(job="sync", by="ops", at_ms=int(time.time() * 1000))
    looked_up: list[str] = []

    async def answered_late(aw: Any, doing: str) -> Any:
        if doing != "opening the control bucket" or looked_up:
            return await bounded(aw, doing)
        looked_up.append(doing)
        aw.close()  # the lookup's answer, "no bucket", came before the pause was stored...
        await operator.control().pause(pause)  # ...and is read after the watch heard it
        await _until(lambda: control._listed is not None and key in control._listed[1])
        raise BackendError("NATS: opening the control bucket failed") from BucketNotFoundError()

    monkeypatch.setattr(control, "_bounded", answered_late)
    await control._list()  # a listing whose lookup was under way
    await control._list()  # the next listing, read after the pause was heard
    assert looked_up
    await asyncio.sleep(PAUSE_CACHE_S + 0.1)  # what the watch heard is no longer trusted alone
    [held] = await runner.claim([request(slot=SLOT + 1000)])
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)


async def _paused_after_a_poll_found_no_bucket(
    make: Make,
) -> tuple[NatsBackend, NatsBackend, Pause]:
    """A runner whose run-request poll found no control bucket (so believes it missing for a
    second), then the first pause stored by an operator instance, which creates the bucket."""
    runner: NatsBackend = await make()
    operator: NatsBackend = await make()
    assert await runner.control().requests() == []  # no bucket: believed missing for a second
    pause = Pause(job="sync", by="ops", at_ms=int(time.time() * 1000))
    await operator.control().pause(pause)
    return runner, operator, pause


async def test_a_watch_started_after_the_first_pause_lists_it(make: Make) -> None:
    """An instance that polled its run requests just before the first pause created the bucket
    believes the bucket missing for a second. Its first claim after the pause starts the watch
    too late to hear the pause, so the listing it trusts from then on must be read from the
    server, not from that belief (before: it listed no pause and its claims ran unpaused for
    about two seconds, a CI failure of the three-instance test)."""
    runner, _operator, pause = await _paused_after_a_poll_found_no_bucket(make)
    [held] = await runner.claim([request()])  # the first claim: lists, starts the watch
    assert held.status is ClaimStatus.SKIPPED
    assert held.run.reason == paused_reason(pause)
    await asyncio.sleep(PAUSE_CACHE_S + 0.1)
    [again] = await runner.claim([request(slot=SLOT + 1000)])
    assert again.status is ClaimStatus.SKIPPED


async def test_steering_after_a_poll_that_found_no_bucket_reads_the_server(make: Make) -> None:
    """An instance whose run-request poll found no bucket believes it missing for a second; the
    first pause, stored by another instance, creates it. Resuming, listing the pauses and
    reading the requests on the first instance must look at the server, not at that belief
    (before: resume answered 'not paused' and left the pause in force, pauses() listed none,
    and the request another instance stored was not read)."""
    runner, operator, pause = await _paused_after_a_poll_found_no_bucket(make)
    control = runner.control()
    manual = _manual_request(pause.at_ms)
    assert await operator.control().request(manual)
    assert await control.pauses() == [pause]
    assert await control.requests() == [manual]
    assert await control.resume("sync") == pause
    assert await operator.control().pauses() == []


async def test_a_pause_replaced_while_it_is_resumed_is_read_again(make: Make) -> None:
    """resume reads the pause, then deletes it with a compare-and-set on the revision read;
    another operator replaces the pause in between: the delete loses, and resume reads the pause
    again and removes the new one, which it returns (it failed with a generic 400 before)."""
    resumer, other = (await make()).control(), (await make()).control()
    first = Pause(job="sync", by="ops", at_ms=1_000)
    second = Pause(job="sync", by="oncall", at_ms=2_000)
    await resumer.pause(first)
    read_pause = resumer._read_pause
    reads = []

    async def read_then_replace(kv: Any, job: str) -> Any:
        found = await read_pause(kv, job)
        reads.append(found[0])
        if len(reads) == 1:
            await other.pause(second)
        return found

    resumer._read_pause = read_then_replace
    assert await resumer.resume("sync") == second
    assert reads == [first, second]
    assert await other.pauses() == []
