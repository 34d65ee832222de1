"""The duplicate window is the stream's, shared by every instance (issue 10, item 9).

Instances that start with different ``duplicate_window_ms`` never shrink the stream's window
(unless ``shrink_window=True``); jobs are checked against the window the stream really has,
with the claim retry margin counted; a running instance raises a window that fell below what it
keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import InvalidOption, Scheduler
from anarchon.backends.nats import NatsBackend, _timings
from tests.nats.test_stream import raw_config

Make = Callable[..., Any]
NS = 1_000_000


async def handler(ctx: Any) -> None:
    pass


async def window_of(url: str, stream: str) -> int:
    return int((await raw_config(url, stream))["duplicate_window"]) // NS


async def until_window(url: str, stream: str, ms: int) -> None:
    """Wait for the stream's window to be ``ms`` (a running instance's check: every 0.2 s in
    these tests, a minute by default), up to about 10 s."""
    for _ in range(100):
        if await window_of(url, stream) == ms:
            break
        await asyncio.sleep(0.1)
    assert await window_of(url, stream) == ms


async def edit_by_hand(url: str, stream: str, *, max_age_ms: int, window_ms: int) -> None:
    """Set the stream's max_age and duplicate window as an operator would (a raw update)."""
    import json

    from tests.nats.servers import connect

    edited = {**await raw_config(url, stream), "max_age": max_age_ms * NS,
              "duplicate_window": window_ms * NS}  # fmt: skip
    nc = await connect(url)
    try:
        reply = await nc.request(
            f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(edited).encode(), timeout=2
        )
        assert "error" not in json.loads(reply.data), reply.data
    finally:
        await nc.close()


async def test_an_instance_with_a_smaller_window_never_shrinks_the_stream(
    make: Make, server_url: str
) -> None:
    big: NatsBackend = await make(duplicate_window_ms=600_000)
    small: NatsBackend = await make()  # every option at its default: 300 000
    assert await window_of(server_url, big.stream) == 600_000
    assert small.window_ms == 600_000, "the backend knows the stream's real window"
    assert await big.check_window() == 600_000


async def test_a_smaller_window_grows_and_shrink_window_shrinks_it(
    make: Make, server_url: str
) -> None:
    first: NatsBackend = await make(duplicate_window_ms=120_000)
    assert await window_of(server_url, first.stream) == 120_000
    await make()
    assert await window_of(server_url, first.stream) == 300_000
    shrinker: NatsBackend = await make(duplicate_window_ms=200_000, shrink_window=True)
    assert await window_of(server_url, first.stream) == 200_000
    assert shrinker.window_ms == 200_000


async def test_jobs_added_after_start_are_checked_against_the_streams_window(
    make: Make,
) -> None:
    await make(duplicate_window_ms=600_000)
    backend: NatsBackend = await make(duplicate_window_ms=100_000)
    scheduler = Scheduler(backend)
    # 2 000 + 400 000 + 10 000 = 412 000 fits the stream's 600 000, not this instance's 100 000.
    scheduler.add("long", "* * * * *", handler, max_late_ms=400_000)
    assert backend.skew_budget_ms(scheduler._jobs["long"].policy) == 600_000 - 412_000
    with pytest.raises(
        InvalidOption,
        match=rf"2000 \+ 590000 \+ 10000 = 602000 must be less than the duplicate window of "
        rf"stream '{backend.stream}', 600000 ms as the stream has it now .*never shrinks it",
    ):
        scheduler.add("longer", "* * * * *", handler, max_late_ms=590_000)


