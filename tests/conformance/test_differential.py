"""The differential test: random sequences of contract calls against each lease backend and the
reference (MemoryBackend) side by side, failing on the first answer that differs.

Hypothesis's stateful testing drives claims (several instances and tokens, batches, retried
claims, skips, manual runs, overlap), renewals, results (alone and in batches, retried, late),
takeovers (retried with the same token, racing), hand-overs, history and last_slot reads, and
time passing, on two jobs: one pruned by count (history_size=3), one by age as well.

Time is the backends' own clock moved by a test-only offset (``_test_clock_offset_ms``: added to
SQLite's anchored clock, to PostgreSQL's ``clock_timestamp()`` through a session setting, to
Redis's ``TIME`` inside the scripts); the reference runs on a :class:`~anarchon.testing.FakeClock`
moved by the same amounts. Real time also passes during an example (milliseconds), so time moves
in steps of 10 s while leases (25 s, 45 s) and the TTL (95 s) are odd multiples of 5 s: no
decision ever sits within 5 s of a boundary, and both sides decide alike.

Answers are compared after normalising what legitimately differs: times (only whether they are
set), fences (their rank among the job's fences, which must rise on every backend) and tokens.

``make test`` runs 40 examples of up to 50 steps per backend (about 20 s in all);
``ANARCHON_DIFF_EXAMPLES`` and ``ANARCHON_DIFF_STEPS`` raise them, as ``make chaos`` does
(``ANARCHON_DIFF_EXAMPLES=2000``). A failure names the call and both answers; shrinking it to
a minimal sequence takes minutes, so it runs only with ``ANARCHON_DIFF_SHRINK=1``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from anarchon import BackendError, LeaseBackend, MemoryBackend, Overlap, Run, RunStatus, Trigger
from anarchon.backend import (
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from anarchon.testing import FakeClock
from tests.conformance.conftest import _load

EXAMPLES = int(os.environ.get("ANARCHON_DIFF_EXAMPLES", "40"))
STEPS = int(os.environ.get("ANARCHON_DIFF_STEPS", "50"))
HISTORY_SIZE = 3
JOBS = ("a", "b")  # "b" is also pruned by age
TTL_MS = {"a": None, "b": 95_000}
LEASES = (25_000, 45_000)
STEP_MS = (10_000, 20_000, 30_000, 60_000)
SLOTS = 5
PHASES = tuple(Phase) if os.environ.get("ANARCHON_DIFF_SHRINK") else (Phase.generate,)
T = TypeVar("T")


async def _make_backend(name: str, tmp_path: Path, extra: dict[str, Any]) -> LeaseBackend:
    backend: LeaseBackend
    if name == "sqlite":
        from anarchon import SQLiteBackend

        backend = SQLiteBackend(tmp_path / "anarchon.db", history_size=HISTORY_SIZE)
    elif name == "postgres":
        from anarchon.backends.postgres import PostgresBackend

        backend = PostgresBackend(
            str(extra["dsn"]), schema=str(extra["schema"]), history_size=HISTORY_SIZE
        )
    else:
        from anarchon.backends.redis import RedisBackend
        from tests.backends.redis import SERVER

        backend = RedisBackend(SERVER, prefix=str(extra["prefix"]), history_size=HISTORY_SIZE)
    await backend.start()
    return backend


@dataclass
class Side:
    """One backend under test, with what the machine knows of its answers."""

    backend: LeaseBackend
    fences: dict[str, dict[int, int]] = field(default_factory=dict)

    def rank(self, job: str, fence: int | None) -> object:
        if not fence:
            return None
        return self.fences.get(job, {}).get(fence, ("unseen fence", fence))

    def issued(self, ticket: Ticket) -> None:
        """A fence handed out: it must rise above every fence this job had before."""
        seen = self.fences.setdefault(ticket.job, {})
        fence = ticket.fence
        assert fence is not None
        if fence in seen:
            return  # the same ticket again (a retried claim or takeover)
        assert all(fence > f for f in seen), f"{ticket.job}: fence {fence} after {list(seen)}"
        seen[fence] = len(seen)


class Differential(RuleBasedStateMachine):
    """Calls on the reference and the backend alike; answers must agree."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx
        n = next(ctx.examples)
        self.jobs = {j: f"x{ctx.run}e{n}{j}" for j in JOBS}
        self.clock = FakeClock(start_ms=ctx.t0)
        self.ref = Side(MemoryBackend(clock=self.clock, history_size=HISTORY_SIZE))
        self.real = Side(ctx.backend)
        ctx.backend._test_clock_offset_ms = 0  # type: ignore[attr-defined]
        self.base_slot = ctx.t0 + 86_400_000  # a day ahead: within what Redis vouches for
        self.requests: list[ClaimRequest] = []
        self.takeovers: list[TakeoverRequest] = []
        self.tickets: list[tuple[Ticket, Ticket]] = []
        self.slot_keys: list[tuple[str, str]] = []
        self.ids = itertools.count()

    def run(self, aw: Callable[[LeaseBackend], Awaitable[T]]) -> tuple[T | Exception, ...]:
        async def both() -> tuple[T | Exception, ...]:
            out: list[T | Exception] = []
            for side in (self.ref, self.real):
                try:
                    out.append(await aw(side.backend))
                except BackendError as exc:
                    out.append(exc)
            return tuple(out)

        return self.ctx.runner.run(both())

    def same(self, what: str, ref: object, real: object) -> None:
        assert ref == real, (
            f"{self.ctx.name} answers {what} differently:\nreference {ref}\n{self.ctx.name} {real}"
        )

    # -- normalising -------------------------------------------------------------------------

    def run_of(self, side: Side, run: Run | None) -> object:
        if run is None:
            return None
        return (
            run.job,
            run.slot_ms,
            run.run_id,
            run.instance,
            run.trigger,
            run.attempt,
            run.status,
            run.error,
            run.reason,
            side.rank(run.job, run.fence),
            run.finished_at is not None,
        )

    def error_of(self, exc: Exception) -> object:
        return (type(exc).__name__, str(exc))

    def claim_of(self, side: Side, out: ClaimOutcome | Exception) -> object:
        if isinstance(out, Exception):
            return self.error_of(out)
        if out.ticket is not None:
            side.issued(out.ticket)
        return (
            out.status,
            self.run_of(side, out.run),
            out.ticket is not None and (out.ticket.attempt, out.ticket.token),
            out.lease_expires_at_ms is not None,
            out.error is not None,
        )

    def takeover_of(self, side: Side, out: TakeoverOutcome | Exception) -> object:
        if isinstance(out, Exception):
            return self.error_of(out)
        if out.ticket is not None:
            side.issued(out.ticket)
        return (
            out.status,
            self.run_of(side, out.run),
            out.ticket is not None and (out.ticket.attempt, out.ticket.token),
            out.lease_expires_at_ms is not None,
        )

    def result_of(self, side: Side, out: object) -> object:
        if isinstance(out, Exception):
            return self.error_of(out)
        if isinstance(out, Ticket):
            side.issued(out)
            return ("renewed", out.attempt, out.lease_expires_at_ms is not None)
        if isinstance(out, Run):
            return self.run_of(side, out)
        return out

    # -- rules -------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.ctx.runner.run(self.ref.backend.start())

    @rule(
        specs=st.lists(
            st.tuples(
                st.sampled_from(JOBS),
                st.one_of(st.none(), st.integers(0, SLOTS - 1)),  # None: a manual run
                st.integers(0, 2),  # instance
                st.sampled_from(Overlap),
                st.sampled_from(LEASES),
                st.booleans(),  # a skip reason (too late)
                st.one_of(st.none(), st.integers(0, 10_000)),  # retry an earlier request
            ),
            min_size=1,
            max_size=3,
        )
    )
    def claim(self, specs: list[tuple[Any, ...]]) -> None:
        batch: list[ClaimRequest] = []
        for job, slot, instance, overlap, lease_ms, skip, retry in specs:
            if retry is not None and self.requests:
                batch.append(self.requests[retry % len(self.requests)])
                continue
            n = next(self.ids)
            run_id = f"r{n}"
            req = ClaimRequest(
                job=self.jobs[job],
                slot=None if slot is None else self.base_slot + slot * 60_000,
                run_id=run_id,
                token=f"t{n}",
                instance=f"i{instance}",
                trigger=Trigger.MANUAL if slot is None else Trigger.SCHEDULE,
                lease_ms=lease_ms,
                overlap=overlap,
                history_ttl_ms=TTL_MS[job],
                skip_reason="too late: a test" if skip else None,
            )
            self.requests.append(req)
            if (req.job, req.slot_key) not in self.slot_keys:
                self.slot_keys.append((req.job, req.slot_key))
            batch.append(req)
        ref, real = self.run(lambda b: b.claim(batch))
        assert not isinstance(ref, Exception), ref
        if isinstance(real, Exception):
            self.same("a claim", ref, self.error_of(real))
        for n, (mine, theirs) in enumerate(zip(ref, real, strict=True)):  # type: ignore[arg-type]
            self.same(
                f"claim {n} of {batch}",
                self.claim_of(self.ref, mine),
                self.claim_of(self.real, theirs),
            )
            if mine.ticket is not None and theirs.ticket is not None:
                self.tickets.append((mine.ticket, theirs.ticket))

    @rule(
        pick=st.integers(0, 10_000),
        instance=st.integers(0, 2),
        max_attempts=st.integers(1, 3),
        lease_ms=st.sampled_from(LEASES),
        retry=st.one_of(st.none(), st.integers(0, 10_000)),
    )
    def take_over(
        self, pick: int, instance: int, max_attempts: int, lease_ms: int, retry: int | None
    ) -> None:
        if not self.slot_keys:
            return
        if retry is not None and self.takeovers:
            req = self.takeovers[retry % len(self.takeovers)]
        else:
            job, slot_key = self.slot_keys[pick % len(self.slot_keys)]
            n = next(self.ids)
            req = TakeoverRequest(
                job=job,
                slot_key=slot_key,
                run_id=f"b{n}",
                token=f"bt{n}",
                instance=f"b{instance}",
                lease_ms=lease_ms,
                max_attempts=max_attempts,
                history_ttl_ms=TTL_MS[job[-1]],
            )
            self.takeovers.append(req)
        ref, real = self.run(lambda b: b.take_over(req))
        self.same(
            f"take_over {req}", self.takeover_of(self.ref, ref), self.takeover_of(self.real, real)
        )
        if (
            isinstance(ref, TakeoverOutcome)
            and isinstance(real, TakeoverOutcome)
            and ref.ticket is not None
            and real.ticket is not None
        ):
            self.tickets.append((ref.ticket, real.ticket))

    @rule(pick=st.integers(0, 10_000))
    def renew(self, pick: int) -> None:
        if not self.tickets:
            return
        mine, theirs = self.tickets[pick % len(self.tickets)]
        ref, real = self.run(lambda b: b.renew(mine if b is self.ref.backend else theirs))
        self.same(f"renew {mine}", self.result_of(self.ref, ref), self.result_of(self.real, real))

    @rule(pick=st.integers(0, 10_000))
    def release(self, pick: int) -> None:
        if not self.tickets:
            return
        mine, theirs = self.tickets[pick % len(self.tickets)]
        which = {id(self.ref.backend): mine, id(self.real.backend): theirs}
        ref, real = self.run(lambda b: b.release(which[id(b)], "handed over"))
        self.same(f"release {mine}", self.result_of(self.ref, ref), self.result_of(self.real, real))

    @rule(
        picks=st.lists(
            st.tuples(
                st.integers(0, 10_000),
                st.sampled_from([RunStatus.SUCCEEDED, RunStatus.FAILED]),
                st.sampled_from([None, "boom"]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def finish(self, picks: list[tuple[int, RunStatus, str | None]]) -> None:
        if not self.tickets:
            return
        chosen = [(self.tickets[p % len(self.tickets)], s, e) for p, s, e in picks]
        ref_items = [FinishRequest(pair[0], s, e) for pair, s, e in chosen]
        real_items = [FinishRequest(pair[1], s, e) for pair, s, e in chosen]
        if len(chosen) == 1:
            one, other = self.run(
                lambda b: b.finish(*(ref_items if b is self.ref.backend else real_items)[0])
            )
            self.same(
                f"finish {ref_items}",
                self.result_of(self.ref, one),
                self.result_of(self.real, other),
            )
            return
        ref, real = self.run(
            lambda b: b.finish_many(ref_items if b is self.ref.backend else real_items)
        )
        assert isinstance(ref, list) and isinstance(real, list), (ref, real)
        for mine, theirs in zip(ref, real, strict=True):
            self.same(
                f"finish_many {ref_items}",
                self.result_of(self.ref, mine),
                self.result_of(self.real, theirs),
            )

    @rule(ms=st.sampled_from(STEP_MS))
    def time_passes(self, ms: int) -> None:
        self.ctx.runner.run(self.clock.advance(ms, step_ms=ms))
        self.ctx.backend._test_clock_offset_ms += ms  # type: ignore[attr-defined]

    @invariant()
    def reads_agree(self) -> None:
        """After every step: each job's history (newest first, whole and its newest entry)
        and last_slot agree."""
        for job in JOBS:
            for limit in (100, 1):
                ref, real = self.run(lambda b, j=job, n=limit: b.history(self.jobs[j], n))  # type: ignore[misc]
                assert not isinstance(ref, Exception) and not isinstance(real, Exception)
                self.same(
                    f"history({job}, {limit})",
                    [self.run_of(self.ref, r) for r in ref],
                    [self.run_of(self.real, r) for r in real],
                )
        names = [*self.jobs.values(), "nobody"]
        ref, real = self.run(lambda b: b.last_slots(names))
        self.same("last_slots", ref, real)
        ref, real = self.run(lambda b: b.last_slot(self.jobs["b"]))
        self.same("last_slot", ref, real)


@dataclass
class Context:
    name: str
    runner: asyncio.Runner
    backend: LeaseBackend
    t0: int
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    examples: itertools.count[int] = field(default_factory=itertools.count)


@pytest.mark.timeout(max(120, EXAMPLES * STEPS // 20))
@pytest.mark.parametrize("name", ["sqlite", "postgres", "redis"])
def test_answers_agree_with_the_reference(name: str, tmp_path: Path) -> None:
    harness = _load(name)
    with asyncio.Runner() as runner:
        namespace = harness.namespace(tmp_path)
        ns = runner.run(namespace.__aenter__())
        try:
            backend = runner.run(_make_backend(name, tmp_path, ns.extra))
            now = runner.run(backend.server_time_ms())
            assert now is not None
            ctx = Context(name, runner, backend, t0=now - now % 60_000)
            try:
                run_state_machine_as_test(
                    lambda: Differential(ctx),  # type: ignore[arg-type]
                    settings=settings(
                        max_examples=EXAMPLES,
                        stateful_step_count=STEPS,
                        deadline=None,
                        database=None,
                        phases=PHASES,
                        print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow],
                    ),
                )
            finally:
                runner.run(backend.stop())
        finally:
            runner.run(namespace.__aexit__(None, None, None))
