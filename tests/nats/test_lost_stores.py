"""A stream or key-value bucket lost under running instances (deleted, or gone with the store of
a server restarted without it) is made again with the settings ``start()`` gives it: a bucket at
once, the stream one duplicate window after it was found missing, so that no slot the lost
stream recorded is claimed a second time. Readers (the ``anarchon`` commands) make nothing and
say the data is gone.

In one process with the guard's looks made quick, on both server versions; then with real
scheduler processes: a registry bucket deleted under three of them, and (``make chaos``) a
server restarted with its store wiped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from anarchon.backend import ClaimStatus
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats._registry import bucket_name
from anarchon.control import Pause
from anarchon.errors import BackendError, BackendUnavailable
from tests.conformance.procs import Fleet
from tests.conformance.test_registry_processes import anarchon
from tests.harness import in_chaos_only
from tests.nats.servers import (
    BINARIES,
    SHARED_URL,
    connect,
    delete_stream,
    single_server,
    unique_names,
)
from tests.records import claim_request, instance_record

JOB = "tick"
WINDOW_MS = 4_000
T = TypeVar("T")

Make = Callable[..., Awaitable[NatsBackend]]


@pytest.fixture
def quick_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard looks every half second (it looks every 30 s, and soon after a failure)."""
    try:
        from anarchon.backends.nats import _timings
    except ImportError:  # a version without them: the test fails on what it checks
        return
    monkeypatch.setattr(_timings, "GUARD_EVERY_S", 0.5)
    monkeypatch.setattr(_timings, "LOOK_GAP_S", 0.2)
    monkeypatch.setattr(_timings, "TICK_S", 0.1)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def stream_info(url: str, stream: str) -> dict[str, Any] | None:
    """The stream's info, or None if it does not exist."""
    nc = await connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=2)
    finally:
        await nc.close()
    info: dict[str, Any] = json.loads(reply.data)
    if (info.get("error") or {}).get("err_code") == 10059:
        return None
    assert "error" not in info, info
    return info


async def until(check: Callable[[], Awaitable[T | None]], what: str, within_s: float) -> T:
    deadline = time.monotonic() + within_s
    while True:
        found = await check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"waited {within_s:g} s for {what}"
        await asyncio.sleep(0.1)


