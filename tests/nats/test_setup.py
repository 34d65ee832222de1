"""start() errors, the caller's connection, URLs, and the checks made when a job is added."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import (
    BackendError,
    BackendUnavailable,
    InvalidOption,
    Scheduler,
    UnsupportedFeature,
    backend_from_url,
)
from anarchon.backends.nats import NatsBackend
from tests.nats.servers import SINGLE_PORTS, NatsServer, connect

Make = Callable[..., Any]


async def test_a_server_without_jetstream_is_named_with_the_fix(
    private_server: Callable[..., NatsServer],
) -> None:
    server = private_server(jetstream=False)
    backend = NatsBackend(server.url, stream="CRON", prefix="cron.")
    began = time.monotonic()
    with pytest.raises(BackendError, match=r"JetStream is not enabled .*nats-server -js") as e:
        await backend.start()
    assert not isinstance(e.value, BackendUnavailable), "a server to configure: not transient"
    assert time.monotonic() - began < 5
    await backend.stop()


async def test_an_unreachable_server_fails_within_seconds() -> None:
    """BackendUnavailable, as PostgreSQL and Redis say it, so a caller that retries transient
    failures retries it. Before: a plain BackendError."""
    port = SINGLE_PORTS.take_one()
    backend = NatsBackend(f"nats://app:secret@127.0.0.1:{port}")
    began = time.monotonic()
    with pytest.raises(
        BackendUnavailable, match=r"cannot connect to NATS at nats://app:\*\*\*@127"
    ) as e:
        await backend.start()
    assert time.monotonic() - began < 10
    assert "Connection refused" in str(e.value) or "Connect call failed" in str(e.value)
    assert "secret" not in str(e.value) and "secret" not in repr(backend)
    unknown_host = NatsBackend("nats://no-such-host.invalid:4222")
    with pytest.raises(BackendUnavailable, match=r"cannot connect to NATS at nats://no-such"):
        await unknown_host.start()


def test_the_cli_exits_4_for_an_unreachable_server() -> None:
    port = SINGLE_PORTS.take_one()
    done = subprocess.run(
        [sys.executable, "-m", "anarchon", "history", "x", "--backend", f"nats://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert f"cannot connect to NATS at nats://127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_callers_connection_is_used_and_never_closed(
    server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    nc = await connect(server_url)
    try:
        backend = NatsBackend(connection=nc, stream=stream, prefix=prefix, servers="nats://x:1")
        scheduler = Scheduler(backend)

        async def handler(ctx: Any) -> None:
            pass

        scheduler.add("job", "0 0 1 1 *", handler)
        async with scheduler:
            run = await scheduler.run_now("job")
            assert run.fence is not None
        assert nc.is_connected, "stop() closed the caller's connection"
        await backend.start()  # start again after stop: same connection
        assert (await backend.last_run("job")) == run
        await backend.stop()
        assert nc.is_connected
    finally:
        await nc.close()


async def test_calls_before_start_say_so() -> None:
    backend = NatsBackend()
    with pytest.raises(BackendError, match="not started"):
        await backend.history("job")
    await backend.stop()  # harmless


@pytest.mark.parametrize(
    ("url", "servers", "options"),
    [
        (
            "nats://127.0.0.1:4222?stream=BILLING&prefix=billing.cron.&duplicate_window_ms=60000",
            ["nats://127.0.0.1:4222"],
            {"stream": "BILLING", "prefix": "billing.cron.", "duplicate_window_ms": 60_000},
        ),
        (
            "nats://n1:4222,n2:4222,n3:4222?replicas=3&history_size=50",
            ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"],
            {"replicas": 3, "history_size": 50, "stream": "CRON", "prefix": "cron."},
        ),
        (
            "nats://u:p@n1:4222/?server=nats://n2:4222&server=tls://n3:4222",
            ["nats://u:p@n1:4222", "nats://n2:4222", "tls://n3:4222"],
            {},
        ),
        ("tls://secure:4222", ["tls://secure:4222"], {}),
    ],
)
def test_urls(url: str, servers: list[str], options: dict[str, Any]) -> None:
    backend = backend_from_url(url)
    assert isinstance(backend, NatsBackend) and backend.servers == servers
    for key, value in options.items():
        assert getattr(backend, key) == value


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("nats://h:4222?stream=X&colour=red", "unknown option.*colour"),
        ("nats://h:4222?history_size=many", "history_size='many' must be an integer"),
        ("nats://h:4222/CRON", "has a path"),
        ("nats://?stream=X", "names no server"),
        ("nats://h:4222?prefix=cron", "prefix='cron' is not a NATS subject prefix"),
        ("nats://h:4222?shrink_window=maybe", "shrink_window='maybe' .* must be true or false"),
    ],
)
def test_bad_urls(url: str, text: str) -> None:
    with pytest.raises(InvalidOption, match=text):
        backend_from_url(url)


def test_history_ttl_and_lease_options_are_refused_naming_the_lease_backends() -> None:
    scheduler = Scheduler(NatsBackend())

    async def handler(ctx: Any) -> None:
        pass

    with pytest.raises(
        UnsupportedFeature, match=r"history_ttl_ms.*nats.*Redis, PostgreSQL or SQLite"
    ):
        scheduler.add("job", "* * * * *", handler, history_ttl_ms=3_600_000)
    with pytest.raises(UnsupportedFeature, match=r"lease_ms.*Redis, PostgreSQL or SQLite"):
        scheduler.add("job", "* * * * *", handler, lease_ms=5_000)
