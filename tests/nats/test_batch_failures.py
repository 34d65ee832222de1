"""A batch of claims that fails part-way, and claims of slots another instance was heard winning.

A claim() call of up to 2 000 requests raised the first BackendUnavailable of its batch and threw
away the answers it had already decided. The scheduler retried the batch with the same tokens,
so each decided claim was published again (a duplicate, read back); and when it gave up first
(the slot too late) or stopped, a claim stored as won had no runner and, its publish having been
answered, was never settled: history showed it ``running`` for good (34 255 such records in one
run of 3 x 5 000 every-second jobs). Now the decided answers are kept for the retry, and a kept
win the scheduler never takes is closed ``skipped``.

A batch also announced its wins only once all of it was answered, and claimed slots whose wins
had been announced meanwhile: at that burst size the rank delays held nobody back and every
instance published every slot. Now a batch announces its wins as they are decided, and a claim
of a slot another instance was heard winning is answered lost without being published.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import BackendUnavailable, RunStatus, Scheduler
from anarchon.backend import ClaimNotice, ClaimRequest, ClaimStatus
from anarchon.backends.nats import NatsBackend
from tests.nats.servers import NatsServer, unique_names
from tests.records import claim_request

SLOT = 1_800_000_000_000
Make = Callable[..., Any]


def request(job: str, slot: int = SLOT, instance: str = "i1") -> ClaimRequest:
    return claim_request(job, slot, instance)


async def _noop(ctx: Any) -> None:
    pass


async def _closed_at_stop(reader: NatsBackend, jobs: int) -> None:
    """Jobs j0 to j<jobs - 1> each have one run, closed skipped when its backend stopped."""
    for n in range(jobs):
        [run] = await reader.history(f"j{n}")
        assert run.status is RunStatus.SKIPPED, run
        assert (run.reason or "").endswith("before it stopped"), run


class HalfDown:
    """The backend's publishes, failing (disconnected: nothing sent) for the jobs in ``down``;
    every claim id published is in ``sent``."""

    def __init__(self, backend: NatsBackend, down: set[str]) -> None:
        self.down = down
        self.sent: list[str] = []
        self._publish = backend._conn.publish
        backend._conn.publish = self  # type: ignore[method-assign,assignment]

    async def __call__(self, subject: str, payload: bytes, msg_id: str | None, wait: float) -> Any:
        import nats.errors

        if msg_id is not None:
            self.sent.append(msg_id)
            if msg_id.split(":")[0] in self.down:
                raise nats.errors.OutboundBufferLimitError
        return await self._publish(subject, payload, msg_id, wait)


def _failing_batch(backend: NatsBackend, slot: int) -> tuple[list[ClaimRequest], HalfDown]:
    """Ten claims, the last five of which cannot be published."""
    requests = [request(f"j{n}", slot) for n in range(10)]
    return requests, HalfDown(backend, {f"j{n}" for n in range(5, 10)})


async def _failed(make: Make, monkeypatch: pytest.MonkeyPatch) -> tuple[NatsBackend, Any, Any]:
    """A backend whose claim() of :func:`_failing_batch` (at SLOT) just failed."""
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 0.5)
    backend: NatsBackend = await make()
    requests, publishes = _failing_batch(backend, SLOT)
    with pytest.raises(BackendUnavailable):
        await backend.claim(requests)
    return backend, requests, publishes


async def test_the_retry_of_a_failed_batch_gets_the_answers_it_decided(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, requests, publishes = await _failed(make, monkeypatch)
    publishes.down.clear()
    publishes.sent.clear()
    outcomes = await backend.claim(requests)  # the scheduler's retry: the same tokens
    assert [o.status for o in outcomes] == [ClaimStatus.WON] * 10
    assert [o.run.run_id for o in outcomes] == [r.run_id for r in requests]
    assert len({o.ticket.fence for o in outcomes if o.ticket is not None}) == 10
    # The five decided wins came back without being published again.
    assert sorted(publishes.sent) == [f"j{n}:{SLOT}" for n in range(5, 10)]


async def test_wins_of_a_failed_batch_the_scheduler_gives_up_on_are_closed_skipped(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anarchon.backends.nats import _timings

    monkeypatch.setattr(_timings, "SETTLE_EVERY_S", 0.1)
    monkeypatch.setattr(_timings, "CLAIM_MARGIN_MS", 0)  # settled once max_late_ms is over
    monkeypatch.setattr(_timings, "CLAIM_RETRY_S", 0.5)
    backend: NatsBackend = await make()
    scheduler = Scheduler(backend)
    for n in range(10):
        scheduler.add(f"j{n}", "* * * * *", _noop, jitter_ms=0, max_late_ms=1_000)
    requests, _ = _failing_batch(backend, int(time.time() * 1000) - 200)
    with pytest.raises(BackendUnavailable):
        await backend.claim(requests)
    # The scheduler never asks again: the slots became too late.
    runs: dict[str, list[Any]] = {}
    for _ in range(100):
        runs = {f"j{n}": await backend.history(f"j{n}") for n in range(10)}
        if all(r and r[0].status is not RunStatus.RUNNING for r in list(runs.values())[:5]):
            break
        await asyncio.sleep(0.1)
    for n in range(5):
        [run] = runs[f"j{n}"]
        assert run.status is RunStatus.SKIPPED, run
        assert run.run_id == requests[n].run_id and run.fence is not None
        assert (run.reason or "").startswith("not run: i1 won the claim in a batch that failed")
    assert all(runs[f"j{n}"] == [] for n in range(5, 10)), runs  # never stored


async def test_wins_of_a_failed_batch_are_closed_skipped_when_the_backend_stops(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _, _ = await _failed(make, monkeypatch)
    await backend.stop()  # the scheduler stopped instead of retrying
    await _closed_at_stop(await make(), 5)


async def test_a_batch_cancelled_with_claims_in_flight_leaves_none_running(make: Make) -> None:
    """The scheduler stopping cancels the claims it still waits for. Claims already published
    were stored; their answers were forgotten with the call, so nobody ran them and history
    showed them ``running``. Now the call lets them be answered first, and the wins are closed
    when the backend stops."""
    backend: NatsBackend = await make()
    publish = backend._conn.publish

    async def stored_then_answered_late(*args: Any) -> Any:
        ack = await publish(*args)
        await asyncio.sleep(0.5)
        return ack

    backend._conn.publish = stored_then_answered_late  # type: ignore[method-assign,assignment]
    call = asyncio.ensure_future(backend.claim([request(f"j{n}") for n in range(20)]))
    await asyncio.sleep(0.2)
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    await backend.stop()
    await _closed_at_stop(await make(), 20)


async def test_a_slot_heard_won_by_another_instance_is_not_published(make: Make) -> None:
    winner: NatsBackend = await make()
    other: NatsBackend = await make()
    heard: list[ClaimNotice] = []
    all_heard = asyncio.Event()

    def listen(notices: Any) -> None:
        heard.extend(notices)
        if len(heard) >= 50:
            all_heard.set()

    await other.subscribe_claims(listen)
    await winner.claim([request(f"j{n}", instance="a") for n in range(50)])
    await asyncio.wait_for(all_heard.wait(), 10)
    publishes = HalfDown(other, set())
    outcomes = await other.claim([request(f"j{n}", instance="b") for n in range(50)])
    assert {(o.status, o.run.instance) for o in outcomes} == {(ClaimStatus.LOST, "a")}
    [single] = await other.claim([request("j0", instance="b")])
    assert (single.status, single.run.instance) == (ClaimStatus.LOST, "a")
    assert publishes.sent == []
    # A slot nobody was heard winning is still claimed.
    [fresh] = await other.claim([request("j0", SLOT + 1000, instance="b")])
    assert fresh.status is ClaimStatus.WON and publishes.sent == [f"j0:{SLOT + 1000}"]


async def test_a_batch_announces_its_wins_while_it_goes_on(make: Make) -> None:
    """The other instances' backup claims of the same slots, a rank delay later, hear of the
    wins of a long batch before it ends."""
    winner: NatsBackend = await make()
    other: NatsBackend = await make()
    first_heard: list[float] = []

    def listen(notices: Any) -> None:
        if not first_heard:
            first_heard.append(time.monotonic())

    await other.subscribe_claims(listen)
    winner._conn.in_flight = asyncio.Semaphore(2)
    publish = winner._conn.publish

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.02)
        return await publish(*args)

    winner._conn.publish = slow  # type: ignore[method-assign,assignment]
    outcomes = await winner.claim([request(f"j{n}", instance="a") for n in range(100)])
    ended = time.monotonic()
    assert {o.status for o in outcomes} == {ClaimStatus.WON}
    await asyncio.sleep(0.5)
    assert first_heard and first_heard[0] < ended - 0.5, (first_heard, ended)


@pytest.mark.parametrize("version", ["2.9"])
async def test_stop_ends_promptly_with_thousands_of_claims_waiting(
    private_server: Callable[..., NatsServer],
) -> None:
    """A stalled server (SIGSTOP) and ten batches of 2 000 claims waiting: stop() returns, and
    every claim() call ends, within seconds."""
    server = private_server()
    stream, prefix = unique_names()
    backend = NatsBackend(server.url, stream=stream, prefix=prefix)
    await backend.start()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        calls = [
            asyncio.ensure_future(
                backend.claim([request(f"j{n}", SLOT + k * 1000) for n in range(2_000)])
            )
            for k in range(10)
        ]
        await asyncio.sleep(1.0)
        began = time.monotonic()
        await asyncio.wait_for(backend.stop(), 30)
        stopped = time.monotonic() - began
        done, pending = await asyncio.wait(calls, timeout=30)
        ended = time.monotonic() - began
    finally:
        os.kill(server.pid, signal.SIGCONT)
    for call in pending:
        call.cancel()
    assert not pending, f"{len(pending)} claim() calls still going {ended:.1f} s after stop()"
    assert all(c.exception() is not None for c in done)
    assert stopped < 8 and ended < 8, (stopped, ended)
