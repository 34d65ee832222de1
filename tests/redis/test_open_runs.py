"""``RedisBackend.open_runs``, the safety net every instance reads each minute: from each job's
index of its open attempts (``:leases``), so the pass costs a job with no open run nothing but an
empty read, and finds every open attempt however many newer ones the job recorded since."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from anarchon import Overlap, RunStatus, Trigger
from anarchon.backend import ClaimRequest, ClaimStatus, TakeoverStatus, Ticket
from anarchon.backends.redis import RedisBackend
from anarchon.backends.redis._keys import Namespace
from anarchon.testing.contract import request, takeover
from tests.backends.redis import SERVER
from tests.redis.conftest import Make

SLOT = 1_800_000_000_000
LONG_MS = 60_000


def _claim(job: str, slot: int | None, **kw: Any) -> ClaimRequest:
    return request(job, slot, **{"lease_ms": LONG_MS, **kw})


async def _won(backend: RedisBackend, job: str, slot: int | None, **kw: Any) -> Ticket:
    [outcome] = await backend.claim([_claim(job, slot, **kw)])
    assert outcome.status is ClaimStatus.WON and outcome.ticket is not None, outcome
    return outcome.ticket


async def _open(backend: RedisBackend, jobs: list[str], since_ms: int = 0) -> set[str]:
    return {run.run_id for run in await backend.open_runs(jobs, since_ms)}


async def test_an_open_run_behind_twenty_newer_attempts_is_found(make: Make) -> None:
    # A runner died holding a long lease; the job (every second, overlap='skip') recorded a
    # skip a slot while it held, then ran on after it ran out. Read from each job's 20 newest
    # attempts, the stuck run was never found again once 20 newer ones were recorded: nobody
    # took it over. Its index finds it, on the first pass and on every one after.
    backend = await make()
    stuck = await _won(backend, "job", SLOT, overlap=Overlap.SKIP)
    done = []
    for n in range(1, 26):
        [skipped] = await backend.claim([_claim("job", SLOT + n * 1_000, overlap=Overlap.SKIP)])
        assert skipped.status is ClaimStatus.SKIPPED, skipped
        ticket = await _won(backend, "other", SLOT + n * 1_000)
        await backend.finish(ticket, RunStatus.SUCCEEDED, None)
        done.append(ticket.run_id)
    assert len(await backend.history("job", 100)) == 26
    for _ in range(2):
        assert await _open(backend, ["job", "other"]) == {stuck.run_id}
    later = await make()  # another instance, started since: the same
    assert await _open(later, ["job", "other"]) == {stuck.run_id}


async def test_the_pass_finds_every_open_run_and_no_ended_one(make: Make) -> None:
    # The second pass since start reads the index alone: live, expired and released runs, a
    # takeover's new attempt; not a finished run, nor an attempt taken over, nor one taken over
    # and then finished.
    backend = await make()
    live = await _won(backend, "a", SLOT)
    expired = await _won(backend, "a", SLOT + 1_000, lease_ms=300)
    released = await _won(backend, "b", None, trigger=Trigger.MANUAL)
    finished = await _won(backend, "b", SLOT)
    old = await _won(backend, "c", SLOT, lease_ms=300)
    old_done = await _won(backend, "c", SLOT + 1_000, lease_ms=300)
    await backend.finish(finished, RunStatus.FAILED, "boom")
    await backend.release(released, "handed over")
    await asyncio.sleep(0.5)  # the short leases run out
    taken = await backend.take_over(takeover("c", old.slot_key, lease_ms=LONG_MS))
    taken_done = await backend.take_over(takeover("c", old_done.slot_key, lease_ms=LONG_MS))
    assert taken.ticket is not None and taken_done.ticket is not None
    assert taken.status is taken_done.status is TakeoverStatus.TAKEN
    await backend.finish(taken_done.ticket, RunStatus.SUCCEEDED, None)
    expected = {live.run_id, expired.run_id, released.run_id, taken.ticket.run_id}
    jobs = ["a", "b", "c", "nobody"]
    for _ in range(3):
        runs = await backend.open_runs(jobs, 0)
        assert {run.run_id for run in runs} == expected
        assert {run.status for run in runs} == {RunStatus.RUNNING}
        assert {run.slot_key for run in runs} == {
            live.slot_key,
            expired.slot_key,
            released.slot_key,
            old.slot_key,
        }
    # since_ms: the runs that started at or after it (their leases end later still).
    now_ms = await backend.server_time_ms()
    assert now_ms is not None
    assert await _open(backend, jobs, now_ms + 3_600_000) == set()
    ended = [finished, old_done]
    assert not {t.run_id for t in ended} & await _open(backend, jobs)


async def test_a_run_released_by_an_earlier_version_is_found_when_an_instance_starts(
    make: Make,
) -> None:
    # Before the index kept released attempts, a release took its attempt out of it. Such a
    # run (an instance of the earlier version handed it over as it stopped) is found by the
    # first pass of an instance that starts: it reads each job's newest attempts too.
    ticket = await _released_by_an_earlier_version(await make(), "job")
    started = await make()
    assert await _open(started, ["job"]) == {ticket.run_id}


async def _released_by_an_earlier_version(backend: RedisBackend, job: str) -> Ticket:
    """Claim ``job`` and release it as an earlier version did: out of the job's index."""
    ticket = await _won(backend, job, SLOT)
    await backend.release(ticket, "handed over")
    from redis.asyncio import Redis

    client = Redis.from_url(SERVER)
    try:
        keys = Namespace(backend.prefix).job(job)
        members = await client.zrange(keys.leases, 0, -1)
        if members:  # what the earlier release.lua did: ZREM
            await client.zrem(keys.leases, *members)
    finally:
        await client.aclose()
    return ticket


