"""The fence is the claim's stream sequence, and it keeps rising when the stream is deleted and
created again (issue 10, item 6): anarchon starts a new stream's sequence at the time in ms x
1024 (nats-server 2.10+). nats-server 2.9 ignores the first sequence; there the fence starts
at 1 again, as docs/backends/nats.md says, and a warning says so.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import Trigger
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats import _stream as stream_module
from tests.nats.servers import delete_stream

SLOT = 1_800_000_000_000
Make = Callable[..., Any]


def request(slot: int) -> ClaimRequest:
    return ClaimRequest(
        job="sync",
        slot=slot,
        run_id=uuid.uuid4().hex,
        token=uuid.uuid4().hex,
        instance="i1",
        trigger=Trigger.SCHEDULE,
    )


async def fence_of(backend: NatsBackend, slot: int) -> int:
    [won] = await backend.claim([request(slot)])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    assert won.ticket.fence is not None
    return won.ticket.fence


async def test_fences_rise_across_a_recreated_stream(
    make: Make,
    server_url: str,
    names: tuple[str, str],
    version: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, _ = names
    caplog.set_level(logging.WARNING, logger="anarchon.backends.nats")
    first: NatsBackend = await make()
    before = [await fence_of(first, SLOT + n * 1000) for n in range(3)]
    await first.stop()
    await delete_stream(server_url, stream)
    second: NatsBackend = await make()  # every option at its default
    after = await fence_of(second, SLOT + 3000)
    if version == "2.9":
        # Where the promise stops: 2.9 takes no first sequence.
        assert after == 1
        assert "starts at sequence 1" in caplog.text
        return
    assert before == sorted(before) and after > before[-1], (before, after)
    assert after < 2**53, "fences stay exact for JSON readers that use doubles"
    assert abs(after // 1024 - time.time() * 1000) < 60_000, "the floor is the time in ms x 1024"
    assert "starts at sequence 1" not in caplog.text


@pytest.mark.parametrize("version", ["current"])
async def test_a_creator_whose_clock_is_off_is_warned(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stream_module, "_local_now_ms", lambda: int(time.time() * 1000) - 60_000)
    caplog.set_level(logging.WARNING, logger="anarchon.backends.nats")
    await make()
    assert "from this host's clock, which is -6" in caplog.text
