"""The runner: namespaces, backend rows, the seven measurements in order, the report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from . import (
    burst,
    claim_rate,
    claims,
    curves,
    dashboard,
    failover,
    fire_lag,
    history,
    idle,
    peers_bench,
    report,
)
from .context import Context
from .fleet import ROOT, stop_everything
from .footprint import Footprint
from .services import BACKENDS, NATS, Services, Target
from .services import SHARED_REDIS as SHARED
from .settings import FULL, QUICK

SECTIONS = (
    "fire",
    "burst",
    "rate",
    "idle",
    "failover",
    "peers",
    "dashboard",
    "history",
    "curves",
    "claims",
)
BENCH = ROOT / "bench"
DEFAULT_PEERS = BENCH / ".venv-peers" / "bin" / "python"
_NO = Target("none", False)
PEER_PACKAGES = ("arq", "procrastinate", "APScheduler", "SQLAlchemy", "redis", "psycopg")


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _peer_versions(python: str | None) -> dict[str, str]:
    if python is None:
        return {}
    code = (
        "import importlib.metadata as m, json;"
        f"print(json.dumps({{n: m.version(n) for n in {list(PEER_PACKAGES)!r}}}))"
    )
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
        found: dict[str, str] = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return {f"{k} (peers venv)": v for k, v in found.items()}


async def _server_versions(targets: dict[str, Any], services: Services) -> dict[str, str]:
    out: dict[str, str] = {}
    if targets.get("postgres") and targets["postgres"].available:
        with contextlib.suppress(Exception):
            import psycopg

            async with await psycopg.AsyncConnection.connect(services.pg_dsn()) as conn:
                cur = await conn.execute("SHOW server_version")
                row = await cur.fetchone()
                out["PostgreSQL"] = str(row[0]).split()[0] if row else "?"
    if targets.get("redis") and targets["redis"].available:
        with contextlib.suppress(Exception):
            from redis.asyncio import Redis

            client = Redis.from_url(services.redis_url())
            try:
                version = (await client.info("server"))["redis_version"]
                where = "shared" if services.redis_server == SHARED else "private"
                out["Redis"] = f"{version} ({where})"
            finally:
                await client.aclose()
    if targets.get("nats") and targets["nats"].available:
        with contextlib.suppress(Exception):
            import nats

            nc = await nats.connect(servers=[NATS], connect_timeout=3)
            try:
                version = str(nc.connected_server_version)  # "<nats server v2.9.10>"
                out["nats-server"] = version.strip("<>").removeprefix("nats server v")
            finally:
                await nc.close()
    return out


def _prune_old_runs(work: Path, keep: Path) -> None:
    if not work.exists():
        return
    for path in work.iterdir():
        if path.is_dir() and path.name.startswith("run-") and path != keep:
            shutil.rmtree(path, ignore_errors=True)


# The sections measured by one call each, under their own name in the results.
MEASURES: dict[str, Callable[[Context], Awaitable[Any]]] = {
    "burst": burst.measure,
    "rate": claim_rate.measure,
    "peers": peers_bench.measure,
    "dashboard": dashboard.measure,
    "history": history.measure,
    "curves": curves.measure,
    "claims": claims.measure,
}


async def _measure(
    ctx: Context, sections: list[str], results: dict[str, Any], footprint: Footprint
) -> None:
    """The measurements, in order; each section's result goes into ``results``."""

    idle_done = False
    for name in SECTIONS:
        if name not in sections:
            continue
        if name == "fire":
            footprint.section = "fire"
            results["floor"] = await fire_lag.floors(ctx)
            results["fire"] = await fire_lag.measure(ctx)
        elif name in ("idle", "failover"):
            if idle_done:
                continue  # one step measures both: the idle instance idles through failover
            idle_done = True
            footprint.section = "idle+failover"
            idling = await idle.start(ctx) if "idle" in sections else None
            if "failover" in sections:
                results["failover"] = await failover.measure(ctx)
            if idling is not None:
                results["idle"] = await idle.finish(ctx, idling)
        else:
            footprint.section = name
            results[name] = await MEASURES[name](ctx)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = QUICK if args.quick else FULL
    if args.idle_jobs is not None:
        if args.idle_jobs < 1:
            raise SystemExit(f"--idle-jobs {args.idle_jobs}: give at least 1 job")
        settings = dataclasses.replace(settings, idle_jobs=args.idle_jobs)
    sections = args.only.split(",") if args.only else list(SECTIONS)
    backends = args.backends.split(",") if args.backends else list(BACKENDS)
    for name in sections:
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
    for name in backends:
        if name not in BACKENDS:
            raise SystemExit(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    work_root = Path(args.work)
    services = Services(work_root)
    work = work_root / f"run-{services.token}"
    services.dir = work / "db"
    _prune_old_runs(work_root, work)
    peers_python = args.peers_python or (str(DEFAULT_PEERS) if DEFAULT_PEERS.exists() else None)
    ctx = Context(settings, services, {}, work, peers_python)
    results: dict[str, Any] = {
        "meta": {
            "command": " ".join(["python -m bench", *sys.argv[1:]]),
            "mode": settings.name,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "load_start": _load(),
            "versions": {
                "Python": platform.python_version(),
                "anarchon": _version("anarchon"),
                "redis-py": _version("redis"),
                "psycopg": _version("psycopg"),
                "nats-py": _version("nats-py"),
            },
        },
        "sections": sections,
    }
    began = time.monotonic()
    try:
        ctx.say(f"{settings.name} run, sections {', '.join(sections)}; work in {work}")
        ctx.targets = await services.open(backends)
        for target in ctx.targets.values():
            ctx.say(f"{target.name}: {target.status}")
        results["targets"] = {
            n: {"available": t.available, "reason": t.reason, "lease": t.lease}
            for n, t in ctx.targets.items()
        }
        results["meta"]["versions"].update(await _server_versions(ctx.targets, services))
        if "peers" in sections:
            results["meta"]["versions"].update(_peer_versions(peers_python))
        footprint = Footprint(
            services.redis_url() if ctx.targets.get("redis", _NO).available else None,
            services.pg_dsn() if ctx.targets.get("postgres", _NO).available else None,
            services.pg_db,
        )
        watcher = asyncio.ensure_future(footprint.run())
        try:
            await _measure(ctx, sections, results, footprint)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            results["footprint"] = footprint.peaks
    finally:
        stop_everything()
        results["cleanup_problems"] = await services.close()
        results["meta"]["elapsed_s"] = time.monotonic() - began
        results["meta"]["load_end"] = _load()
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer samples, shorter windows")
    p.add_argument(
        "--idle-jobs", type=int, help="jobs of the idle section's instance (default: the mode's)"
    )
    p.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)}")
    p.add_argument("--backends", help=f"comma-separated backends: {','.join(BACKENDS)}")
    p.add_argument("--out", default=str(BENCH / "results.md"))
    p.add_argument("--plot", default=str(BENCH / "lag.png"))
    p.add_argument("--work", default=str(BENCH / ".work"))
    p.add_argument("--peers-python", help="interpreter of the peers' venv")
    args = p.parse_args(argv)

    async def guarded() -> dict[str, Any]:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await run(args)

    try:
        results = asyncio.run(guarded())
    except asyncio.CancelledError:
        stop_everything()
        print(
            "bench interrupted; its processes were stopped and namespaces removed", file=sys.stderr
        )
        raise SystemExit(130) from None
    work = Path(args.work)
    (work / "last-results.json").write_text(json.dumps(results, indent=1, default=str))
    text = report.markdown(results)
    if report.plot(results, Path(args.plot)):
        print(f"[bench] plot: {args.plot}", file=sys.stderr)
    curve = Path(args.plot).with_name("history.png")
    if report.plot_history(results, curve):
        print(f"[bench] plot: {curve}", file=sys.stderr)
    for path in curves.plots(results, Path(args.plot).parent):
        print(f"[bench] plot: {path}", file=sys.stderr)
    Path(args.out).write_text(text + "\n")
    print(text)
    print(f"[bench] tables: {args.out}", file=sys.stderr)