async def test_the_first_pass_reads_newest_attempts_in_a_few_calls_not_one_per_job(
    make: Make,
) -> None:
    # The first pass since start read each job's newest attempts by a history call per job:
    # 100 000 calls (seconds of an instance's start-up). The open_runs script reads them
    # too, several jobs a call, and still finds the run an earlier version released.
    ticket = await _released_by_an_earlier_version(await make(), "job-7")
    started = await make()
    sent: list[tuple[str, int]] = []
    connection = started._connection
    many = connection.script_raw_many

    async def counted(name: str, calls: Any) -> list[Any]:
        sent.append((name, len(calls)))
        return await many(name, calls)

    connection.script_raw_many = counted  # type: ignore[method-assign]
    jobs = [f"job-{n}" for n in range(1_200)]
    assert await _open(started, jobs) == {ticket.run_id}
    assert sum(n for _, n in sent) <= 10, sent
    assert {name for name, _ in sent} == {"open_runs"}
    sent.clear()
    assert await _open(started, jobs) == set(), "released: the index alone, it has no such run"
    assert await _open(started, [*jobs, "job-new"]) == set()
    assert sum(n for _, n in sent) <= 10, sent


async def test_a_released_run_holds_no_overlap_and_stays_open_when_the_clock_goes_back(
    make: Make,
) -> None:
    # A released attempt stays in the index, scored by the time of its release. A claim whose
    # clock is behind that time meets it among the live leases: it holds nothing (the claim
    # runs), and it stays in the index (still open, found by the pass).
    backend = await make()
    backend._test_clock_offset_ms = 120_000
    ticket = await _won(backend, "job", SLOT, overlap=Overlap.SKIP)
    await backend.release(ticket, "handed over")
    backend._test_clock_offset_ms = 0
    after = await _won(backend, "job", SLOT + 1_000, overlap=Overlap.SKIP)
    for _ in range(2):
        assert await _open(backend, ["job"]) == {ticket.run_id, after.run_id}


def _sent_keys(backend: RedisBackend) -> list[int]:
    """Record how many keys each open_runs script call of ``backend`` names."""
    sent: list[int] = []
    connection = backend._connection
    many = connection.script_raw_many

    async def counted(name: str, calls: Any) -> list[Any]:
        sent.extend(len(keys) for keys, _ in calls)
        return await many(name, calls)

    connection.script_raw_many = counted  # type: ignore[method-assign]
    return sent


async def test_a_later_pass_over_many_jobs_reads_only_the_jobs_with_open_attempts(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pass every minute named each job's two keys: 200 000 keys at 100 000 jobs, about a
    # quarter of a second of the instance's CPU, though nearly every job has no open run. A
    # job has its index of open attempts only while it has one: one SCAN of the database
    # finds those jobs, and only they are read (the first pass since start still reads all).
    from anarchon.backends.redis import _backend, _timings

    # The shared server holds other tests' keys: scan whatever their number; and scan at each
    # call (10 s of reuse otherwise).
    monkeypatch.setattr(_backend, "OPEN_SCAN_KEYS_PER_JOB", 10**9, raising=False)
    monkeypatch.setattr(_timings, "OPEN_SCAN_FRESH_S", 0.0)
    backend = await make()
    live = await _won(backend, "job-3", SLOT)
    released = await _won(backend, "job-8", SLOT)
    await backend.release(released, "handed over")
    finished = await _won(backend, "job-5", SLOT)
    await backend.finish(finished, RunStatus.SUCCEEDED, None)
    jobs = [f"job-{n}" for n in range(1_200)]
    assert await _open(backend, jobs) == {live.run_id, released.run_id}
    sent = _sent_keys(backend)
    assert await _open(backend, jobs) == {live.run_id, released.run_id}
    assert sum(sent) == 4, f"{sum(sent)} keys named: two jobs have open attempts"
    later = await _won(backend, "job-1100", SLOT)  # opened since: the next pass finds it
    sent.clear()
    assert await _open(backend, jobs) == {live.run_id, released.run_id, later.run_id}
    assert sum(sent) == 6
    assert await _open(backend, jobs[:999]) == {live.run_id, released.run_id}
    assert sum(sent) == 6 + 2 * 999, "fewer jobs than OPEN_SCAN_MIN_JOBS: each job's index"


async def test_a_database_of_many_other_keys_is_not_scanned(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the database holds far more keys than the jobs have (other applications'), a SCAN
    # would visit them all: each job's index is read instead, and one answer serves a pass.
    from anarchon.backends.redis import _backend

    monkeypatch.setattr(_backend, "OPEN_SCAN_KEYS_PER_JOB", 0)  # any key is too many
    backend = await make()
    live = await _won(backend, "job-3", SLOT)
    jobs = [f"job-{n}" for n in range(1_200)]
    assert await _open(backend, jobs) == {live.run_id}
    sent = _sent_keys(backend)
    sizes: list[int] = []
    dbsize = backend._connection.dbsize

    async def counted() -> int:
        sizes.append(await dbsize())
        return sizes[-1]

    backend._connection.dbsize = counted  # type: ignore[method-assign]
    for _ in range(2):
        assert await _open(backend, jobs) == {live.run_id}
    assert sum(sent) == 2 * 2 * 1_200 and len(sizes) == 1, (sum(sent), sizes)
