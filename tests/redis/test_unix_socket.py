"""Redis on a unix socket (docs/backends/redis.md lists ``unix://``): ``--backend``,
``$ANARCHON_BACKEND`` and ``Scheduler('unix://…')`` take it as ``RedisBackend.from_url`` does.
They failed with "unknown scheme 'unix'". A private redis-server listens on a socket in a
temporary directory and is stopped by its pid."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon import RunContext, RunStatus, Scheduler, backend_from_url
from anarchon.backends.redis import RedisBackend
from tests.redis.servers import redis_server
from tests.unit.test_cli import cli, one_line_error

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def socket_url() -> Iterator[str]:
    """``unix:///tmp/…/redis.sock`` of a private server (a short path: a socket's is at most
    107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="anarchon-rs-") as folder:
        sock = Path(folder) / "redis.sock"
        with redis_server(Path(folder), "--unixsocket", str(sock), "--unixsocketperm", "700"):
            yield f"unix://{sock}"


async def test_a_unix_socket_url_names_redis_everywhere(socket_url: str) -> None:
    made = backend_from_url(f"{socket_url}?prefix=sock:&history_size=50")
    assert isinstance(made, RedisBackend) and made.prefix == "sock:"
    # At the defaults (prefix anarchon:, history_size 1000), through Scheduler(url).
    scheduler = Scheduler(socket_url)
    assert isinstance(scheduler.backend, RedisBackend)

    async def once(ctx: RunContext) -> None:
        pass

    scheduler.add("once", "@daily", once)
    async with scheduler:
        run = await scheduler.run_now("once")
        paused = await asyncio.to_thread(
            cli, "pause", "once", "--by", "alice@ops", ANARCHON_BACKEND=socket_url
        )
        assert paused.returncode == 0 and "paused job 'once'" in paused.stdout, paused.stderr
        assert [p.by for p in await scheduler.paused()] == ["alice@ops"]
        resumed = await asyncio.to_thread(cli, "resume", "once", "--backend", socket_url)
        assert resumed.returncode == 0 and "resumed job 'once'" in resumed.stdout, resumed.stderr
    assert run.status is RunStatus.SUCCEEDED

    by_flag = cli("history", "once", "--json", "--backend", socket_url)
    assert by_flag.returncode == 0, by_flag.stderr
    assert [r["run_id"] for r in json.loads(by_flag.stdout)["runs"]] == [run.run_id]
    by_env = cli("history", "once", "--json", ANARCHON_BACKEND=socket_url)
    assert by_env.returncode == 0 and json.loads(by_env.stdout) == json.loads(by_flag.stdout)


def test_a_unix_url_with_a_backend_option_it_does_not_take_is_refused() -> None:
    one_line_error(
        cli("jobs", "--backend", "unix:///nowhere/redis.sock?bogus=1"),
        2,
        "UnixDomainSocketConnection does not take: bogus",
    )
