"""History at size: ``history(limit=100)``, ``last_run`` and ``explain`` of a job with
10 000, 100 000 and 1 000 000 recorded runs on SQLite and PostgreSQL, and the longest pause of
a per-second job's claim and finish while pruning removes the excess.

    python -m bench.history [--sizes 10000,100000,1000000] [--backends sqlite,postgres]
                            [--samples 200] [--cycles 60] [--out f.json]
    python -m bench --only history              # the same, as a section of make bench

One per-second job's runs are generated in the store in one ``INSERT ... SELECT`` (SQLite: a
recursive series; PostgreSQL: ``generate_series``, then ``ANALYZE``, as autovacuum would), grown
to each size in turn. At each size the four reads are called in turn, ``--samples`` times each
after a warm-up: ``history(limit=100)``, ``last_run``, and ``explain`` of a slot a minute old
and of the oldest slot but one (each through the backend's public calls, on a backend that
keeps up to 1 000 000 slots, so nothing is pruned). Then, at the largest size, a backend with
the default ``history_size`` (1 000) runs the per-second job's next ``--cycles`` slots, a
claim and a finish each, 10 a second: each result prunes the 100 oldest slots; the longest
claim plus finish is the pause. Standalone, PostgreSQL is the test server
(``$ANARCHON_TEST_POSTGRES``) in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anarchon import PostgresBackend, SQLiteBackend, Trigger
from anarchon.backend import ClaimRequest, LeaseBackend
from anarchon.explain import explain
from anarchon.registry import JobDefinition

from .stats import percentile

if TYPE_CHECKING:
    from .context import Context

JOB = "per-second"
FIRST = 1_700_000_000_000
"""The first slot (2023-11-14T22:13:20Z); slot n is FIRST + n seconds."""
PER_SECOND = JobDefinition(name=JOB, expression="* * * * * *", zone="UTC")
KEEP_ALL = 1_000_000
"""The readers' history_size: nothing read is pruned."""
PRUNE_EVERY_S = 0.1
LIMIT_S = 1_800.0
"""The section's process is killed after this long."""
PG_DEFAULT = os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")

SQLITE_FILL = """
INSERT INTO anarchon_runs (job, slot_key, attempt, slot, run_id, token, instance, trigger,
                           status, fence, started_at, finished_at, lease_expires_at, released)
WITH RECURSIVE n(i) AS (SELECT :start UNION ALL SELECT i + 1 FROM n WHERE i < :stop - 1)
SELECT :job, CAST(:first + i * 1000 AS TEXT), 1, :first + i * 1000, 'r' || i, 't' || i,
       'w' || (i % 3), 'schedule', CASE WHEN i % 500 = 0 THEN 'failed' ELSE 'succeeded' END,
       i + 1, :first + i * 1000 + 5, :first + i * 1000 + 50, NULL, 0
FROM n
"""
PG_FILL = """
INSERT INTO {runs} (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                    fence, started_at, finished_at, lease_expires_at, released)
SELECT %(job)s, s::text, 1, s, 'r' || i, 't' || i, 'w' || (i %% 3), 'schedule',
       CASE WHEN i %% 500 = 0 THEN 'failed' ELSE 'succeeded' END, i + 1, s + 5, s + 50, NULL,
       false
FROM generate_series(%(start)s::bigint, %(stop)s::bigint - 1) AS i
CROSS JOIN LATERAL (SELECT %(first)s::bigint + i * 1000 AS s) AS slot
"""


