"""A scheduler carries its jobs from its start on the backend's clock (measured before its timer
starts), at start and for a job added while it runs: one whose clock is behind claims no slot
from before that start, one whose clock is ahead passes over none between the backend's time and
its own (see tests/conformance/test_skewed_start.py for real processes)."""

from __future__ import annotations

from anarchon import RunContext, Scheduler
from anarchon.testing import FakeClock
from tests.unit.core_helpers import START, BackendClock, Recording, on_another_host

SECOND = 1_000


class _Off(BackendClock):
    """The backend's clock, ``off_ms`` ahead of this host's (negative: behind)."""

    def __init__(self, clock: FakeClock, off_ms: int) -> None:
        super().__init__(clock)
        self.off_ms = off_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.off_ms


async def _work(ctx: RunContext) -> None:
    pass


def _claims(backend: Recording) -> list[tuple[str, int, int]]:
    """(job, slot, backend time of the claim) of every claim of a slot."""
    calls = backend.named("claim")
    return [(r.job, r.slot, at) for _, at, rs in calls for r in rs if r.slot is not None]


async def test_a_clock_behind_claims_no_slot_before_its_start_nor_before_an_add() -> None:
    clock = FakeClock(START + 30 * SECOND)
    backend = on_another_host(Recording(_Off(clock, 40 * SECOND)))  # this host 40 s behind
    scheduler = Scheduler(backend, clock=clock, instance_id="i0")
    scheduler.add("tick", "*/10 * * * * *", _work, jitter_ms=0, catch_up="none")
    async with scheduler:
        started = backend._now()
        await clock.advance(20 * SECOND)
        scheduler.add("late", "*/10 * * * * *", _work, jitter_ms=0, catch_up="none")
        added = backend._now()
        await clock.advance(60 * SECOND)
    claims = _claims(backend)
    assert [c for c in claims if c[0] == "tick" and c[1] <= started] == [], claims
    assert [c for c in claims if c[0] == "late" and c[1] <= added] == [], claims
    assert {c[0] for c in claims} == {"tick", "late"}, claims


async def test_a_clock_ahead_claims_every_slot_from_the_backends_time_none_early() -> None:
    clock = FakeClock(START + 35 * SECOND)
    backend = on_another_host(Recording(_Off(clock, -30 * SECOND)))  # this host 30 s ahead
    scheduler = Scheduler(backend, clock=clock, instance_id="i0")
    scheduler.add("tick", "*/10 * * * * *", _work, jitter_ms=0, catch_up="none")
    async with scheduler:
        await clock.advance(60 * SECOND)
    claims = _claims(backend)
    slots = sorted(slot for _, slot, _ in claims)
    assert slots[:3] == [START + 10 * SECOND, START + 20 * SECOND, START + 30 * SECOND], claims
    assert all(at >= slot - SECOND for _, slot, at in claims), claims