def actions(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


async def test_a_lost_stream_is_made_again_one_window_after_and_never_sooner(
    make: Make,
    server_url: str,
    names: tuple[str, str],
    quick_guard: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, prefix = names
    caplog.set_level(logging.INFO, logger="anarchon.backends.nats")
    winner = await make(duplicate_window_ms=WINDOW_MS)
    late = await make(duplicate_window_ms=WINDOW_MS)
    slot = now_ms()
    [won] = await winner.claim([claim_request(JOB, slot, "winner")])
    assert won.status is ClaimStatus.WON
    lost = time.time()  # just before the loss
    await delete_stream(server_url, stream)
    # A late instance claims the slot again and again while one window since the loss lasts, as
    # its scheduler would until max_late_ms (always less than the window): the slot ran, so
    # that claim must never win, which a stream made again at once would let it.
    tries = 0
    while now_ms() < slot + WINDOW_MS - 300:
        tries += 1
        try:
            [answer] = await late.claim([claim_request(JOB, slot, "late")])
        except BackendUnavailable:
            continue  # fail closed: no stream answers
        assert answer.status is not ClaimStatus.WON, "a slot that ran was claimed again"
    assert tries >= 1
    info = await until(lambda: stream_info(server_url, stream), "the stream", WINDOW_MS / 1000 + 10)
    config = info["config"]
    assert config["subjects"] == [f"{prefix}>"]
    assert config["duplicate_window"] == WINDOW_MS * 1_000_000
    assert config["max_msgs_per_subject"] == 1000  # history_size, at its default
    assert config["num_replicas"] == 1
    # Runs go on: a new slot is claimed and won.
    [again] = await late.claim([claim_request(JOB, now_ms(), "late")])
    assert again.status is ClaimStatus.WON
    missing = actions(caplog, "stream_missing")

    async def both() -> bool | None:
        return (
            len(actions(caplog, "stream_recreated") + actions(caplog, "stream_found")) == 2 or None
        )

    await until(both, "each instance to make the stream or find it made", 5)
    made, found = actions(caplog, "stream_recreated"), actions(caplog, "stream_found")
    assert len(missing) == 2 and all(r.levelno == logging.WARNING for r in missing), caplog.text
    # Each instance made it, or found it made by the other (2.9 takes the same config twice).
    assert made and len(made) + len(found) == 2, caplog.text
    assert all(r.levelno == logging.WARNING for r in made)
    assert stream in made[0].getMessage() and "waited one duplicate window" in made[0].getMessage()
    # Made one window after it was found missing, and so after it was lost: never sooner.
    assert made[0].created - missing[0].created >= WINDOW_MS / 1000
    assert made[0].created - lost >= WINDOW_MS / 1000, made[0].created - lost


async def test_a_stream_made_again_too_soon_by_a_starting_instance_is_warned_about(
    make: Make,
    server_url: str,
    names: tuple[str, str],
    quick_guard: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, _ = names
    caplog.set_level(logging.INFO, logger="anarchon.backends.nats")
    await make()  # every option at its default: it would make the stream again after 5 min
    await delete_stream(server_url, stream)
    await until(lambda: _logged(caplog, "stream_missing"), "the loss to be noticed", 10)
    await make()  # an instance that starts now makes it at once: where the promise stops
    found = await until(lambda: _logged(caplog, "stream_found"), "the stream to be found", 10)
    assert found.levelno == logging.WARNING, caplog.text
    assert "may run a second time" in found.getMessage()
    assert actions(caplog, "stream_recreated") == []


async def _logged(caplog: pytest.LogCaptureFixture, action: str) -> logging.LogRecord | None:
    found = actions(caplog, action)
    return found[0] if found else None


async def test_lost_buckets_are_made_again_at_once_and_say_what_was_lost(
    make: Make,
    server_url: str,
    names: tuple[str, str],
    quick_guard: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, _ = names
    caplog.set_level(logging.WARNING, logger="anarchon.backends.nats")
    backend = await make()  # every option at its default
    registry = backend.registry()
    await registry.record(instance_record("i1"))
    control = backend.control()
    await control.pause(Pause(job=JOB, by="ops@test", at_ms=now_ms()))
    buckets = [bucket_name(stream), bucket_name(stream, "control")]
    nc = await connect(server_url)
    try:
        js = nc.jetstream()
        for bucket in buckets:
            await js.delete_key_value(bucket)
    finally:
        await nc.close()
    for bucket in buckets:
        await until(partial(stream_info, server_url, f"KV_{bucket}"), bucket, 10)
    made = {r.getMessage().split()[3]: r for r in actions(caplog, "bucket_recreated")}
    assert sorted(made) == sorted(buckets), caplog.text
    assert "pauses" in made[buckets[1]].getMessage()
    assert "heartbeat" in made[buckets[0]].getMessage()
    # They work again, and hold nothing of before.
    assert await control.pauses() == []
    await registry.record(instance_record("i1", beat=2_000))
    assert [r.id for r in await registry.instances()] == ["i1"]
    assert actions(caplog, "stream_missing") == []  # the stream was never lost


async def test_readers_make_nothing_and_say_the_data_is_gone(
    make: Make, server_url: str, names: tuple[str, str], quick_guard: None
) -> None:
    from anarchon._cli.common import EXIT_NO_DATA, Exit, opened

    stream, prefix = names
    url = f"{server_url}?stream={stream}&prefix={prefix}"
    # A running instance (which makes the stream again only a window after it is lost, 5 min
    # by default) and no scheduler recorded: no registry bucket.
    await make()
    with pytest.raises(Exit) as no_registry:
        async with opened(url, registry=True):
            pass
    assert no_registry.value.code == EXIT_NO_DATA
    text = str(no_registry.value)
    assert f"'{bucket_name(stream)}' does not exist" in text and "lost its store" in text, text
    writer = NatsBackend(server_url, stream=stream, prefix=prefix)
    await writer.start()
    try:
        await writer.registry().record(instance_record("i1"))
    finally:
        await writer.stop()
    reader = NatsBackend(server_url, stream=stream, prefix=prefix)
    await reader.start_reader()
    try:
        assert [r.id for r in await reader.registry().instances()] == ["i1"]
        await delete_stream(server_url, stream)
        await asyncio.sleep(1.5)  # three quick looks, if a reader looked
    finally:
        await reader.stop()
    assert await stream_info(server_url, stream) is None
    assert await stream_info(server_url, f"KV_{bucket_name(stream)}") is None
    with pytest.raises(BackendError, match="does not exist") as gone:
        await NatsBackend(server_url, stream=stream, prefix=prefix).start_reader()
    assert "the history it held is gone" in str(gone.value)


def listed(url: str) -> set[str]:
    """The instances ``anarchon instances`` lists (none when it finds no data)."""
    out = anarchon("instances", "--backend", url, "--json")
    if out.returncode != 0:
        return set()
    return {i["id"] for i in json.loads(out.stdout)["instances"]}


async def wait_listed(url: str, want: set[str], within_s: float) -> float:
    """Seconds until ``anarchon instances`` lists exactly ``want``."""
    began = time.monotonic()
    while (found := await asyncio.to_thread(listed, url)) != want:
        assert time.monotonic() - began < within_s, f"instances listed: {found}"
        await asyncio.sleep(0.5)
    return time.monotonic() - began


@pytest.mark.slow
async def test_a_registry_bucket_deleted_under_three_instances_comes_back(
    tmp_path: Path,
) -> None:
    stream, prefix = unique_names()
    url = f"{SHARED_URL}?stream={stream}&prefix={prefix}"  # every other option at its default
    fleet = Fleet(url, tmp_path)
    try:
        fleet.wait_ready(fleet.spawn(3, seconds=120, job=JOB))
        everyone = {"w0", "w1", "w2"}
        await wait_listed(url, everyone, 15)
        nc = await connect(SHARED_URL)
        try:
            await nc.jetstream().delete_key_value(bucket_name(stream))
        finally:
            await nc.close()
        took = await wait_listed(url, everyone, 25)
        print(f"registry bucket deleted under 3 instances: listed again after {took:.1f} s")
        logs = fleet.logs()
        assert "re-created key-value bucket" in logs, logs
        assert "Traceback" not in logs, logs
    finally:
        fleet.stop_all()
        await delete_stream(SHARED_URL, stream)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.9", "current"])
async def test_a_server_restarted_without_its_store_resumes_without_duplicates(
    version: str, tmp_path: Path
) -> None:
    in_chaos_only("a server restarted without its store (about 40 s)")
    server = single_server(tmp_path / "server", BINARIES[version]).start()
    stream, prefix = unique_names()
    window_ms = 12_000  # above jitter_ms + max_late_ms + the 10 s claim retry margin
    url = f"{server.url}?stream={stream}&prefix={prefix}&duplicate_window_ms={window_ms}"
    fleet = Fleet(url, tmp_path)
    try:
        fleet.wait_ready(fleet.spawn(3, seconds=120, job=JOB, jitter_ms=300, max_late_ms=1000))
        await asyncio.sleep(3)
        down = time.time()
        server.kill()
        shutil.rmtree(server.directory / "store")
        server.start()  # same port, an empty store: no stream, no bucket
        back = time.time()

        def resumed() -> float | None:
            after = [r["t"] for r in fleet.records("start") if (r["slot"] or 0) > back * 1000]
            return min(after) if after else None

        deadline = time.monotonic() + window_ms / 1000 + 25
        while (first := resumed()) is None:
            assert time.monotonic() < deadline, fleet.logs()
            await asyncio.sleep(0.3)
        await asyncio.sleep(4)
        ended = time.time()
        fleet.stop_all()
        starts = fleet.starts_per_slot()
        duplicates = {slot: n for slot, n in starts.items() if n > 1}
        print(
            f"nats-server {version} restarted without its store: runs resumed "
            f"{first - back:.1f} s after, {len(starts)} slots run, duplicates {len(duplicates)}"
        )
        assert duplicates == {}, fleet.logs()
        assert first - back >= window_ms / 1000 - 1, "made again before one window passed"
        # Once made again, every slot runs (from a second after the first run, to the end).
        later = range(int(first) + 2, int(ended) - 1)
        assert all(s * 1000 in starts for s in later), fleet.logs()
        before = [s for s in starts if s < down * 1000]
        assert before, "runs before the loss"
        logs = fleet.logs()
        assert "re-created stream" in logs and "re-created key-value bucket" in logs, logs
        assert "Traceback" not in logs, logs
    finally:
        fleet.stop_all()
        server.stop()
