"""PostgreSQL's claim notices: many won claims of one statement are split over notifications
under NOTIFY's 8000-byte limit, and a second backend on the schema hears every one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

from anarchon.backend import ClaimNotice, ClaimRequest, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.kit import Trigger

SLOT = 1_800_000_000_000


async def test_a_large_batch_is_announced_in_notifications_under_the_limit(
    make: Callable[..., PostgresBackend],
) -> None:
    claimer, listener = make(), make()
    await claimer.start()
    await listener.start()
    heard: list[ClaimNotice] = []

    def on_claims(notices: Sequence[ClaimNotice]) -> None:
        heard.extend(notices)

    assert await listener.subscribe_claims(on_claims)
    # 300 claims with long names: about 60 kB of notices, so several notifications.
    reqs = [
        ClaimRequest(
            job=f"job-{n:03d}-{'x' * 100}",
            slot=SLOT,
            run_id=uuid.uuid4().hex,
            token=uuid.uuid4().hex,
            instance=f"instance-{'y' * 50}",
            trigger=Trigger.SCHEDULE,
            lease_ms=5_000,
        )
        for n in range(300)
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
