"""Redis Cluster and Sentinel on loopback, as far as one machine allows: the backend with the
clients the docs show (``RedisCluster``, ``Sentinel(...).master_for(...)``)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anarchon import BackendUnavailable, InvalidOption, RunStatus
from anarchon.backend import ClaimStatus, TakeoverStatus
from anarchon.backends.redis import RedisBackend
from anarchon.control import ALL_JOBS, Pause
from tests.redis.servers import REDIS_MAJOR, RedisServer, free_port
from tests.redis.test_scripts import SLOT, claim_request, takeover_request

pytestmark = pytest.mark.slow


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[RedisServer]]:
    """Three primaries, no replicas; cluster bus ports in our range too."""
    nodes: list[RedisServer] = []
    try:
        for n in range(3):
            port, bus = free_port(), free_port()
            node = RedisServer(
                tmp_path / f"node{n}",
                port=port,
                args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(bus),
                    "--cluster-node-timeout", "2000",
                ),
            )  # fmt: skip
            nodes.append(node.start())
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(
            lambda: all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes),
            30,
            "cluster_state:ok",
        )
        yield nodes
    finally:
        for node in nodes:
            node.stop()


async def test_cluster_client(cluster: list[RedisServer]) -> None:
    from redis.asyncio.cluster import RedisCluster

    if REDIS_MAJOR < 8:  # the compat venv (make compat): refused at start, not half working
        client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
        try:
            with pytest.raises(InvalidOption, match=r"redis-py 8\.0 or later"):
                await RedisBackend(client=client).start()
        finally:
            await client.aclose()
        return
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    other_client = RedisCluster(host="127.0.0.1", port=cluster[1].port)
    prefix = f"cl-{uuid.uuid4().hex[:6]}:"
    backend = RedisBackend(client=client, prefix=prefix)
    other = RedisBackend(client=other_client, prefix=prefix)
    await backend.start()
    await other.start()
    heard: asyncio.Queue[tuple[str, str, bool]] = asyncio.Queue()
    try:
        await backend.subscribe(lambda job, key, released: heard.put_nowait((job, key, released)))
        jobs = [f"job{n}" for n in range(12)]
        # One pipeline, twelve script calls routed to the nodes of twelve hash tags.
        outcomes = await backend.claim([claim_request(job=j, lease_ms=500) for j in jobs])
        assert [o.status for o in outcomes] == [ClaimStatus.WON] * len(jobs)
        holders = {n.port for n in cluster if n.cli("DBSIZE") not in ("", "0")}
        assert len(holders) >= 2, "the jobs' keys all landed on one node"

        for outcome in outcomes[:6]:
            assert outcome.ticket is not None
            await backend.finish(outcome.ticket, RunStatus.SUCCEEDED, None)
        assert [r.status for r in await other.history("job0")] == [RunStatus.SUCCEEDED]

        await asyncio.sleep(0.7)
        ticket = outcomes[8].ticket
        assert ticket is not None
        taken = await other.take_over(takeover_request("job8", ticket.slot_key))
        assert taken.status is TakeoverStatus.TAKEN and taken.ticket is not None
        assert taken.ticket.fence is not None and ticket.fence is not None
        assert taken.ticket.fence > ticket.fence

        # A hand-over published on one node reaches a subscriber connected to another.
        await other.release(taken.ticket, "handed over")
        got: list[tuple[str, str, bool]] = []
        while ("job8", ticket.slot_key, True) not in got:
            got.append(await asyncio.wait_for(heard.get(), 5))
        finished = {(f"job{n}", str(outcomes[n].run.slot_ms), False) for n in range(6)}
        assert set(got) == {*finished, ("job8", ticket.slot_key, True)}

        # Open runs from each job's index (one script call a job: many slots), on the first
        # pass (which reads the newest attempts too) and the next: expired and released, not
        # finished.
        still = {(f"job{n}", outcomes[n].run.run_id) for n in (6, 7, 9, 10, 11)}
        for _ in range(2):
            found_open = {(r.job, r.run_id) for r in await other.open_runs(jobs, 0)}
            assert found_open == {*still, ("job8", taken.ticket.run_id)}

        # Scripts lost on every node (restart, failover) are loaded again, batch included.
        for node in cluster:
            node.cli("SCRIPT", "FLUSH")
        again = await backend.claim([claim_request(job=j, slot=None) for j in jobs])
        assert [o.status for o in again] == [ClaimStatus.WON] * len(jobs)
        assert await backend.last_slot("job3") == outcomes[3].run.slot_ms
        # On a cluster the jobs' META keys lie in many slots: one HGET each, not the script.
        found = await other.last_slots([*jobs, "nobody"])
        slots = {j: o.run.slot_ms for j, o in zip(jobs, outcomes, strict=True)}
        assert found == {**slots, "nobody": None}

        # The pauses live in their own slot: read before a batch of claims, held in each.
        store = other.control()
        assert await store.pauses() == []
        await store.pause(Pause(job="job1", by="ops", at_ms=0))
        later = [claim_request(job=j, slot=SLOT + 60_000) for j in jobs]
        paused = await backend.claim(later)
        assert [o.status for o in paused] == [
            ClaimStatus.SKIPPED if n == 1 else ClaimStatus.WON for n in range(len(jobs))
        ]
        assert paused[1].run.reason == "paused by ops"
        await store.pause(Pause(job=ALL_JOBS, by="ops", at_ms=0))
        held = await backend.claim([claim_request(job=j, slot=SLOT + 120_000) for j in jobs])
        assert {o.run.reason for o in held} == {"paused by ops", "paused by ops (all jobs)"}
        assert await store.resume(ALL_JOBS) is not None
    finally:
        await backend.stop()
        await other.stop()
        await client.aclose()
        await other_client.aclose()


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, RedisServer]]:
    """A primary, a replica and one sentinel watching them as ``mymaster``."""
    primary = RedisServer(tmp_path / "primary")
    replica = RedisServer(tmp_path / "replica")
    replica.args = ("--replicaof", "127.0.0.1", str(primary.port))
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {primary.port} 1\n"
        "sentinel down-after-milliseconds mymaster 1000\n"
        "sentinel failover-timeout mymaster 5000\n"
    )
    watcher = RedisServer(tmp_path / "sentinel", port=port)
    procs = []
    try:
        procs.append(primary.start())
        procs.append(replica.start())
        watcher.dir.mkdir(parents=True, exist_ok=True)
        watcher.proc = subprocess.Popen(
            ["/usr/bin/redis-server", str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        procs.append(watcher)
        wait_until(
            lambda: (
                "slaves=1" in watcher.cli("INFO", "sentinel")
                and "master_link_status:up" in replica.cli("INFO", "replication")
            ),
            30,
            "the sentinel to see the replica",
        )
        yield primary, replica, watcher
    finally:
        for proc in procs:
            proc.stop()


async def test_sentinel_client_follows_a_failover(
    sentinel: tuple[RedisServer, RedisServer, RedisServer],
) -> None:
    from redis.asyncio.sentinel import Sentinel

    primary, replica, watcher = sentinel
    sentinels = Sentinel([("127.0.0.1", watcher.port)], socket_timeout=2)  # type: ignore[no-untyped-call, unused-ignore]
    client = sentinels.master_for("mymaster")
    backend = RedisBackend(client=client, prefix="st:")
    await backend.start()
    try:
        [before] = await backend.claim([claim_request(slot=None)])
        assert before.ticket is not None and before.ticket.fence is not None
        await backend.finish(before.ticket, RunStatus.SUCCEEDED, None)
        wait_until(
            lambda: replica.cli("HLEN", "st:{job}:runs") == "1", 10, "replication of the run"
        )

        watcher.cli("SENTINEL", "FAILOVER", "mymaster")
        # Until the old primary is demoted it still takes writes, which the failover then
        # discards (Redis replicates asynchronously; the docs say so): wait for both ends.
        wait_until(
            lambda: (
                "role:master" in replica.cli("INFO", "replication")
                and "role:slave" in primary.cli("INFO", "replication")
            ),
            30,
            "the failover",
        )
        began = time.monotonic()
        while True:  # transient errors (READONLY, reconnects) until the client follows
            try:
                [after] = await backend.claim([claim_request(slot=None)])
                break
            except BackendUnavailable:
                assert time.monotonic() - began < 30, "the backend never followed the failover"
                await asyncio.sleep(0.2)
        assert after.status is ClaimStatus.WON and after.ticket is not None
        assert after.ticket.fence is not None and after.ticket.fence > before.ticket.fence
        assert replica.cli("HLEN", "st:{job}:runs") == "2"
        history = await backend.history("job")
        assert [r.run_id for r in history] == [after.run.run_id, before.run.run_id]
    finally:
        await backend.stop()
        await client.aclose()
        for connection in sentinels.sentinels:
            await connection.aclose()
