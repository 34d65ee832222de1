"""PostgreSQL's claim notices: many won claims of one statement are split over notifications
under NOTIFY's 8000-byte limit, and a second backend on the schema hears every one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from anarchon.backend import ClaimNotice, ClaimRequest, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.kit import RunStatus
from tests.records import claim_request

SLOT = 1_800_000_000_000


async def _listening(claimer: PostgresBackend, listener: PostgresBackend) -> list[ClaimNotice]:
    """Start both; the list ``listener`` puts the claim notices it hears in."""
    await claimer.start()
    await listener.start()
    heard: list[ClaimNotice] = []
    assert await listener.subscribe_claims(heard.extend)
    return heard


async def test_a_large_batch_is_announced_in_notifications_under_the_limit(
    make: Callable[..., PostgresBackend],
) -> None:
    claimer, listener = make(), make()
    heard = await _listening(claimer, listener)
    # 300 claims with long names: about 60 kB of notices, so several notifications.
    reqs = [
        claim_request(f"job-{n:03d}-{'x' * 100}", SLOT, f"instance-{'y' * 50}") for n in range(300)
    ]
    outcomes = await claimer.claim(reqs)
    assert all(o.status is ClaimStatus.WON for o in outcomes)
    for _ in range(500):  # up to 10 s, generous: the listener polls nothing, NOTIFY pushes
        if len(heard) >= len(reqs):
            break
        await asyncio.sleep(0.02)
    assert sorted(n.job for n in heard) == sorted(r.job for r in reqs)
    expiry = {o.run.job: o.ticket.lease_expires_at_ms for o in outcomes if o.ticket}
    assert all(n.lease_expires_at_ms == expiry[n.job] for n in heard)


def _request(job: str, instance: str = "claimer") -> ClaimRequest:
    return claim_request(job, SLOT, instance)


async def _heard_within(heard: list[ClaimNotice], count: int) -> None:
    for _ in range(500):  # up to 10 s, generous
        if len(heard) >= count:
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("notifications", [True, False])
async def test_claims_and_results_are_announced_with_notifications_on_or_off(
    make: Callable[..., PostgresBackend], notifications: bool
) -> None:
    # On: kept in the transaction and sent right after its COMMIT (send_notices). Off: sent at
    # commit by the claim's own transaction (PgBouncer's transaction mode keeps no session).
    claimer, listener = make(notifications=notifications), make()
    heard = await _listening(claimer, listener)
    changes: list[tuple[str, str, bool]] = []
    await listener.subscribe(lambda job, key, released: changes.append((job, key, released)))
    [won] = await claimer.claim([_request("a")])
    assert won.ticket is not None
    await _heard_within(heard, 1)
    assert [(n.job, n.instance) for n in heard] == [("a", "claimer")]
    await claimer.finish(won.ticket, RunStatus.SUCCEEDED, None)
    for _ in range(500):
        if changes:
            break
        await asyncio.sleep(0.02)
    assert changes == [("a", str(SLOT), False)]
    # A claim that wins nothing sends nothing, not even what an earlier statement kept.
    [lost] = await claimer.claim([_request("a", "other")])
    assert lost.ticket is None
    [again] = await claimer.claim([_request("b")])
    assert again.ticket is not None
    await _heard_within(heard, 2)
    await asyncio.sleep(0.2)
    assert [(n.job, n.instance) for n in heard] == [("a", "claimer"), ("b", "claimer")]
    assert changes == [("a", str(SLOT), False)]


async def test_notices_kept_for_after_commit_are_forgotten_once_sent(
    make: Callable[..., PostgresBackend],
) -> None:
    backend = make(max_connections=1)
    await backend.start()
    [won] = await backend.claim([_request("a")])
    assert won.ticket is not None
    await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    [row] = await backend._db.read(b"SELECT current_setting('anarchon.notices', true) AS kept")
    assert row["kept"] == "[]"


async def test_a_one_request_claim_keeps_no_notice_and_its_notice_is_the_won_run(
    make: Callable[..., PostgresBackend],
) -> None:
    # With notifications on, a claim of one request keeps nothing in the session (claim_one
    # sends "later" NULL); the backend sends the winner's notice itself (notify_claim), built
    # from the answer: the run's job, slot key, instance and lease expiry, as the server wrote
    # them. A lost claim sends nothing.
    claimer, listener = make(max_connections=1), make()
    heard = await _listening(claimer, listener)
    [won] = await claimer.claim([_request("a")])
    assert won.ticket is not None and won.run is not None
    [row] = await claimer._db.read(b"SELECT current_setting('anarchon.notices', true) AS kept")
    assert row["kept"] in (None, "", "[]")
    await _heard_within(heard, 1)
    expires = won.ticket.lease_expires_at_ms
    assert heard == [ClaimNotice("a", str(SLOT), "claimer", expires)]
    [lost] = await claimer.claim([_request("a", "other")])
    assert lost.ticket is None
    await asyncio.sleep(0.2)
    assert len(heard) == 1


async def test_the_listeners_listen_record_has_its_action(
    make: Callable[..., PostgresBackend], caplog: pytest.LogCaptureFixture
) -> None:
    # docs/logging.md: every record about a decision carries an action; the DEBUG "listening
    # on ..." record had none.
    listener = make()
    await listener.start()
    with caplog.at_level(logging.DEBUG, logger="anarchon.backends.postgres"):
        assert await listener.subscribe_claims(lambda notices: None)
        for _ in range(500):  # up to 10 s
            if any(r.getMessage().startswith("listening on") for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    [record] = [r for r in caplog.records if r.getMessage().startswith("listening on")]
    assert record.action == "listen"  # type: ignore[attr-defined]
    assert record.channel  # type: ignore[attr-defined]


async def test_a_quiet_listener_does_not_wake_the_loop_ten_times_a_second(
    make: Callable[..., PostgresBackend],
) -> None:
    # Waiting for notifications through psycopg's notifies(timeout=...) woke the event loop
    # every 0.1 s (its polling interval), each time registering and unregistering the socket:
    # most of what an idle instance on PostgreSQL did. The listener now waits for the socket
    # to be readable, and a notification still comes at once.
    claimer, listener = make(), make()
    heard = await _listening(claimer, listener)
    await asyncio.sleep(0.5)  # LISTEN done
    loop = asyncio.get_running_loop()
    selector = loop._selector  # type: ignore[attr-defined]
    select, wakeups = selector.select, [0]

    def counted(timeout: float | None = None) -> object:
        wakeups[0] += 1
        return select(timeout)

    selector.select = counted
    try:
        await asyncio.sleep(2.0)
    finally:
        selector.select = select
    assert wakeups[0] <= 8, f"{wakeups[0]} wake-ups of a quiet loop in 2 s"
    [outcome] = await claimer.claim([_request("job")])
    assert outcome.status is ClaimStatus.WON
    await _heard_within(heard, 1)
    assert [n.job for n in heard] == ["job"]
