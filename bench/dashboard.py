"""7. Dashboard: its server time: the jobs page with 10 000 jobs and the
timeline of a year of a per-minute job, on SQLite.

    python -m bench.dashboard [--jobs 10000] [--runs 12000] [--repeat 7] [--out f.json]
    python -m bench --only dashboard          # the same, as a section of make bench

Each request goes through the whole ASGI application in process (routing, backend reads,
template rendering), without a network; the figures are the wall time of that call and the
process's CPU time during it (the wall time grows on a machine busy with other work). The first
call (templates compiled, connections opened) is reported apart. ``make bench`` runs it in a
process of its own (:func:`measure`), so the runner's own sampling never counts in its CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anarchon import RunStatus, SQLiteBackend, Trigger
from anarchon.backend import ClaimRequest, FinishRequest
from anarchon.registry import InstanceRecord, JobDefinition, record_instance
from anarchon.web import dashboard

from .report import JOBS_PAGE_TARGET_MS, TIMELINE_YEAR_TARGET_MS

if TYPE_CHECKING:
    from .context import Context

EXPRESSIONS = ("*/5 * * * *", "0 * * * *", "30 3 * * *", "* * * * *", "15 */2 * * *")
MINUTE = 60_000
CPU: list[float] = []
REGISTRY_TTLS = (0, 1_000)
"""Every page reads the registry; the default (pages within a second share one read)."""
LIMIT_S = 900.0
"""The section's process is killed after this long."""


async def call(app: Any, path: str) -> tuple[int, bytes, float]:
    """GET ``path`` through the ASGI app; (status, body, seconds)."""
    target, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": target,
        "raw_path": target.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    started = time.perf_counter()
    cpu = time.process_time()
    await app(scope, receive, send)
    took = time.perf_counter() - started
    CPU.append(time.process_time() - cpu)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, took


async def seed(backend: SQLiteBackend, jobs: int, runs: int) -> None:
    now = int(time.time() * 1000)
    names = [f"job-{n:05d}" for n in range(jobs)]
    definitions = (
        *(
            JobDefinition(name=name, expression=EXPRESSIONS[n % len(EXPRESSIONS)], zone="UTC")
            for n, name in enumerate(names)
        ),
        JobDefinition(name="per-minute", expression="* * * * *", zone="UTC"),
    )
    store = backend.registry()
    for i in range(3):
        await record_instance(
            store,
            InstanceRecord(
                id=f"w{i}",
                host="bench",
                pid=1000 + i,
                version="0.1.0",
                started_ms=now - 3_600_000,
                heartbeat_ms=now,
                interval_ms=5_000,
                clock_offset_ms=3,
                jobs=definitions,
            ),
        )
    # History for the first page of jobs (the rows the page reads), and a long one for the
    # per-minute job.
    plan = [(name, now - (k + 1) * 5 * MINUTE) for name in names[:50] for k in range(20)]
    top = now // MINUTE * MINUTE
    plan += [("per-minute", top - k * MINUTE) for k in range(runs)]
    for start in range(0, len(plan), 500):
        batch = plan[start : start + 500]
        requests = [
            ClaimRequest(
                job=job,
                slot=slot,
                run_id=uuid.uuid4().hex,
                token=uuid.uuid4().hex,
                instance=f"w{n % 3}",
                trigger=Trigger.SCHEDULE,
                lease_ms=60_000,
            )
            for n, (job, slot) in enumerate(batch)
        ]
        outcomes = await backend.claim(requests)
        finish = [
            FinishRequest(o.ticket, RunStatus.FAILED if n % 7 == 0 else RunStatus.SUCCEEDED, None)
            for n, o in enumerate(outcomes)
            if o.ticket is not None
        ]
        await backend.finish_many(finish)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a database, time every page under each registry TTL; print and return the rows."""
    answer: dict[str, Any] = {
        "jobs": args.jobs,
        "runs": args.runs,
        "repeat": args.repeat,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": _load(),
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-web-") as folder:
        path = Path(folder) / "cron.db"
        writer = SQLiteBackend(path)
        await writer.start()
        started = time.perf_counter()
        await seed(writer, args.jobs, args.runs)
        await writer.stop()
        answer["seed_s"] = time.perf_counter() - started
        print(f"seeded {args.jobs} jobs, {args.runs} runs in {answer['seed_s']:.1f} s")
        for ttl in REGISTRY_TTLS:
            print(
                f"registry_ttl_ms={ttl}"
                + (
                    " (every page reads the registry)"
                    if not ttl
                    else " (the default: pages within a second share one registry read)"
                )
            )
            answer["rows"] += await pages(path, args, ttl)
    answer["load_end"] = _load()
    return answer


async def pages(path: Path, args: argparse.Namespace, ttl: int) -> list[dict[str, Any]]:
    """Each page once (the first call), then ``args.repeat`` times; one row per page."""
    app = dashboard(SQLiteBackend(path), refresh_ms=0, registry_ttl_ms=ttl)
    rows = []
    for label, url, target in (
        (f"jobs page, {args.jobs} jobs (page 1 of 50 rows)", "/", JOBS_PAGE_TARGET_MS),
        (f"jobs page, {args.jobs} jobs, search 'job-09'", "/?q=job-09", JOBS_PAGE_TARGET_MS),
        (
            "timeline, a year of a per-minute job",
            "/jobs/per-minute?range=365d",
            TIMELINE_YEAR_TARGET_MS,
        ),
        ("timeline, a day of a per-minute job", "/jobs/per-minute?range=24h", None),
    ):
        status, body, first = await call(app, url)
        assert status == 200, body[:500]
        CPU.clear()
        times = [(await call(app, url))[2] for _ in range(args.repeat)]
        row = {
            "page": label,
            "path": url,
            "registry_ttl_ms": ttl,
            "median_ms": statistics.median(times) * 1e3,
            "cpu_ms": statistics.median(CPU) * 1e3,
            "max_ms": max(times) * 1e3,
            "first_ms": first * 1e3,
            "kib": len(body) / 1024,
            "target_ms": target,
        }
        rows.append(row)
        print(
            f"{label}: median {row['median_ms']:.0f} ms (CPU {row['cpu_ms']:.0f} ms), "
            f"max {row['max_ms']:.0f} ms, first {row['first_ms']:.0f} ms "
            f"({len(body) // 1024} KiB)"
        )
    await app.state.dashboard.source.close()
    return rows


async def measure(ctx: Context) -> dict[str, Any]:
    """The section of ``python -m bench``: this module in a process of its own, sized by the
    run's settings; its rows, or ``{"error": ...}``."""

    from .fleet import run_to_json

    settings = ctx.settings
    ctx.say(
        f"dashboard: {settings.dashboard_jobs} jobs, {settings.dashboard_runs} runs, "
        f"{settings.dashboard_repeat} calls per page"
    )
    argv = [
        "bench.dashboard",
        "--jobs",
        str(settings.dashboard_jobs),
        "--runs",
        str(settings.dashboard_runs),
        "--repeat",
        str(settings.dashboard_repeat),
    ]
    return await run_to_json("dashboard", argv, ctx.dir("dashboard"), LIMIT_S)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=12_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", help="write the rows there as JSON too")
    options = parser.parse_args()
    result = asyncio.run(collect(options))
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1))
