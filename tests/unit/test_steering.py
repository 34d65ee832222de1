"""anarchon.steering on the memory backend: pause, resume, trigger, and their errors."""

from __future__ import annotations

import re

import pytest

from anarchon import MemoryBackend, Trigger, steering
from anarchon._times import PAUSE_HORIZON_MS
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.control import ALL_JOBS, Pause, RunRequest
from anarchon.errors import InvalidJobName, InvalidOption, UnsupportedFeature
from anarchon.testing import FakeClock

NOW = 1_800_000_000_000


def _claim(job: str, slot: int) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=f"r{slot}",
        token=f"t{slot}",
        instance="i",
        trigger=Trigger.SCHEDULE,
        lease_ms=1000,
    )


async def test_pause_holds_claims_until_resumed_and_names_who_asked() -> None:
    backend = MemoryBackend(clock=FakeClock(NOW))
    stored = await steering.pause(backend, "job", by="alice@ops")
    assert stored.at_ms == NOW and stored.until_ms is None
    assert await steering.pauses(backend) == [stored]
    [held] = await backend.claim([_claim("job", NOW)])
    assert held.status is ClaimStatus.SKIPPED and held.run.reason == "paused by alice@ops"
    assert await steering.resume(backend, "job") == stored
    assert await steering.resume(backend, "job") is None
    [ran] = await backend.claim([_claim("job", NOW + 1000)])
    assert ran.status is ClaimStatus.WON


async def test_a_pause_with_an_end_expires_and_the_default_requester_is_user_at_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(NOW)
    backend = MemoryBackend(clock=clock)
    monkeypatch.setenv("ANARCHON_REQUESTER", "deploy-bot")
    stored = await steering.pause(backend, ALL_JOBS, until_ms=NOW + 60_000)
    assert stored.by == "deploy-bot"
    assert [p.job for p in await steering.pauses(backend)] == [ALL_JOBS]
    clock.step(60_000)
    assert await steering.pauses(backend) == []
    monkeypatch.delenv("ANARCHON_REQUESTER")
    assert "@" in steering.requester()


async def test_trigger_stores_one_manual_request() -> None:
    backend = MemoryBackend(clock=FakeClock(NOW))
    request = await steering.trigger(backend, "job", by="bob@ops")
    assert request.trigger is Trigger.MANUAL and request.key == f"manual-{request.id}"
    assert request.due_ms == NOW and request.requested_by == "bob@ops"
    assert await backend.control().requests(["job"]) == [request]


async def test_bad_input_is_refused_with_the_value_and_the_rule() -> None:
    backend = MemoryBackend(clock=FakeClock(NOW))
    with pytest.raises(InvalidOption, match=r"until=1799999999000 ms is not in the future"):
        await steering.pause(backend, "job", until_ms=NOW - 1000)
    with pytest.raises(InvalidJobName, match="no such"):
        await steering.trigger(backend, "no such")
    with pytest.raises(InvalidJobName):
        await steering.trigger(backend, ALL_JOBS)

    class NoControl(MemoryBackend):
        def control(self) -> None:  # type: ignore[override]
            return None

    with pytest.raises(UnsupportedFeature, match="keeps no pauses or run requests"):
        await steering.pause(NoControl(), "job")


def test_pauses_and_requests_read_back_what_a_store_keeps() -> None:
    pause = Pause(job="job", by="alice@ops", at_ms=NOW, until_ms=NOW + 1)
    assert Pause.from_dict(pause.to_dict()) == pause
    assert Pause.from_json(pause.to_json()) == pause
    assert Pause.from_dict({"job": "j", "by": "b", "at_ms": "5"}) == Pause(job="j", by="b", at_ms=5)
    request = RunRequest(
        id="a" * 32,
        job="job",
        trigger=Trigger.MANUAL,
        key="manual-" + "a" * 32,
        slot=None,
        due_ms=NOW,
        requested_by="bob@ops",
        requested_at_ms=NOW,
    )
    values = request.to_dict()
    assert type(values["trigger"]) is str
    assert RunRequest.from_dict(values) == request
    assert RunRequest.from_json(request.to_json()) == request
    del values["slot"], values["retry"]  # an optional field and one with a default
    assert RunRequest.from_dict(values) == request
    del values["due_ms"]
    with pytest.raises(KeyError, match="due_ms"):
        RunRequest.from_dict(values)


async def test_an_end_out_of_bounds_is_refused_before_anything_is_stored() -> None:
    backend = MemoryBackend(clock=FakeClock(NOW))
    for until, said in (
        (NOW * 1000, "(epoch microseconds? divide by 1,000 for milliseconds)"),
        (10**20, "is more than 10 years after the backend's clock"),
        (NOW + PAUSE_HORIZON_MS + 1, "a pause ends within 10 years"),
        (NOW // 1000 + 60, "(epoch seconds? multiply by 1000 for milliseconds)"),
    ):
        for job in ("job", ALL_JOBS):
            with pytest.raises(InvalidOption, match=re.escape(said)):
                await steering.pause(backend, job, until_ms=until)
    assert await backend.control().pauses() == []
    stored = await steering.pause(backend, "job", until_ms=NOW + PAUSE_HORIZON_MS)
    assert stored.until_ms == NOW + PAUSE_HORIZON_MS


async def test_resuming_a_pause_that_ended_by_itself_says_it_was_not_paused() -> None:
    clock = FakeClock(NOW)
    backend = MemoryBackend(clock=clock)
    await steering.pause(backend, "job", until_ms=NOW + 1000, by="alice@ops")
    everything = await steering.pause(backend, ALL_JOBS, until_ms=NOW + 1000, by="bob@ops")
    clock.step(2500)
    assert await steering.resume(backend, "job") is None  # returned the ended pause before
    assert await steering.pause(backend, "job", until_ms=NOW + 5000) is not None
    clock.step(1000)
    assert await steering.take_pause(backend, ALL_JOBS) == (everything, NOW + 3500)
    assert await steering.take_pause(backend, ALL_JOBS) == (None, NOW + 3500)
    assert await steering.resume(backend, "job") is not None  # still held: until NOW + 5000
    assert await backend.control().pauses() == []
