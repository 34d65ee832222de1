"""The Lua scripts on the real shared server (one prefix per test): races, CAS, fencing, keys."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from anarchon import InvalidJobName, InvalidOption, LeaseLost, Overlap, RunStatus, Trigger
from anarchon._retrying import retry_request_id
from anarchon.backend import (
    ClaimNotice,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    TakeoverRequest,
    TakeoverStatus,
    Ticket,
)
from anarchon.backends.redis import RedisBackend
from anarchon.backends.redis._keys import KINDS, Namespace
from anarchon.control import RunRequest, retry_key
from tests.backends.redis import SERVER
from tests.redis.conftest import Make
from tests.redis.servers import REDIS_MAJOR

SLOT = 1_800_000_000_000
#: The single calls' own path (a pooled connection, the kept lane) is taken on redis-py 8+ only.
NEEDS_REDIS_8 = pytest.mark.skipif(REDIS_MAJOR < 8, reason="the pooled path needs redis-py 8")
LEASE_MS = 600


def claim_request(job: str = "job", slot: int | None = SLOT, **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=kw.pop("token", None) or uuid.uuid4().hex,
        instance=kw.pop("instance", "i1"),
        trigger=kw.pop("trigger", Trigger.SCHEDULE if slot is not None else Trigger.MANUAL),
        lease_ms=kw.pop("lease_ms", LEASE_MS),
        **kw,
    )


def takeover_request(job: str, slot_key: str, instance: str = "backup", **kw: Any):
    return TakeoverRequest(
        job=job,
        slot_key=slot_key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=instance,
        lease_ms=kw.pop("lease_ms", LEASE_MS),
        max_attempts=kw.pop("max_attempts", 3),
    )


async def test_claim_race_between_two_clients_has_one_winner_per_slot(make: Make) -> None:
    a, b = await make(), await make()
    for n in range(20):
        slot = SLOT + n * 1000
        first = claim_request(slot=slot, instance="a")
        second = claim_request(slot=slot, instance="b")
        [won_a], [won_b] = await asyncio.gather(a.claim([first]), b.claim([second]))
        statuses = sorted([won_a.status, won_b.status])
        assert statuses == [ClaimStatus.LOST, ClaimStatus.WON], (n, statuses)
        winner, loser = (won_a, won_b) if won_a.status is ClaimStatus.WON else (won_b, won_a)
        assert loser.run.run_id == winner.run.run_id
        assert loser.lease_expires_at_ms == winner.ticket.lease_expires_at_ms  # type: ignore[union-attr]


async def test_retried_claim_with_the_same_token_wins_again_with_the_same_fence(
    make: Make,
) -> None:
    backend = await make()
    req = claim_request()
    [first] = await backend.claim([req])
    [again] = await backend.claim([req])
    assert first.ticket is not None and again.ticket is not None
    assert again.status is ClaimStatus.WON and again.ticket.fence == first.ticket.fence
    [other] = await backend.claim([claim_request()])
    assert other.status is ClaimStatus.LOST


async def test_takeover_is_a_compare_and_set(make: Make) -> None:
    runner, backups = await make(), [await make() for _ in range(4)]
    [won] = await runner.claim([claim_request()])
    assert won.ticket is not None
    held = await backups[0].take_over(takeover_request("job", won.ticket.slot_key))
    assert held.status is TakeoverStatus.HELD
    assert held.lease_expires_at_ms == won.ticket.lease_expires_at_ms
    await asyncio.sleep(LEASE_MS / 1000 + 0.2)
    outcomes = await asyncio.gather(
        *(b.take_over(takeover_request("job", won.ticket.slot_key, f"b{i}")) for i, b in
          enumerate(backups))
    )  # fmt: skip
    taken = [o for o in outcomes if o.status is TakeoverStatus.TAKEN]
    assert len(taken) == 1, [o.status for o in outcomes]
    ticket = taken[0].ticket
    assert ticket is not None and ticket.attempt == 2
    assert ticket.fence is not None and won.ticket.fence is not None
    assert ticket.fence > won.ticket.fence
    for other in outcomes:
        if other is not taken[0]:
            assert other.status is TakeoverStatus.HELD
            assert other.lease_expires_at_ms == ticket.lease_expires_at_ms


async def test_stale_runner_cannot_renew_release_or_finish(make: Make) -> None:
    backend = await make()
    [won] = await backend.claim([claim_request()])
    stale = won.ticket
    assert stale is not None
    await asyncio.sleep(LEASE_MS / 1000 + 0.2)
    taken = await backend.take_over(takeover_request("job", stale.slot_key))
    assert taken.ticket is not None
    expected = (
        f"run {stale.run_id} of job 'job' (attempt 1) no longer holds its lease: the slot is "
        "now at attempt 2 (running)"
    )
    for call in (
        backend.renew(stale),
        backend.release(stale, "handed over"),
        backend.finish(stale, RunStatus.SUCCEEDED, None),
    ):
        with pytest.raises(LeaseLost) as caught:
            await call
        assert str(caught.value) == expected
    # A token that matches but a fence that does not is refused as well.
    forged = replace(taken.ticket, fence=stale.fence)
    with pytest.raises(LeaseLost):
        await backend.finish(forged, RunStatus.SUCCEEDED, None)
    done = await backend.finish(taken.ticket, RunStatus.SUCCEEDED, None)
    assert done.status is RunStatus.SUCCEEDED and done.attempt == 2
    history = await backend.history("job")
    assert [(r.attempt, r.status, r.reason) for r in history] == [
        (2, RunStatus.SUCCEEDED, None),
        (1, RunStatus.FAILED, "lease lost"),
    ]
    assert history[1].error == "lease lost: attempt 2 taken over by backup"


async def test_released_run_cannot_be_renewed_and_backup_takes_it_at_once(make: Make) -> None:
    backend = await make()
    [won] = await backend.claim([claim_request(lease_ms=60_000)])
    assert won.ticket is not None
    await backend.release(won.ticket, "handed over")
    with pytest.raises(LeaseLost, match="was handed over"):
        await backend.renew(won.ticket)
    taken = await backend.take_over(takeover_request("job", won.ticket.slot_key))
    assert taken.status is TakeoverStatus.TAKEN


async def test_attempts_exhausted_error_text(make: Make) -> None:
    backend = await make()
    [won] = await backend.claim([claim_request()])
    assert won.ticket is not None
    await asyncio.sleep(LEASE_MS / 1000 + 0.2)
    out = await backend.take_over(takeover_request("job", won.ticket.slot_key, max_attempts=1))
    assert out.status is TakeoverStatus.EXHAUSTED and out.run is not None
    assert out.run.error == "lease lost on attempt 1 of max_attempts=1; not retried"
    ended = await backend.take_over(takeover_request("job", won.ticket.slot_key))
    assert ended.status is TakeoverStatus.ENDED


def _ms(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    millis: int = 0,
) -> int:
    stamp = datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
    return int(stamp) * 1000 + millis


@pytest.mark.parametrize(
    "holder_slot",
    [
        SLOT,
        SLOT + 123,  # milliseconds: isoformat() shows microseconds
        # Future dates only: a job new to Redis refuses slots from before the server started.
        _ms(2028, 2, 29, 23, 59, 59, 999),  # leap day
        _ms(2100, 2, 28, 23, 59, 59, 1),
        _ms(2100, 3, 1),  # 2100 is no leap year
        _ms(2400, 2, 29, 12),  # 2400 is one
        _ms(2401, 1, 1),
        None,  # a manual run
    ],
)
async def test_overlap_reason_matches_the_python_rules(make: Make, holder_slot: int | None) -> None:
    backend = await make()
    holder = claim_request(slot=holder_slot, lease_ms=5_000)
    [won] = await backend.claim([holder])
    assert won.status is ClaimStatus.WON
    [skip] = await backend.claim(
        [claim_request(slot=SLOT + 7_777_000, lease_ms=5_000, overlap=Overlap.SKIP)]
    )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    where = (
        "manual"
        if holder_slot is None
        else f"slot {(epoch + timedelta(milliseconds=holder_slot)).isoformat()}"
    )
    assert skip.status is ClaimStatus.SKIPPED
    assert skip.run.reason == f"overlap: run {holder.run_id} ({where}) still holds its lease"
    assert skip.run.fence is None and skip.run.finished_at is not None


async def test_attempts_started_in_one_batch_keep_their_order(make: Make) -> None:
    backend = await make()
    slots = [SLOT + n * 1000 for n in range(6)]
    outcomes = await backend.claim([claim_request(slot=s) for s in slots])
    assert all(o.status is ClaimStatus.WON for o in outcomes)
    history = await backend.history("job", limit=10)
    # Probably started in the same millisecond: ties keep insertion order, newest first.
    assert [r.slot_ms for r in history] == slots[::-1]
    assert [r.slot_ms for r in await backend.history("job", limit=2)] == slots[:-3:-1]
    assert await backend.history("job", limit=0) == []
    assert await backend.last_slot("job") == slots[-1]


async def test_history_is_capped_by_count_and_pruned_slots_stay_refused(make: Make) -> None:
    backend = await make(history_size=5)
    slots = [SLOT + n * 1000 for n in range(8)]
    for slot in slots:
        [won] = await backend.claim([claim_request(slot=slot)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    history = await backend.history("job", limit=100)
    assert [r.slot_ms for r in history] == slots[:2:-1]
    [late] = await backend.claim([claim_request(slot=slots[0])])
    assert late.status is ClaimStatus.LOST
    assert late.run.reason == "too old: the job's history is pruned past this slot"
    assert await backend.last_slot("job") == slots[-1]


async def test_running_attempts_are_never_pruned(make: Make) -> None:
    backend = await make(history_size=1)
    [running] = await backend.claim([claim_request(slot=SLOT, lease_ms=30_000)])
    for n in range(1, 4):
        [won] = await backend.claim([claim_request(slot=SLOT + n * 1000)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    kept = [r.slot_ms for r in await backend.history("job")]
    assert SLOT in kept
    assert running.ticket is not None
    await backend.renew(running.ticket)


async def test_every_key_carries_the_job_hash_tag(make: Make, prefix: str) -> None:
    from redis.asyncio import Redis
    from redis.crc import key_slot

    backend = await make()
    jobs = ["alpha", "beta-2", "gamma_3"]
    outcomes = await backend.claim([claim_request(job=j, lease_ms=300) for j in jobs])
    for outcome in outcomes[:2]:
        assert outcome.ticket is not None
        await backend.finish(outcome.ticket, RunStatus.FAILED, "boom")
    await asyncio.sleep(0.4)
    await backend.take_over(takeover_request("gamma_3", str(SLOT)))
    await backend.claim([claim_request(job="alpha", slot=None, overlap=Overlap.SKIP)])

    client = Redis.from_url(SERVER)
    try:
        everything = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}*")])
        ours = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}{{*")])
    finally:
        await client.aclose()
    assert everything == ours, "a key outside <prefix>{job}:kind"
    shape = re.compile(re.escape(prefix) + r"\{([A-Za-z0-9_-]+)\}:(" + "|".join(KINDS) + ")")
    by_job: dict[str, set[int]] = {}
    for key in everything:
        match = shape.fullmatch(key)
        assert match, key
        by_job.setdefault(match.group(1), set()).add(key_slot(key.encode()))
    assert sorted(by_job) == sorted(jobs)
    assert all(len(slots) == 1 for slots in by_job.values()), by_job


@pytest.mark.parametrize(
    "bad",
    ["", "app", "app{x}:", "a}:", "my app:", "app\n:", "a*:", "a?:", "[a]:", ":", "-a:",
     "ü:", "a" * 100 + ":", 42, None],
)  # fmt: skip
def test_bad_prefixes_are_refused_with_value_and_rule(bad: object) -> None:
    with pytest.raises(InvalidOption) as caught:
        RedisBackend(SERVER, prefix=bad)  # type: ignore[arg-type]
    message = str(caught.value)
    assert repr(bad) in message and "ending with ':'" in message and "braces" in message


@pytest.mark.parametrize("good", ["anarchon:", "app:cron:", "a:", "App_1.prod-eu:", "9:"])
def test_good_prefixes(good: str) -> None:
    assert RedisBackend(SERVER, prefix=good).prefix == good
    assert Namespace(good).job("j").meta == f"{good}{{j}}:meta" == Namespace(good).meta("j")


def test_the_meta_key_alone_refuses_what_the_job_keys_refuse() -> None:
    for bad in ("a}b", "{x}", "a b", ""):
        with pytest.raises(InvalidJobName):
            Namespace("app:").meta(bad)


async def test_job_names_that_would_break_the_hash_tag_are_refused(make: Make) -> None:
    backend = await make()
    for bad in ("a}b", "{x}", "a b", ""):
        with pytest.raises(InvalidJobName):
            await backend.history(bad)
    assert await backend.history("nobody") == []
    assert await backend.last_run("nobody") is None
    assert await backend.last_slot("nobody") is None


async def test_server_time_is_redis_time(make: Make) -> None:
    from redis.asyncio import Redis

    backend = await make()
    client = Redis.from_url(SERVER)
    try:
        seconds, micros = await client.time()
    finally:
        await client.aclose()
    ours = await backend.server_time_ms()
    assert ours is not None and abs(ours - (seconds * 1000 + micros // 1000)) < 1000


async def test_stored_records_are_json_with_the_documented_fields(make: Make, prefix: str) -> None:
    from redis.asyncio import Redis

    backend = await make()
    [won] = await backend.claim([claim_request()])
    keys = Namespace(prefix).job("job")
    client = Redis.from_url(SERVER, decode_responses=True)
    try:
        slot_id = await client.hget(keys.slots, str(SLOT))
        assert slot_id is not None
        raw = await client.hget(keys.runs, slot_id)
        assert raw is not None
        record = json.loads(raw)
        meta = await client.hgetall(keys.meta)
    finally:
        await client.aclose()
    assert record["run_id"] == won.run.run_id and record["attempt"] == 1
    assert record["status"] == "running" and record["lease_expires_at"] > record["started_at"]
    assert {"fence", "seq", "last_slot", "known_from"} <= set(meta)
    assert int(meta["fence"]) == won.run.fence


async def test_batches_answer_each_item_in_one_call(make: Make) -> None:
    backend = await make()
    outcomes = await backend.claim([claim_request(job=f"j{n}", lease_ms=5_000) for n in range(4)])
    tickets = [o.ticket for o in outcomes if o.ticket is not None]
    assert len(tickets) == 4
    await backend.release(tickets[1], "handed over")
    renewed = await backend.renew_many(tickets)
    assert isinstance(renewed[1], LeaseLost) and "handed over" in str(renewed[1])
    assert all(not isinstance(r, LeaseLost) for n, r in enumerate(renewed) if n != 1)
    finished = await backend.finish_many(
        [FinishRequest(t, RunStatus.SUCCEEDED, None) for t in tickets[2:]]
        + [FinishRequest(tickets[2], RunStatus.FAILED, "again")]
    )
    assert [type(r).__name__ for r in finished] == ["Run", "Run", "LeaseLost"]
    assert await backend.last_slots(["j0", "j3", "nobody", "j0"]) == {
        "j0": SLOT,
        "j3": SLOT,
        "nobody": None,
    }
    assert await backend.renew_many([]) == [] and await backend.finish_many([]) == []


async def test_one_failing_call_of_a_batch_fails_alone(make: Make, prefix: str) -> None:
    """A script that fails for one job (here its meta key holds a string, WRONGTYPE) answers
    that item with a permanent error; the other items of the pipeline are decided."""
    from redis.asyncio import Redis

    backend = await make()
    client = Redis.from_url(SERVER)
    try:
        await client.set(f"{prefix}{{poison}}:meta", "not a hash")
    finally:
        await client.aclose()
    outcomes = await backend.claim(
        [claim_request(job="a"), claim_request(job="poison"), claim_request(job="b")]
    )
    assert [o.status for o in outcomes] == [ClaimStatus.WON, ClaimStatus.LOST, ClaimStatus.WON]
    assert outcomes[1].error is not None and "WRONGTYPE" in str(outcomes[1].error)
    tickets = [o.ticket for o in outcomes if o.ticket is not None]
    results = await backend.finish_many(
        [FinishRequest(t, RunStatus.SUCCEEDED, None) for t in tickets]
    )
    assert [getattr(r, "status", None) for r in results] == [RunStatus.SUCCEEDED] * 2


async def test_finishes_and_claim_notices_reach_the_others_alone_and_in_batches(
    make: Make,
) -> None:
    # A claim or result sent alone is announced by its script; a batch's, in one message the
    # instance publishes after it. Either way every listener hears each one.
    runner, listener = await make(), await make()
    changes: list[tuple[str, str, bool]] = []
    notices: list[ClaimNotice] = []
    await listener.subscribe(lambda job, key, released: changes.append((job, key, released)))
    assert await listener.subscribe_claims(notices.extend)
    alone = await runner.claim([claim_request("alone")])
    batch = await runner.claim([claim_request(f"b{n}") for n in range(3)])
    tickets = [o.ticket for o in alone + batch if o.ticket is not None]
    assert len(tickets) == 4
    await runner.finish_many([FinishRequest(tickets[0], RunStatus.SUCCEEDED, None)])
    await runner.finish_many([FinishRequest(t, RunStatus.SUCCEEDED, None) for t in tickets[1:]])
    for _ in range(200):
        if len(changes) == 4 and len(notices) == 4:
            break
        await asyncio.sleep(0.05)
    expected = sorted((t.job, t.slot_key) for t in tickets)
    assert sorted((n.job, n.slot_key) for n in notices) == expected, notices
    assert sorted(changes) == sorted((job, key, False) for job, key in expected), changes
    assert all(n.instance == "i1" and n.lease_expires_at_ms for n in notices), notices


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1", "utf-7"])
@pytest.mark.parametrize("job", ["caf\u00e9", "cafe+"])
def test_a_packed_script_call_is_what_redis_py_would_send(encoding: str, job: str) -> None:
    """A single script call is packed by anarchon (``_scripts.pack``): byte for byte what
    redis-py packs, in the client's encoding, whether its arguments are ASCII (written as one
    text) or not."""
    from redis.asyncio.connection import Connection

    from anarchon.backends.redis._scripts import SCRIPTS, pack

    keys = [f"{{app:{job}}}:meta", f"{{app:{job}}}:runs", "p:pauses"]
    args = [f'{{"job":"{job}","slot":1}}', "", "x" * 7000]
    packer = Connection(encoding=encoding)
    for name in ("claim", "hget_ints"):
        script = SCRIPTS[name]
        expected = packer.pack_command("EVALSHA", script.sha, len(keys), *keys, *args)
        assert pack(script, keys, args, encoding) == b"".join(expected)
        one = packer.pack_command("EVALSHA", script.sha, 1, keys[0], args[0])
        assert pack(script, keys[:1], args[0], encoding) == b"".join(one)
        called = packer.pack_command("FCALL", script.function, len(keys), *keys, *args)
        assert pack(script, keys, args, encoding, function=True) == b"".join(called)


@NEEDS_REDIS_8
async def test_single_calls_take_a_pooled_connection_only_on_a_plain_client(prefix: str) -> None:
    """A plain client's single script calls are sent packed on its pool's connections; a
    subclass of the client (which may send commands its own way) keeps execute_command."""
    from redis.asyncio import Redis

    from anarchon.backends.redis._scripts import ScriptRunner

    class Traced(Redis):
        pass

    plain, traced = Redis.from_url(SERVER), Traced.from_url(SERVER)
    try:
        assert ScriptRunner(plain)._pool is plain.connection_pool
        assert ScriptRunner(traced)._pool is None
        assert ScriptRunner(Redis.from_url(SERVER, single_connection_client=True))._pool is None
        backend = RedisBackend(client=traced, prefix=prefix)
        await backend.start()
        try:
            [won] = await backend.claim([claim_request()])
            assert won.status is ClaimStatus.WON
        finally:
            await backend.stop()
    finally:
        await plain.aclose()
        await traced.aclose()


@NEEDS_REDIS_8
async def test_single_calls_keep_one_connection_of_the_pool_and_give_it_back(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    """A plain client's single calls go out on one connection of its pool kept for them (the
    lane), taken once, not taken and returned per call; calls while it is in use take pooled
    connections; stop() gives it back (the client passed in goes on without it), also when a
    call still uses it."""
    from redis.asyncio import Redis

    client = Redis.from_url(SERVER)
    pool = client.connection_pool
    taken: list[object] = []
    get_connection = pool.get_connection

    async def counted() -> object:
        connection = await get_connection()  # type: ignore[no-untyped-call, unused-ignore]
        taken.append(connection)
        return connection

    monkeypatch.setattr(pool, "get_connection", counted)
    backend = RedisBackend(client=client, prefix=prefix)
    try:
        await backend.start()
        taken.clear()
        for n in range(20):
            [won] = await backend.claim([claim_request(slot=SLOT + n * 1000)])
            assert won.status is ClaimStatus.WON
        assert len(taken) == 1 and pool._in_use_connections == {taken[0]}
        at_once = await asyncio.gather(
            *(backend.claim([claim_request(slot=SLOT + (100 + n) * 1000)]) for n in range(8))
        )
        assert [o.status for [o] in at_once] == [ClaimStatus.WON] * 8
        assert len(taken) > 1 and pool._in_use_connections == {taken[0]}
        # stop() while a call uses the lane: it is given back when that call ends.
        claim = asyncio.ensure_future(backend.claim([claim_request(slot=SLOT + 999_000)]))
        runner = backend._connection._scripts
        assert runner is not None
        for _ in range(100):  # the claim's first steps, up to sending on the lane
            if runner._lane_busy:
                break
            await asyncio.sleep(0)
        assert runner._lane_busy
        await runner.release_lane()
        assert pool._in_use_connections == {taken[0]}
        [late] = await claim
        assert late.status is ClaimStatus.WON
        assert not pool._in_use_connections
        [after] = await backend.claim([claim_request(slot=SLOT + 998_000)])
        assert after.status is ClaimStatus.WON and not pool._in_use_connections
    finally:
        await backend.stop()
        assert not pool._in_use_connections
        await client.aclose()


@NEEDS_REDIS_8
async def test_a_small_pool_keeps_no_connection_for_single_calls(prefix: str) -> None:
    """A pool of fewer than LANE_MIN_POOL connections (or a blocking one) lends each single
    call a connection and takes it back, so the one kept never leaves it short."""
    from redis.asyncio import BlockingConnectionPool, Redis

    from anarchon.backends.redis._scripts import LANE_MIN_POOL, ScriptRunner

    small = Redis.from_url(SERVER, max_connections=LANE_MIN_POOL - 1)
    blocking = Redis(connection_pool=BlockingConnectionPool.from_url(SERVER))
    plain = Redis.from_url(SERVER)
    try:
        assert not ScriptRunner(small)._may_keep_lane
        assert not ScriptRunner(blocking)._may_keep_lane
        assert ScriptRunner(plain)._may_keep_lane
        backend = RedisBackend(client=small, prefix=prefix)
        await backend.start()
        try:
            [won] = await backend.claim([claim_request()])
            assert won.status is ClaimStatus.WON
            assert not small.connection_pool._in_use_connections
        finally:
            await backend.stop()
    finally:
        for client in (small, blocking, plain):
            await client.aclose()


@NEEDS_REDIS_8
async def test_the_kept_connection_is_closed_if_its_pool_forgot_it(prefix: str) -> None:
    """A pool reset (by its owner) while the backend keeps a connection of it: stop() closes
    that connection itself instead of failing."""
    from redis.asyncio import Redis

    client = Redis.from_url(SERVER)
    backend = RedisBackend(client=client, prefix=prefix)
    try:
        await backend.start()
        [won] = await backend.claim([claim_request()])
        assert won.status is ClaimStatus.WON
        runner = backend._connection._scripts
        assert runner is not None and runner._lane is not None
        lane = runner._lane
        client.connection_pool.reset()  # type: ignore[no-untyped-call, unused-ignore]
        await backend.stop()
        assert not lane.is_connected
    finally:
        await client.aclose()


async def test_on_a_cluster_a_retry_is_stored_before_its_result_and_removed_if_refused(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis Cluster keeps the requests hash in another slot than the job's keys: the retry
    is stored first, and removed again when its result is refused (only if it is still the
    one stored: another run's request of the same id stays)."""
    backend = await make()
    monkeypatch.setattr(backend, "_on_cluster", lambda: True)
    outcomes = await backend.claim([claim_request(slot=SLOT + n * 1000) for n in range(2)])
    first, second = (o.ticket for o in outcomes)
    assert first is not None and second is not None

    def retry_of(ticket: Ticket, by: str = "") -> RunRequest:
        return RunRequest(
            id=retry_request_id("job", ticket.slot_key, 1),
            job="job",
            trigger=Trigger.RETRY,
            key=retry_key(ticket.slot_key, 1),
            slot=ticket.slot,
            due_ms=SLOT,
            requested_by=by or f"retry 1 of 1 after run {ticket.run_id}",
            requested_at_ms=SLOT,
            retry=1,
        )

    forged = replace(second, token=uuid.uuid4().hex)
    answers = await backend.finish_many(
        [
            FinishRequest(first, RunStatus.FAILED, "boom", retry_of(first)),
            FinishRequest(forged, RunStatus.FAILED, "forged", retry_of(second)),
        ]
    )
    assert [type(a).__name__ for a in answers] == ["Run", "LeaseLost"]
    control = backend.control()
    assert await control.requests(["job"]) == [retry_of(first)]
    theirs = retry_of(second, by="another run's retry")
    assert await control.request(theirs)
    [refused] = await backend.finish_many(
        [FinishRequest(forged, RunStatus.FAILED, "forged", retry_of(second))]
    )
    assert isinstance(refused, LeaseLost)
    assert {r.requested_by for r in await control.requests(["job"])} == {
        retry_of(first).requested_by,
        theirs.requested_by,
    }
