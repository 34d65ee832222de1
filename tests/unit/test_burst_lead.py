"""Slots due at their very time are handed over before it, the sooner the more of them share the
instant (the timer's ``lead_ms``): a burst's claims are built, and its jobs' next slots found,
while the clock runs out, and the claims still reach the backend at the slot, not before."""

from __future__ import annotations

from typing import Any

import pytest

from anarchon import RunContext, Scheduler
from anarchon._timer import LEAD_MS, PREPARE_MAX_MS, PREPARE_US, SlotTimer
from anarchon.backend import ClaimRequest
from anarchon.testing import FakeClock
from tests.unit.core_helpers import MINUTE, START, BackendClock, Recording, on_another_host

JOBS = 2_500
SLOT = START + 60 * MINUTE
LEAD = LEAD_MS + JOBS * PREPARE_US // 1_000


async def _work(ctx: RunContext) -> None:
    pass


def _burst(backend: Recording, clock: FakeClock) -> Scheduler:
    scheduler = Scheduler(backend, clock=clock, instance_id="i0")
    for n in range(JOBS):
        scheduler.add(f"j{n}", "0 * * * *", _work, jitter_ms=0, catch_up="none")
    return scheduler


def test_the_lead_grows_with_the_slots_of_an_instant_up_to_its_cap() -> None:
    timer = SlotTimer(FakeClock(START), lambda batch: None)
    timer.push("alone", SLOT, SLOT, 0)
    timer.push("jittered", SLOT, SLOT + 700, 0)  # not due at its slot: no lead of its own
    assert timer.lead_ms(SLOT) == LEAD_MS and timer.lead_ms(SLOT + 700) == LEAD_MS
    timer.push_many((f"j{n}", SLOT, SLOT, 0) for n in range(JOBS - 1))
    assert timer.lead_ms(SLOT) == LEAD
    many = PREPARE_MAX_MS * 1_000 // PREPARE_US + 1
    timer.push_many((f"k{n}", SLOT + 1_000, SLOT + 1_000, 0) for n in range(many))
    assert timer.lead_ms(SLOT + 1_000) == LEAD_MS + PREPARE_MAX_MS


# The timer last looks at the heap this long before the slot (it looks at least once a second):
# a second before, or less than a second and its lead (then it must not sleep a whole second).
@pytest.mark.parametrize("looked_ms", [1_000, 1_000 + LEAD // 2])
async def test_a_burst_is_built_its_lead_before_the_slot_and_claimed_at_it(
    monkeypatch: pytest.MonkeyPatch, looked_ms: int
) -> None:
    clock = FakeClock(START)
    backend = Recording(clock)
    scheduler = _burst(backend, clock)
    built: list[int] = []
    build = scheduler._services.claims.request

    def request(*args: Any, **kwargs: Any) -> ClaimRequest:
        built.append(clock.now_ms())
        return build(*args, **kwargs)

    monkeypatch.setattr(scheduler._services.claims, "request", request)
    assert LEAD >= 3 * LEAD_MS
    async with scheduler:
        await clock.advance(60 * MINUTE - looked_ms, step_ms=MINUTE)
        await clock.advance(looked_ms + 200, step_ms=1)
        assert set(built) == {SLOT - LEAD} and len(built) == JOBS
        claims = backend.named("claim")
        assert {at for _, at, _ in claims} == {SLOT}
        assert sum(len(requests) for _, _, requests in claims) == JOBS
        assert scheduler.metrics()["runs_succeeded"] == JOBS
        # The counts behind the lead follow the heap: only the next instant's are left.
        assert scheduler._services.firing.timer._instants == {SLOT + 60 * MINUTE: JOBS}


class _Behind(BackendClock):
    """The backend's clock, ``behind_ms`` behind this host's."""

    def __init__(self, clock: FakeClock, behind_ms: int) -> None:
        super().__init__(clock)
        self.behind_ms = behind_ms

    def now_ms(self) -> int:
        return super().now_ms() - self.behind_ms


async def test_a_burst_handed_over_early_is_judged_early_or_not_at_its_slot() -> None:
    # 990 ms behind: at the slot the backend is within the 1 s a claim may be early by, but
    # not yet when the burst is handed over, its lead before. The claims go out at the slot,
    # so that is when they are judged: none is put off. (Started a little after START: the
    # slot at START is still 990 ms ahead by the backend's clock, so it would be fired too.)
    clock = FakeClock(START + 5_000)
    backend = on_another_host(Recording(_Behind(clock, 990)))
    scheduler = _burst(backend, clock)
    async with scheduler:
        await clock.advance(60 * MINUTE - 6_000, step_ms=MINUTE)
        await clock.advance(1_200, step_ms=1)
        metrics = scheduler.metrics()
    assert not metrics["early_slots_deferred"]
    assert metrics["runs_succeeded"] == JOBS
    assert {at for _, at, _ in backend.named("claim")} == {SLOT - 990}
