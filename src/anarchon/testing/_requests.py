"""The requests the contract tests send: one claim or takeover, with fresh ids and tokens."""

from __future__ import annotations

import uuid
from typing import Any

from ..backend import Backend, ClaimRequest, LeaseBackend, TakeoverRequest
from ..kit import Trigger

__all__ = ["LEASE_MS", "SLOT", "lease", "request", "takeover"]

SLOT = 1_800_000_000_000  # 2027-01-15T08:00:00Z
"""The slot the tests claim (epoch ms), and the ones after it."""
LEASE_MS = 600
"""The lease the tests take (ms): short, so expiry tests are quick."""


def request(
    job: str = "job", slot: int | None = SLOT, token: str | None = None, **kw: Any
) -> ClaimRequest:
    """A claim request for the tests: a new run id and token, instance ``i1``, by schedule."""
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=token or uuid.uuid4().hex,
        instance=str(kw.pop("instance", "i1")),
        trigger=kw.pop("trigger", Trigger.SCHEDULE),
        **kw,
    )


def lease(backend: Backend, **kw: Any) -> dict[str, Any]:
    """``lease_ms`` for a lease backend, nothing for a broker; plus ``kw``."""
    return {"lease_ms": LEASE_MS, **kw} if isinstance(backend, LeaseBackend) else dict(kw)


def takeover(job: str, slot_key: str, **kw: Any) -> TakeoverRequest:
    """A takeover request for the tests: instance ``backup``, 3 attempts."""
    return TakeoverRequest(
        job=job,
        slot_key=slot_key,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance=str(kw.pop("instance", "backup")),
        lease_ms=int(kw.pop("lease_ms", LEASE_MS)),
        max_attempts=int(kw.pop("max_attempts", 3)),
    )
