"""anarchon.explain on the memory backend: every fate of a slot, from records made by claims."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from anarchon import MemoryBackend, RunStatus, Trigger, steering
from anarchon._times import LATEST_MS
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.control import retry_key
from anarchon.errors import InvalidOption, JobNotFound
from anarchon.explain import Fate, explain, nearest_slots
from anarchon.registry import InstanceRecord, JobDefinition
from anarchon.testing import FakeClock

MINUTE = 60_000
# No scheduler runs in these tests, only a backend: long waits move the clock a minute a step
# (at the default 100 ms a step, 200 minutes took 23 s and timed out on a loaded CI machine).
# 2027-01-15 08:00:00 UTC: a whole minute.
T0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE
DEF = JobDefinition(
    name="sync", expression="*/2 * * * *", zone="UTC", options={"jitter_ms": 0, "max_late_ms": 5000}
)


def _claim(slot: int, *, instance: str = "w0", **kw: object) -> ClaimRequest:
    fields: dict[str, object] = {
        "job": "sync",
        "slot": slot,
        "run_id": f"r{slot}-{kw.get('key', '')}",
        "token": f"t{slot}-{kw.get('key', '')}",
        "instance": instance,
        "trigger": Trigger.SCHEDULE,
        "lease_ms": 10_000,
    }
    fields.update(kw)
    return ClaimRequest(**fields)  # type: ignore[arg-type]


async def _setup() -> tuple[FakeClock, MemoryBackend]:
    clock = FakeClock(T0)
    backend = MemoryBackend(clock=clock)
    record = InstanceRecord(
        id="w0",
        host="h",
        pid=1,
        version="0",
        started_ms=T0,
        heartbeat_ms=T0,
        # Nothing refreshes the record while the clock moves hours on: beating hourly (the
        # longest heartbeat_ms), it stays live for six hours (anarchon.registry.is_live).
        interval_ms=3_600_000,
        clock_offset_ms=0,
        jobs=(DEF,),
    )
    await backend.registry().record(record)
    return clock, backend


async def test_a_slot_that_ran_lists_every_attempt_and_its_retry() -> None:
    clock, backend = await _setup()
    [won] = await backend.claim([_claim(T0)])
    assert won.ticket is not None
    await clock.advance(1500)
    await backend.finish(won.ticket, "failed", "ValueError: boom")
    await clock.advance(1000)
    retry = _claim(T0, instance="w1", trigger=Trigger.RETRY, key=retry_key(str(T0), 1))
    [again] = await backend.claim([retry])
    assert again.ticket is not None
    await clock.advance(200)
    await backend.finish(again.ticket, "succeeded", None)
    fate = await explain(backend, "sync", T0)
    assert fate.fate is Fate.RAN and fate.outcome is RunStatus.SUCCEEDED
    assert [(a.retry, a.instance, a.status) for a in fate.attempts] == [
        (0, "w0", RunStatus.FAILED),
        (1, "w1", RunStatus.SUCCEEDED),
    ]
    assert fate.attempts[0].took_ms == 1500 and fate.attempts[0].error == "ValueError: boom"
    text = fate.describe()
    assert "ran, succeeded" in text and "retry 1" in text and "ValueError: boom" in text
    data = json.loads(json.dumps(fate.to_dict()))
    assert data["fate"] == "ran" and data["outcome"] == "succeeded"
    assert data["attempts"][1]["trigger"] == "retry"


async def test_a_running_slot_and_a_datetime_slot() -> None:
    _, backend = await _setup()
    await backend.claim([_claim(T0)])
    fate = await explain(backend, "sync", datetime.fromtimestamp(T0 / 1000, UTC))
    assert fate.fate is Fate.RUNNING and fate.attempts[0].finished_ms is None
    assert "running now" in fate.describe()


@pytest.mark.parametrize(
    ("status", "fate"), [(RunStatus.SKIPPED, Fate.SKIPPED), (RunStatus.MISSED, Fate.MISSED)]
)
async def test_skipped_and_missed_slots_give_their_reason(status: RunStatus, fate: Fate) -> None:
    clock, backend = await _setup()
    reason = "no instance carried the job from 08:00 to 09:00"
    [out] = await backend.claim([_claim(T0, skip_reason=reason, skip_status=status)])
    assert out.status is ClaimStatus.SKIPPED
    await clock.advance(MINUTE * 5, step_ms=MINUTE)
    found = await explain(backend, "sync", T0)
    assert found.fate is fate and found.reason == reason
    assert reason in found.describe()


async def test_a_paused_slot_is_skipped_with_who_paused_it() -> None:
    _, backend = await _setup()
    await steering.pause(backend, "sync", by="alice@ops")
    await backend.claim([_claim(T0)])
    found = await explain(backend, "sync", T0)
    assert found.fate is Fate.SKIPPED and found.reason == "paused by alice@ops"


async def test_a_future_slot_names_its_carriers_and_a_pause_that_holds() -> None:
    _, backend = await _setup()
    future = T0 + 10 * MINUTE
    found = await explain(backend, "sync", future)
    assert found.fate is Fate.FUTURE and found.instances == ("w0",) and found.pause is None
    given = await explain(backend, "sync", future, definition=DEF)
    assert given.fate is Fate.FUTURE and given.instances == ("w0",)
    assert "10m from now" in found.describe()
    await steering.pause(backend, "sync", by="bob@ops")
    paused = await explain(backend, "sync", future)
    assert paused.pause is not None and "paused by bob@ops" in paused.describe()


async def test_not_a_slot_gives_the_nearest_slots() -> None:
    _, backend = await _setup()
    found = await explain(backend, "sync", T0 + MINUTE + 30_000)
    assert found.fate is Fate.NOT_A_SLOT
    assert (found.previous_slot_ms, found.next_slot_ms) == (T0, T0 + 2 * MINUTE)
    assert found.to_dict()["previous_slot_ms"] == T0


async def test_no_record_tells_pruned_from_nobody_claimed() -> None:
    clock, backend = await _setup()
    await clock.advance(30 * MINUTE, step_ms=MINUTE)
    nothing = await explain(backend, "sync", T0)
    assert nothing.fate is Fate.NO_RECORD and nothing.history_pruned is None
    [won] = await backend.claim([_claim(T0 + 10 * MINUTE)])
    assert won.ticket is not None
    await backend.finish(won.ticket, "succeeded", None)
    older = await explain(backend, "sync", T0)
    assert older.history_pruned is True and "pruned" in (older.reason or "")
    [won] = await backend.claim([_claim(T0 + 20 * MINUTE)])
    gap = await explain(backend, "sync", T0 + 14 * MINUTE)
    assert gap.history_pruned is False and "nobody claimed it" in (gap.reason or "")
    # The memory backend looks the slot up: the limit of a history read does not apply.
    beyond = await explain(backend, "sync", T0, limit=1)
    assert "larger limit" not in (beyond.reason or "") and beyond.history_pruned is True


class _NoLookup(MemoryBackend):
    """A backend that cannot look a slot up: explain reads the newest records instead."""

    async def slot_records(self, job: str, slot: int) -> None:  # type: ignore[override]
        return None


async def test_without_slot_lookups_explain_reads_the_newest_records() -> None:
    clock = FakeClock(T0)
    backend = _NoLookup(clock=clock)
    for n in range(3):
        [won] = await backend.claim([_claim(T0 + 2 * n * MINUTE)])
        assert won.ticket is not None
        await backend.finish(won.ticket, "succeeded", None)
        await clock.advance(2 * MINUTE, step_ms=MINUTE)
    await clock.advance(10 * MINUTE, step_ms=MINUTE)
    found = await explain(backend, "sync", T0 + 2 * MINUTE, definition=DEF)
    assert found.fate is Fate.RAN and found.records_read == 3
    beyond = await explain(backend, "sync", T0, definition=DEF, limit=2)
    assert beyond.fate is Fate.NO_RECORD and "larger limit" in (beyond.reason or "")
    assert beyond.records_read == 2 and beyond.oldest_record_ms == T0 + 2 * MINUTE


async def test_slot_records_finds_an_old_slot_among_many_records() -> None:
    clock, backend = await _setup()
    for n in range(50):
        [won] = await backend.claim([_claim(T0 + 2 * n * MINUTE)])
        assert won.ticket is not None
        await clock.advance(100)
        await backend.finish(won.ticket, "failed" if n == 1 else "succeeded", None)
    retry = _claim(T0 + 2 * MINUTE, trigger=Trigger.RETRY, key=retry_key(str(T0 + 2 * MINUTE), 1))
    [again] = await backend.claim([retry])
    assert again.ticket is not None
    found = await backend.slot_records("sync", T0 + 2 * MINUTE)
    assert found is not None and found.oldest_ms == T0
    assert [(r.trigger, r.status) for r in found.runs] == [
        (Trigger.SCHEDULE, RunStatus.FAILED),
        (Trigger.RETRY, RunStatus.RUNNING),
    ]
    assert await backend.slot_records("nobody", T0) == ([], None)
    await clock.advance(200 * MINUTE, step_ms=MINUTE)
    fate = await explain(backend, "sync", T0 + 2 * MINUTE, limit=1)
    assert fate.fate is Fate.RUNNING and fate.records_read == 2


async def test_a_slot_just_due_may_still_be_claimed() -> None:
    clock, backend = await _setup()
    await clock.advance(2000)
    found = await explain(backend, "sync", T0)
    assert found.fate is Fate.NO_RECORD and "may still claim it" in found.describe()


async def test_an_unknown_job_and_bad_slots_are_clear_errors() -> None:
    _, backend = await _setup()
    with pytest.raises(JobNotFound, match="'other' has no definition"):
        await explain(backend, "other", T0)
    other = JobDefinition(name="other", expression="0 * * * *", zone="UTC")
    assert (await explain(backend, "other", T0, definition=other)).fate is Fate.NO_RECORD
    with pytest.raises(InvalidOption, match="no time zone"):
        await explain(backend, "sync", datetime(2027, 1, 1))
    with pytest.raises(InvalidOption, match="limit=0"):
        await explain(backend, "sync", T0, limit=0)


def test_nearest_slots_of_a_yearly_schedule() -> None:
    from anarchon import CronSchedule

    schedule = CronSchedule("0 0 1 1 *", "Europe/Athens")
    moment = int(datetime(2030, 6, 1, tzinfo=UTC).timestamp() * 1000)
    before, after = nearest_slots(schedule, moment)
    assert before is not None and after is not None
    assert datetime.fromtimestamp(before / 1000, UTC) == datetime(2029, 12, 31, 22, tzinfo=UTC)
    assert datetime.fromtimestamp(after / 1000, UTC) == datetime(2030, 12, 31, 22, tzinfo=UTC)


async def test_times_out_of_range_are_refused_and_the_last_ones_explained() -> None:
    _, backend = await _setup()
    for slot, said in (
        (LATEST_MS + 1, f"slot={LATEST_MS + 1} is out of range: a time is from 1970"),
        (-1, "slot=-1 is out of range"),
        (datetime(9999, 6, 1, tzinfo=UTC), "slot='9999-06-01T00:00:00+00:00' is out of range"),
    ):
        with pytest.raises(InvalidOption, match=re.escape(said)):
            await explain(backend, "sync", slot)
    # A schedule whose slot after the last time is past the calendar: raised OverflowError.
    leap = JobDefinition(name="leap", expression="0 0 29 2 *", zone="Europe/Athens")
    last = await explain(backend, "leap", LATEST_MS, definition=leap)
    assert last.fate is Fate.NOT_A_SLOT and last.next_slot_ms is None, last
    assert "next slot:     none" in last.describe()
    assert last.previous_slot_ms == int(datetime(9996, 2, 28, 22, tzinfo=UTC).timestamp() * 1000)
    first = await explain(backend, "leap", 0, definition=leap)
    assert first.fate is Fate.NOT_A_SLOT and first.previous_slot_ms == -58_068_000_000  # 1968
