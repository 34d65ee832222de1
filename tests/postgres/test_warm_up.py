"""Every connection of the backend's own pool is ready for claims before the pool hands it out.

A session compiles the claim function and plans its statements the first time it runs them, and
psycopg prepares the claim's statement once per connection; the pool hands its connections out
in turn, so without a warm-up an instant's winner was often on a connection that had never won
a claim (8.3 ms for 17 requests where a warm one took 1.7 ms). The warm-up runs each of the
function's paths on made-up jobs in a transaction rolled back: it must leave no record, no job
row, no notice and no open transaction behind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from anarchon import Trigger
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from tests.backends.postgres import DSN
from tests.records import claim_request

SLOT = 1_800_000_000_000
# The memory contexts of a session (pg_backend_memory_contexts shows the current session's
# own): the compiled claim function, and the claim statement psycopg prepared.
READY = """
SELECT
    (SELECT count(*) FROM pg_backend_memory_contexts
     WHERE name = 'PL/pgSQL function' AND ident LIKE %(function)s) AS compiled,
    (SELECT count(*) FROM pg_backend_memory_contexts
     WHERE name = 'CachedPlanSource' AND ident LIKE %(schema)s) AS planned,
    (SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %(function)s) AS prepared,
    current_setting('anarchon.notices', true) AS notices
"""


async def _pool_connections(backend: PostgresBackend, n: int) -> list[dict[str, Any]]:
    """What each of ``n`` connections of the backend's pool (new ones, the pool grown to ``n``)
    has ready, looked at on the connection itself."""
    pool = backend._db._pool
    assert pool is not None
    conns = [await pool.getconn() for _ in range(n)]
    names = backend._queries.names
    params = {
        "function": f"%{names.schema}%{names.prefix}claim%",
        "schema": f"%{names.schema}%",
    }
    try:
        seen = []
        for conn in conns:
            cur = await conn.execute(READY, params, prepare=False)
            row = await cur.fetchone()
            assert row is not None
            seen.append(dict(zip(("compiled", "planned", "prepared", "notices"), row, strict=True)))
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        return seen
    finally:
        for conn in conns:
            await pool.putconn(conn)


def _warmed(seen: dict[str, Any]) -> bool:
    # The function's statements planned in the session, the batch's statement prepared by psycopg.
    return bool(seen["planned"] >= 10 and seen["prepared"] >= 1)


async def test_every_connection_of_the_pool_is_warmed(
    make: Callable[..., PostgresBackend],
) -> None:
    backend = make(max_connections=3)
    await backend.start()  # a new schema: the first connection is warmed after the migrations
    for seen in await _pool_connections(backend, 3):
        assert _warmed(seen), seen
        assert seen["notices"] in (None, ""), seen
    # The lease keeper's copy renews leases only: not warmed.
    clone = backend.clone()
    assert clone is not None
    await clone.start()
    try:
        [seen] = await _pool_connections(clone, 1)
    finally:
        await clone.stop()
    assert seen["planned"] == 0 and seen["prepared"] == 0, seen


async def test_warm_up_leaves_nothing(make: Callable[..., PostgresBackend], schema: str) -> None:
    first = make(max_connections=3)
    await first.start()
    await first.stop()
    backend = make(max_connections=3)
    names = backend._queries.names
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{names.channel}"')
        await backend.start()  # an existing schema: each connection warmed by the pool
        assert all(_warmed(seen) for seen in await _pool_connections(backend, 3))
        cur = await listener.execute(
            f'SELECT (SELECT count(*) FROM "{schema}"."{names.prefix}runs"),'
            f' (SELECT count(*) FROM "{schema}"."{names.prefix}jobs")'
        )
        assert await cur.fetchone() == (0, 0)
        heard = [notice async for notice in listener.notifies(timeout=0.3)]
        assert heard == []
    # The connections claim as usual: a batch won on each at once, every slot once.
    outcomes = await asyncio.gather(
        *(
            backend.claim(
                [
                    ClaimRequest(
                        job=f"job{j}",
                        slot=SLOT + n,
                        run_id=uuid.uuid4().hex,
                        token=uuid.uuid4().hex,
                        instance="i0",
                        trigger=Trigger.SCHEDULE,
                        lease_ms=60_000,
                    )
                    for j in range(3)
                ]
            )
            for n in range(3)
        )
    )
    assert [o.status for batch in outcomes for o in batch] == [ClaimStatus.WON] * 9


async def test_a_warm_up_that_waits_gives_up(
    make: Callable[..., PostgresBackend], schema: str
) -> None:
    """A warm-up that waits for a lock (a migration under way elsewhere) gives up after
    WARM_UP_LIMIT_MS, at most half of timeout_ms: start() still opens its pool in time (its
    connection tried twice, by the pool and after the migrations, 0.5 s each), where a warm-up
    without a limit held the pool's first connection past timeout_ms and start() failed."""
    first = make()
    await first.start()
    await first.stop()
    names = first._queries.names
    async with await psycopg.AsyncConnection.connect(DSN) as holder:
        await holder.execute(f'LOCK TABLE "{schema}"."{names.prefix}runs" IN ACCESS EXCLUSIVE MODE')
        backend = make(timeout_ms=1_000)
        started = time.monotonic()
        await backend.start()
        assert time.monotonic() - started < 1.5
        await holder.rollback()
    [won] = await backend.claim([claim_request("job", SLOT, "i0", lease_ms=60_000)])
    assert won.status is ClaimStatus.WON