def test_the_claim_retry_margin_counts_before_start() -> None:
    backend = NatsBackend(duplicate_window_ms=70_000)
    scheduler = Scheduler(backend)
    with pytest.raises(
        InvalidOption,
        match=r"job 'job': jitter_ms \+ max_late_ms \+ 10000 ms of claim retries = 2000 \+ "
        r"60000 \+ 10000 = 72000 must be less than this NATS backend's "
        r"duplicate_window_ms=70000 .*raise duplicate_window_ms above 72000",
    ):
        scheduler.add("job", "* * * * *", handler)
    scheduler.add("job", "* * * * *", handler, max_late_ms=50_000)
    assert backend.skew_budget_ms(scheduler._jobs["job"].policy) == 70_000 - 62_000
    # Every option at its default: 2 s + 60 s + 10 s against 5 minutes.
    default = Scheduler(NatsBackend())
    default.add("job", "* * * * *", handler)
    assert default.backend.skew_budget_ms(default._jobs["job"].policy) == 300_000 - 72_000


async def test_a_shrunk_window_is_raised_again_by_a_running_instance(
    make: Make,
    server_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_timings, "WINDOW_CHECK_S", 0.2)
    keeper: NatsBackend = await make(duplicate_window_ms=600_000)
    Scheduler(keeper).add("long", "* * * * *", handler, max_late_ms=400_000)
    await make(duplicate_window_ms=200_000, shrink_window=True)
    caplog.set_level(logging.WARNING, logger="anarchon.backends.nats")
    await until_window(server_url, keeper.stream, 600_000)  # the keeper's own check
    assert keeper.window_ms == 600_000
    assert "was 200000 ms, less than this instance keeps" in caplog.text
    assert "job long needs 412000 ms" in caplog.text


@pytest.fixture
async def checked(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> NatsBackend:
    """A started backend, every option at its default, with a job (so its window check runs,
    every 0.2 s here); WARNINGs captured."""
    monkeypatch.setattr(_timings, "WINDOW_CHECK_S", 0.2)
    backend: NatsBackend = await make()
    Scheduler(backend).add("job", "* * * * *", handler)
    caplog.set_level(logging.WARNING, logger="anarchon.backends.nats")
    return backend


async def test_a_max_age_edited_below_the_window_is_raised_with_it(
    checked: NatsBackend, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """QA probe maxage.sh: the stream edited by hand to max_age 30 s and window 20 s. The
    minute check's raise of the window failed (err_code 10052: a window longer than max_age),
    logged only at DEBUG, the instance still believing 300 000 ms: 50 duplicate runs. Now
    max_age is raised with the window, at WARNING. Every option at its default."""
    backend = checked
    await edit_by_hand(server_url, backend.stream, max_age_ms=30_000, window_ms=20_000)
    await until_window(server_url, backend.stream, 300_000)
    after = await raw_config(server_url, backend.stream)
    assert int(after["max_age"]) // NS == 300_000
    assert backend.window_ms == 300_000
    assert "was 20000 ms, less than this instance keeps" in caplog.text
    assert "its max_age was 30000 ms, shorter than the window, and is now 300000 ms" in caplog.text


async def test_a_window_that_cannot_be_raised_back_is_a_warning_naming_max_age(
    checked: NatsBackend,
    server_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the refused update (err_code 10052) was logged at DEBUG (``upkeep_failed``) and
    the instance kept believing its 300 000 ms window. The update is refused here as a server
    that does not let this user update the stream would (the stream itself is edited for
    real)."""
    from anarchon.backends.nats import _stream
    from anarchon.backends.nats._errors import JetStreamError

    backend = checked

    async def refused(*args: Any) -> dict[str, Any]:
        raise JetStreamError(
            "duplicate window can not be larger then max age (code 400, err_code 10052)",
            code=400,
            err_code=10052,
        )

    monkeypatch.setattr(_stream, "raise_window", refused)  # as _window calls it
    await edit_by_hand(server_url, backend.stream, max_age_ms=30_000, window_ms=20_000)

    def failed() -> set[str]:
        return {
            r.getMessage()
            for r in caplog.records
            if getattr(r, "action", "") == "window_raise_failed"
        }

    for _ in range(100):
        if failed():
            break
        await asyncio.sleep(0.1)
    [warning] = failed()
    assert "is 20000 ms, less than this instance keeps" in warning
    assert "The stream's max_age is 30000 ms" in warning
    assert "err_code 10052" in warning
    assert backend.window_ms == 20_000, "the window the stream really has"
