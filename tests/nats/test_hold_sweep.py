"""The sweep of hold streams left on the shared NATS server by killed test processes
(:func:`tests.nats.servers.sweep_stale_holds`, run at the start of every pytest run), on private
servers of the shared one's version (2.9): only ``HOLD_`` streams older than the age given go,
never another stream nor the account's last one, and a server that does not answer costs the
run nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.nats.servers import BINARIES, connect, single_server, sweep_stale_holds

pytestmark = pytest.mark.timeout(120)

AGE_S = 5.0
"""The age swept past: the time from a stream's creation to the sweep's reading of the list
stays well under it, loaded or not."""


async def _add(url: str, *names: str) -> None:
    nc = await connect(url)
    try:
        for name in names:
            await nc.jetstream().add_stream(name=name, subjects=[f"{name.lower()}.>"])
    finally:
        await nc.close()


async def _names(url: str) -> set[str]:
    nc = await connect(url)
    try:
        return {str(info.config.name) for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


def test_only_old_hold_streams_go_and_never_the_accounts_last(tmp_path: Path) -> None:
    shared = single_server(tmp_path / "shared", BINARIES["2.9"]).start()
    holds_only = single_server(tmp_path / "holds", BINARIES["2.9"]).start()
    try:
        asyncio.run(_add(shared.url, "HOLD_aaaaaaaaaaaa", "HOLD_bbbbbbbbbbbb", "T_old", "HOLDING"))
        asyncio.run(_add(holds_only.url, "HOLD_aaaaaaaaaaaa"))
        time.sleep(0.1)
        asyncio.run(_add(holds_only.url, "HOLD_bbbbbbbbbbbb"))
        time.sleep(AGE_S + 0.5)  # the age compared: the server's creation times
        asyncio.run(_add(shared.url, "HOLD_cccccccccccc"))  # a running process's

        swept = sweep_stale_holds(AGE_S, url=shared.url)
        assert sorted(swept) == ["HOLD_aaaaaaaaaaaa", "HOLD_bbbbbbbbbbbb"], swept
        left = asyncio.run(_names(shared.url))
        assert left == {"T_old", "HOLDING", "HOLD_cccccccccccc"}, left
        assert sweep_stale_holds(AGE_S, url=shared.url) == []  # nothing more to do

        # nats-server 2.9 removes an account's store with its last stream, under another
        # process's creation of one (see hold_shared_account): the newest stale hold stays.
        assert sweep_stale_holds(AGE_S, url=holds_only.url) == ["HOLD_aaaaaaaaaaaa"]
        assert asyncio.run(_names(holds_only.url)) == {"HOLD_bbbbbbbbbbbb"}
    finally:
        shared.stop()
        holds_only.stop()


def test_a_server_that_does_not_answer_is_passed_over(tmp_path: Path) -> None:
    server = single_server(tmp_path / "nats", BINARIES["2.9"])  # never started
    began = time.monotonic()
    assert sweep_stale_holds(AGE_S, url=server.url) == []
    assert time.monotonic() - began < 20