class Store:
    """One backend's store: how to make its backends and grow the job's history."""

    def __init__(self, name: str, make: Callable[[int], LeaseBackend]) -> None:
        self.name = name
        self.make = make
        self.rows = 0

    async def grow(self, size: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Remove what the store made (a standalone PostgreSQL schema)."""


class SQLiteStore(Store):
    def __init__(self, path: Path) -> None:
        super().__init__("sqlite", lambda keep: SQLiteBackend(path, history_size=keep))
        self.path = path

    async def grow(self, size: int) -> None:
        params = {"start": self.rows, "stop": size, "job": JOB, "first": FIRST}
        with closing(sqlite3.connect(self.path)) as conn, conn:
            conn.execute(SQLITE_FILL, params)
        self.rows = size


class PostgresStore(Store):
    def __init__(self, dsn: str, schema: str, drop: bool) -> None:
        super().__init__(
            "postgres",
            lambda keep: PostgresBackend(dsn, schema=schema, history_size=keep, max_connections=2),
        )
        self.dsn, self.schema, self.drop = dsn, schema, drop

    async def grow(self, size: int) -> None:
        import psycopg
        from psycopg import sql

        runs = sql.Identifier(self.schema, "anarchon_runs")
        params = {"start": self.rows, "stop": size, "job": JOB, "first": FIRST}
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL(PG_FILL).format(runs=runs), params)
            await conn.execute(sql.SQL("ANALYZE {}").format(runs))
        self.rows = size

    async def close(self) -> None:
        if not self.drop:
            return
        import psycopg
        from psycopg import sql

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
            )


def _ms(samples: list[float]) -> dict[str, float | None]:
    return {
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
        "max_ms": max(samples, default=None),
    }


async def _reads(
    backend: LeaseBackend, size: int, samples: int
) -> dict[str, dict[str, float | None]]:
    """p50, p99 and max of each read, called in turn ``samples`` times after 10 warm-ups."""
    last = FIRST + (size - 1) * 1000
    now = last + 120_000
    recent, old = last - 60_000, FIRST + 1000

    async def explain_at(slot: int) -> None:
        fate = await explain(backend, JOB, slot, definition=PER_SECOND, now_ms=now)
        assert fate.fate.value == "ran", fate.describe()

    async def history() -> None:
        assert len(await backend.history(JOB, limit=100)) == 100

    async def last_run() -> None:
        assert await backend.last_run(JOB) is not None

    reads: dict[str, Callable[[], Awaitable[None]]] = {
        "history(limit=100)": history,
        "last_run": last_run,
        "explain, a recent slot": lambda: explain_at(recent),
        "explain, the oldest slot": lambda: explain_at(old),
    }
    times: dict[str, list[float]] = {name: [] for name in reads}
    for n in range(samples + 10):
        for name, call in reads.items():
            began = time.perf_counter()
            await call()
            if n >= 10:
                times[name].append((time.perf_counter() - began) * 1000)
    return {name: _ms(found) for name, found in times.items()}


async def _prune(store: Store, cycles: int) -> dict[str, Any]:
    """The per-second job's next ``cycles`` slots on a backend keeping 1 000 slots: the claim
    and finish times while each result prunes."""
    backend = store.make(1000)
    await backend.start()
    claims: list[float] = []
    finishes: list[float] = []
    pauses: list[float] = []
    rows = store.rows
    try:
        for n in range(cycles):
            slot = FIRST + (store.rows + n) * 1000
            request = ClaimRequest(
                job=JOB,
                slot=slot,
                run_id=uuid.uuid4().hex,
                token=uuid.uuid4().hex,
                instance="bench",
                trigger=Trigger.SCHEDULE,
                lease_ms=30_000,
            )
            began = time.perf_counter()
            [won] = await backend.claim([request])
            claimed = time.perf_counter()
            assert won.ticket is not None, won
            await backend.finish(won.ticket, "succeeded", None)
            done = time.perf_counter()
            claims.append((claimed - began) * 1000)
            finishes.append((done - claimed) * 1000)
            pauses.append((done - began) * 1000)
            rows += 1 - min(100, max(0, rows + 1 - 1000))  # what this result pruned
            await asyncio.sleep(PRUNE_EVERY_S)
        history = await backend.history(JOB, limit=100)
        assert history[0].slot_ms == FIRST + (store.rows + cycles - 1) * 1000
    finally:
        await backend.stop()
    return {
        "backend": store.name,
        "rows": store.rows,
        "history_size": 1000,
        "cycles": cycles,
        "claim": _ms(claims),
        "finish": _ms(finishes),
        "pause": _ms(pauses),
        "rows_after": rows,
    }


async def _one(store: Store, sizes: list[int], samples: int, cycles: int) -> dict[str, Any]:
    out: dict[str, Any] = {"reads": [], "prune": None}
    setup = store.make(KEEP_ALL)
    await setup.start()
    await setup.stop()
    for size in sizes:
        began = time.perf_counter()
        await store.grow(size)
        fill_s = time.perf_counter() - began
        backend = store.make(KEEP_ALL)
        await backend.start()
        try:
            reads = await _reads(backend, size, samples)
        finally:
            await backend.stop()
        for name, figures in reads.items():
            out["reads"].append(
                {"backend": store.name, "rows": size, "read": name, "fill_s": fill_s, **figures}
            )
        line = ", ".join(f"{name} p99 {f['p99_ms'] or 0:.2f} ms" for name, f in reads.items())
        print(f"{store.name} {size:,} rows (filled in {fill_s:.1f} s): {line}", flush=True)
    if cycles:
        out["prune"] = await _prune(store, cycles)
        p = out["prune"]
        print(
            f"{store.name} pruning at {p['rows']:,} rows: pause max {p['pause']['max_ms']} ms "
            f"(claim max {p['claim']['max_ms']}, finish max {p['finish']['max_ms']})",
            flush=True,
        )
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every backend asked for; print the figures and return them."""
    sizes = sorted(int(s) for s in args.sizes.split(","))
    answer: dict[str, Any] = {
        "sizes": sizes,
        "samples": args.samples,
        "cycles": args.cycles,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": _load(),
        "reads": [],
        "prune": [],
        "errors": {},
    }
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-history-") as folder:
        for name in args.backends.split(","):
            store: Store
            if name == "sqlite":
                store = SQLiteStore(Path(args.sqlite or Path(folder) / "history.db"))
            elif name == "postgres":
                schema = args.pg_schema or f"anarchon_bench_history_{uuid.uuid4().hex[:8]}"
                store = PostgresStore(args.pg_dsn, schema, drop=args.pg_schema is None)
            else:
                raise SystemExit(f"unknown backend {name!r}: sqlite or postgres")
            try:
                found = await _one(store, sizes, args.samples, args.cycles)
            except Exception as exc:  # one backend's failure is reported, the other still runs
                answer["errors"][name] = f"{type(exc).__name__}: {exc}"
                print(f"{name}: {answer['errors'][name]}", flush=True)
                continue
            finally:
                await store.close()
            answer["reads"] += found["reads"]
            if found["prune"] is not None:
                answer["prune"].append(found["prune"])
    answer["load_end"] = _load()
    return answer


async def measure(ctx: Context) -> dict[str, Any]:
    """The section of ``python -m bench``: this module in a process of its own, on the run's
    SQLite folder and PostgreSQL database, sized by the run's settings."""

    from .fleet import run_to_json

    settings = ctx.settings
    backends = [t.name for t in ctx.available(lease=True) if t.name in ("sqlite", "postgres")]
    if not backends:
        return {"error": "neither SQLite nor PostgreSQL is available"}
    sizes = ",".join(str(n) for n in settings.history_sizes)
    ctx.say(f"history: {sizes} runs on {', '.join(backends)}")
    argv = [
        "bench.history",
        "--sizes",
        sizes,
        "--backends",
        ",".join(backends),
        "--samples",
        str(settings.history_samples),
        "--cycles",
        str(settings.history_prune_cycles),
        "--sqlite",
        str(ctx.dir("history") / "history.db"),
        "--pg-dsn",
        ctx.services.pg_dsn(),
        "--pg-schema",
        "history",
    ]
    return await run_to_json("history", argv, ctx.dir("history"), LIMIT_S)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="History at size: reads and pruning.")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--sqlite", help="the SQLite file (default: a temporary one)")
    parser.add_argument("--pg-dsn", default=PG_DEFAULT)
    parser.add_argument("--pg-schema", help="default: a schema of its own, dropped at the end")
    parser.add_argument("--out", help="write the figures there as JSON too")
    options = parser.parse_args()
    result = asyncio.run(collect(options))
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1))
