"""The claim rate's same-work floor: it sends what the backend sends, and its records are the
backend's records."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from bench import report
from bench.probe import _request
from bench.same_work import make_same_work

from anarchon import backend_from_url
from anarchon.backend import ClaimStatus

URLS = {
    "sqlite": "sqlite:///{tmp}/floor.db",
    "redis": "redis://127.0.0.1:6379/0?prefix=floor-test:",
    "postgres": "postgresql://127.0.0.1:5432/postgres?schema=floor_test",
    "nats": "nats://127.0.0.1:4222?stream=FLOOR_TEST&prefix=floortest.",
}
# The backend's own encoder of one claim, which check() compares the floor's arguments with.
ENCODERS = {
    "sqlite": ("anarchon.backends.sqlite._rows", "_params"),
    "redis": ("anarchon.backends.redis._rows", "claim_arguments"),
    "postgres": ("anarchon.backends.postgres._rows", "claim_one_params"),
    "nats": ("anarchon.backends.nats._records", "encode_claim"),
}
SLOT = 1_764_000_000_000


def _ids() -> tuple[str, str]:
    ids = os.urandom(32).hex()
    return ids[:32], ids[32:]


@pytest.mark.parametrize("name", sorted(URLS))
def test_the_floor_builds_the_backends_own_arguments(name: str, tmp_path: Path) -> None:
    url = URLS[name].format(tmp=tmp_path)
    backend = backend_from_url(url)  # not started: nothing here talks to a server
    work = make_same_work(name, backend, "rate0", url)
    work.check(_request("s1a2b3c4d-0", SLOT, "rate0", backend.is_lease_backend))


@pytest.mark.parametrize("name", sorted(URLS))
def test_a_change_of_the_backends_arguments_stops_the_floor(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = URLS[name].format(tmp=tmp_path)
    backend = backend_from_url(url)
    work = make_same_work(name, backend, "rate0", url)
    module, encoder = ENCODERS[name]
    monkeypatch.setattr(f"{module}.{encoder}", lambda *args, **kwargs: "something else")
    with pytest.raises(RuntimeError, match=re.escape("update bench/same_work.py")):
        work.check(_request("s1a2b3c4d-0", SLOT, "rate0", backend.is_lease_backend))


async def test_sqlite_floor_claims_are_records_the_backend_decides_by(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/floor.db"
    backend = backend_from_url(url)
    await backend.start()
    first = make_same_work("sqlite", backend, "rate0", url)
    second = make_same_work("sqlite", backend, "rate1", url)
    await first.open()
    await second.open()
    try:
        winner = _ids()
        assert await first.claim("s0", SLOT, *winner)
        assert not await second.claim("s0", SLOT, *_ids())
        assert await first.claim("s0", SLOT, *winner)  # a retry of the same token: still ours
        assert await second.claim("s0", SLOT + 1000, *_ids())

        # The backend's own claim of a slot the floor won loses to the floor's record ...
        [lost] = await backend.claim([_request("s0", SLOT, "rate2", True)])
        assert lost.status is ClaimStatus.LOST
        assert lost.run.run_id == winner[0]
        assert lost.run.instance == "rate0"
        # ... and wins the next slot with a fence above the floor's.
        [won] = await backend.claim([_request("s0", SLOT + 2000, "rate2", True)])
        assert won.status is ClaimStatus.WON
        [floor_run] = [r for r in await backend.history("s0") if r.run_id == winner[0]]
        assert won.ticket is not None
        floor_fence, fence = floor_run.fence, won.ticket.fence
        assert floor_fence is not None and fence is not None
        assert fence > floor_fence
    finally:
        await first.close()
        await second.close()
        await backend.stop()


def _rate() -> dict[str, Any]:
    def step(rate: float) -> dict[str, Any]:
        share = {"share": rate / 1000, "rates": [rate], "shares": [rate / 1000], "lead": 0.4}
        return {"rate": rate, "duplicates": 0, "unclaimed": 0, **share}

    steps = {"primitive": step(1000.0), "same_work": step(800.0), "claim": step(500.0)}
    row = {"rounds": 14, "seconds": 0.5, "steps": steps, "share": 0.5, "same_share": 0.8}
    row["python_share"] = 0.625
    return {"targets": {"redis": {"available": True, "lease": True}}, "rate": {"redis": row}}


def test_the_rate_table_shows_the_floor_beside_the_target() -> None:
    text = "\n".join(report.rate_section(_rate()))
    assert (
        "| redis | 1,000/s | 800/s | 500/s | 50 % | **not met** | 80 % | 62 % | 0 / 0 / 0 "
        "| 0 / 0 / 0 |"
    ) in text
