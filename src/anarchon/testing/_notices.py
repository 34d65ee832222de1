"""The contract of :meth:`~anarchon.backend.Backend.subscribe_claims`: claim notices, which let
instances that rank below a slot's preferred instance skip a claim that could only lose. Part of
:class:`~anarchon.testing.contract.BackendContract`.

A backend that announces no claims (``subscribe_claims`` answers False) skips these tests,
unless the class sets ``notices_required``. Waits are generous (notices may be polled)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ..backend import Backend, ClaimNotice, ClaimStatus
from ._requests import SLOT, lease, request

__all__ = ["NoticesContract"]

# How long a notice may take to arrive: generous, a polled table or a loaded host included.
NOTICE_WAIT_S = 10.0
# After the last expected notice: how long to listen for one that must not come.
QUIET_S = 0.5


class _Heard:
    """A claim listener that keeps what it hears."""

    def __init__(self) -> None:
        self.notices: list[ClaimNotice] = []

    def __call__(self, notices: Sequence[ClaimNotice]) -> None:
        self.notices.extend(notices)

    async def until(self, count: int) -> list[ClaimNotice]:
        """Wait (up to :data:`NOTICE_WAIT_S`) for ``count`` notices in all; return them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NOTICE_WAIT_S
        # Polled, not an Event: a backend may call its listeners from a thread of its own.
        while len(self.notices) < count and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return list(self.notices)


class NoticesContract:
    """Won claims are announced, each with its winner and lease expiry; nothing else is."""

    notices_required = False
    """Set True in a subclass whose backend must announce claims (fail instead of skip)."""

    async def _subscribe(self, backend: Backend) -> _Heard:
        heard = _Heard()
        if not await backend.subscribe_claims(heard):
            message = f"{backend.name} announces no claims (subscribe_claims answered False)"
            if self.notices_required:
                pytest.fail(message)
            pytest.skip(message)
        return heard

    async def test_a_won_claim_is_announced_with_its_winner_and_lease(
        self, backend: Backend
    ) -> None:
        """A won claim is announced with its winner and lease."""
        heard = await self._subscribe(backend)
        req = request(job="noticed", slot=SLOT, instance="winner", **lease(backend))
        [won] = await backend.claim([req])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        [notice] = await heard.until(1)
        assert notice == ClaimNotice(
            "noticed", req.slot_key, "winner", won.ticket.lease_expires_at_ms
        ), notice

    async def test_lost_and_skipped_claims_are_not_announced(self, backend: Backend) -> None:
        """Lost and skipped claims are not announced."""
        heard = await self._subscribe(backend)
        [won] = await backend.claim([request(job="quiet", **lease(backend))])
        assert won.status is ClaimStatus.WON
        await heard.until(1)
        lost, skipped = await backend.claim(
            [
                request(job="quiet", instance="late", **lease(backend)),
                request(job="quiet", slot=SLOT + 1000, skip_reason="too late", **lease(backend)),
            ]
        )
        assert lost.status is ClaimStatus.LOST and skipped.status is ClaimStatus.SKIPPED
        # A last won claim: once its notice is in, any notice of the two above would be too.
        [last] = await backend.claim([request(job="quiet", slot=SLOT + 2000, **lease(backend))])
        assert last.status is ClaimStatus.WON
        await heard.until(2)
        await asyncio.sleep(QUIET_S)
        keys = sorted(n.slot_key for n in heard.notices)
        assert keys == sorted([str(SLOT), str(SLOT + 2000)]), heard.notices

    async def test_every_claim_of_a_batch_is_announced(self, backend: Backend) -> None:
        """Every claim of a batch is announced."""
        heard = await self._subscribe(backend)
        reqs = [request(job=f"batch{n}", **lease(backend)) for n in range(20)]
        outcomes = await backend.claim(reqs)
        assert all(o.status is ClaimStatus.WON for o in outcomes)
        notices = await heard.until(len(reqs))
        assert sorted(n.job for n in notices) == sorted(r.job for r in reqs)

    async def test_a_failing_claim_listener_does_not_silence_the_others(
        self, backend: Backend
    ) -> None:
        """A failing claim listener does not silence the others."""

        def broken(notices: Sequence[ClaimNotice]) -> None:
            raise RuntimeError("listener bug")

        if not await backend.subscribe_claims(broken):
            pytest.skip(f"{backend.name} announces no claims")
        heard = await self._subscribe(backend)
        await backend.claim([request(job="robust", **lease(backend))])
        assert [n.job for n in await heard.until(1)] == ["robust"]
