# ruff: noqa: RUF001, RUF002 - the report uses typographic dashes, minus and multiplication signs
"""The soak: three real instances × 1 000 jobs per backend, for an hour, watched.

    python -m bench.soak                        # 60 minutes, every backend at once
    python -m bench.soak --minutes 15 --backends redis,postgres

Every backend runs at the same time (one fleet of ``--instances`` processes per backend, each a
:mod:`bench.soak_worker`), so an hour is an hour whatever the number of backends. Each instance
registers the same ``--jobs`` jobs; job ``n`` is due every ``--period`` minutes at second
``n % 60`` and minute offset ``(n // 60) % period`` (default options), so the slots are spread
evenly: 1 000 jobs every 5 minutes is 3.3 slots a second per backend.

Sampled every ``--sample-s`` seconds, per backend (psutil, /proc, and the servers): RSS (mean per
instance), CPU (the instances together, % of one core over the interval), open file
descriptors and client-side sockets (the instances together), server-side connections
(PostgreSQL ``pg_stat_activity`` rows of the soak's database; Redis ``CLIENT LIST`` entries on
the soak's logical database; NATS has no count without its monitoring port, and SQLite no
server) and asyncio tasks (the instances together, reported by each instance). Each series
gets a verdict by :mod:`bench.drift`. Every slot due between the start and the end is counted:
missed (no start) and duplicates (more than one first attempt) must both be 0.

Writes ``bench/soak.md`` (the tables), ``bench/soak.png`` (the series over time) and the raw
samples to ``bench/.work/soak-last.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from . import drift
from .fleet import ROOT, Proc, spawn, stop, stop_everything, wait_ready
from .run import _cpu, _load, _version
from .services import BACKENDS, PG_ADMIN, Services
from .stats import percentile, tally

__all__ = ["SERIES", "Series", "expected_slots", "main"]

BENCH = ROOT / "bench"
READY_LIMIT_S = 300.0
END_MARGIN_S = 5.0
"""Slots due in the last seconds before the stop are not counted (their start may be cut)."""


@dataclass(frozen=True)
class Series:
    """One sampled quantity and its drift rule."""

    title: str
    unit: str
    rule: drift.Rule


SERIES: dict[str, Series] = {
    "rss_mb": Series("RSS per instance (mean)", "MB", drift.Rule(2.0, 0.05)),
    "cpu_pct": Series("CPU, instances together", "% of a core", drift.Rule(1.0, 0.25)),
    "fds": Series("open file descriptors, instances together", "fds", drift.Rule(2.0, 0.05)),
    "sockets": Series(
        "client sockets (psutil), instances together", "sockets", drift.Rule(2, 0.05)
    ),
    "server": Series("server-side connections", "connections", drift.Rule(2.0, 0.05)),
    "tasks": Series("asyncio tasks, instances together", "tasks", drift.Rule(3.0, 0.10)),
}


def expected_slots(jobs: int, period: int, w0: float, w1: float) -> list[tuple[str, int]]:
    """``(job, slot epoch ms)`` of every slot of jobs ``s0 .. s<jobs-1>`` due in ``[w0, w1)``,
    scheduled by :func:`bench.worker.spread_schedule`."""
    out = []
    for minute in range(int(w0 // 60), int(w1 // 60) + 1):
        offset = (minute % 60) % period
        for n in range(offset * 60, jobs, 60 * period):
            for k in range(n, min(n + 60, jobs)):
                t = minute * 60 + k % 60
                if w0 <= t < w1:
                    out.append((f"s{k}", t * 1000))
    return out


@dataclass
class Fleet:
    """One backend's instances and what was sampled from them."""

    backend: str
    procs: list[Proc]
    tasks_files: list[Path]
    samples: list[dict[str, Any]] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)
    _cpu: float = 0.0
    _at: float = 0.0

    def last_tasks(self, path: Path) -> int | None:
        """The newest task count an instance wrote."""
        try:
            lines = path.read_bytes().rstrip().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                return int(json.loads(line)["n"])
        return None


class Servers:
    """Server-side connection counts of the soak's namespaces."""

    def __init__(self, services: Services, backends: list[str]) -> None:
        self.services = services
        self.backends = backends
        self._pg: Any = None
        self._redis: Any = None
        self._redis_id: str | None = None

    async def open(self) -> None:
        if "postgres" in self.backends:
            import psycopg

            with contextlib.suppress(Exception):
                self._pg = await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True)
        if "redis" in self.backends:
            from redis.asyncio import Redis

            with contextlib.suppress(Exception):
                self._redis = Redis.from_url(self.services.redis_url(), socket_timeout=5)
                self._redis_id = str(await self._redis.client_id())  # CLIENT LIST ids are text

    async def count(self, backend: str) -> int | None:
        """Connections the server holds for ``backend``'s namespace (None: cannot tell)."""
        try:
            if backend == "postgres" and self._pg is not None:
                cur = await self._pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                    (self.services.pg_db,),
                )
                row = await cur.fetchone()
                return int(row[0]) if row else None
            if backend == "redis" and self._redis is not None:
                clients = await self._redis.client_list()
                db = str(self.services.redis_db)
                return sum(
                    1
                    for c in clients
                    if str(c.get("db")) == db and str(c.get("id")) != self._redis_id
                )
        except Exception:
            return None
        return None

    async def close(self) -> None:
        if self._pg is not None:
            with contextlib.suppress(Exception):
                await self._pg.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


def _proc_stats(proc: Proc) -> tuple[float, float, int, int] | None:
    """RSS (MB), CPU seconds, descriptors, inet sockets of a live process (None if gone)."""
    if not proc.alive():
        return None
    try:
        ps = proc.ps()
        with ps.oneshot():
            times = ps.cpu_times()
            rss = float(ps.memory_info().rss) / 2**20
            fds = int(ps.num_fds())
            sockets = len(ps.net_connections(kind="inet"))
        return rss, float(times.user + times.system), fds, sockets
    except psutil.Error:
        return None


async def _sample(fleet: Fleet, servers: Servers, t0: float) -> None:
    now = time.time()
    stats = [s for s in (_proc_stats(p) for p in fleet.procs) if s is not None]
    cpu = sum(s[1] for s in stats)
    tasks = [fleet.last_tasks(path) for path in fleet.tasks_files]
    row: dict[str, Any] = {
        "t": now - t0,
        "alive": len(stats),
        "rss_mb": sum(s[0] for s in stats) / len(stats) if stats else None,
        "cpu_pct": (cpu - fleet._cpu) / (now - fleet._at) * 100 if fleet._at else None,
        "fds": sum(s[2] for s in stats),
        "sockets": sum(s[3] for s in stats),
        "server": await servers.count(fleet.backend),
        "tasks": sum(n for n in tasks if n is not None)
        if any(n is not None for n in tasks)
        else None,
    }
    fleet._cpu, fleet._at = cpu, now
    fleet.samples.append(row)


def _spawn(services: Services, backend: str, args: argparse.Namespace, work: Path) -> Fleet:
    spec = [{"prefix": "s", "count": args.jobs, "schedule": f"spread:{args.period}"}]
    url = services.url(backend, "soak")
    procs, tasks = [], []
    for i in range(args.instances):
        tasks_file = work / f"{backend}-{i}.tasks.jsonl"
        tasks_file.unlink(missing_ok=True)
        argv = [
            "bench.soak_worker",
            "--tasks",
            str(tasks_file),
            "--sample-s",
            str(args.sample_s),
            "--url",
            url,
            "--spec",
            json.dumps(spec),
            "--instance",
            f"soak-{backend}-{i}",
            "--seconds",
            str(args.minutes * 60 + READY_LIMIT_S + 120),
            "--flush-ms",
            "1000",
        ]
        procs.append(spawn(f"{backend}-{i}", argv, work))
        tasks.append(tasks_file)
    return Fleet(backend, procs, tasks)


def _say(began: float, message: str) -> None:
    print(f"[soak {time.monotonic() - began:7.1f}s] {message}", file=sys.stderr, flush=True)


def _slots(fleet: Fleet, args: argparse.Namespace, w0: float, w1: float) -> dict[str, Any]:
    """Missed and duplicate runs of the slots due in ``[w0, w1)``; duplicates over the run."""
    starts = [r for p in fleet.procs for r in p.starts()]
    result = tally(expected_slots(args.jobs, args.period, w0, w1), starts)
    firsts = Counter((r["j"], r["s"]) for r in starts if r.get("a", 1) == 1)
    problems: Counter[str] = Counter()
    for proc in fleet.procs:
        problems.update(proc.log_problems())
    exits = [r for p in fleet.procs for r in p.records() if r.get("e") == "exit"]
    return {
        "expected": result.expected,
        "ran": result.ran,
        "missed": result.missed,
        "duplicates": result.duplicates,
        "duplicates_all": sum(n - 1 for n in firsts.values() if n > 1),
        "starts": len(starts),
        "p50_ms": percentile(result.lags_ms, 50),
        "p99_ms": percentile(result.lags_ms, 99),
        "max_ms": max(result.lags_ms) if result.lags_ms else None,
        "winners": sorted(result.by_pid.values(), reverse=True),
        "clean_exits": len(exits),
        "warnings": sum(problems.values()),
        "top_warnings": problems.most_common(3),
        "exited_early": fleet.exits,
    }


def _verdicts(fleet: Fleet, warmup_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, series in SERIES.items():
        points = [(s["t"], float(s[key])) for s in fleet.samples if s.get(key) is not None]
        result = drift.drift(points, series.rule, warmup_s)
        out[key] = None if result is None else {**result.__dict__, "ok": result.ok}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    work_root = Path(args.work)
    services = Services(work_root)
    work = work_root / f"soak-{services.token}"
    services.dir = work / "db"
    results: dict[str, Any] = {
        "meta": {
            "command": " ".join(["python -m bench.soak", *sys.argv[1:]]),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "load_start": _load(),
            "versions": {
                n: _version(n) for n in ("anarchon", "redis", "psycopg", "psycopg-pool", "nats-py")
            },
            "minutes": args.minutes,
            "instances": args.instances,
            "jobs": args.jobs,
            "period_min": args.period,
            "sample_s": args.sample_s,
            "warmup_s": args.warmup_s,
        },
        "backends": {},
    }
    fleets: list[Fleet] = []
    servers = Servers(services, args.backends)
    try:
        targets = await services.open(args.backends)
        for name, target in targets.items():
            _say(began, f"{name}: {target.status}")
            if not target.available:
                results["backends"][name] = {"error": target.status}
        await servers.open()
        for name in [n for n, t in targets.items() if t.available]:
            fleets.append(_spawn(services, name, args, work / "procs"))
        if not fleets:
            _say(began, "no backend available: nothing to soak")
            return results
        every = [p for f in fleets for p in f.procs]
        problems = await wait_ready(every, READY_LIMIT_S, key="t_settled")
        results["meta"]["ready_problems"] = problems
        t0 = time.time()
        end = t0 + args.minutes * 60
        _say(
            began,
            f"{len(every)} instances ready; sampling every {args.sample_s:g} s until "
            f"{datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC",
        )
        last_say = time.monotonic()
        while time.time() < end:
            for fleet in fleets:
                await _sample(fleet, servers, t0)
                for proc in fleet.procs:
                    gone = f"{proc.name} exited at {time.time() - t0:.0f} s"
                    if not proc.alive() and not any(e.startswith(proc.name) for e in fleet.exits):
                        fleet.exits.append(f"{gone}: {proc.log_tail(3)}")
            if time.monotonic() - last_say >= 60:
                last_say = time.monotonic()
                _say(
                    began,
                    "; ".join(
                        f"{f.backend} rss {f.samples[-1]['rss_mb'] or 0:.0f} MB "
                        f"starts {sum(len(p.starts()) for p in f.procs)}"
                        for f in fleets
                    ),
                )
            await asyncio.sleep(max(0.0, min(args.sample_s, end - time.time())))
        results["meta"]["load_end_of_run"] = _load()
        _say(began, "stopping the instances")
        await stop(every, limit_s=60)
        for fleet in fleets:
            results["backends"][fleet.backend] = {
                "slots": _slots(fleet, args, t0 + 1, end - END_MARGIN_S),
                "drift": _verdicts(fleet, args.warmup_s),
                "samples": fleet.samples,
            }
    finally:
        stop_everything()
        await servers.close()
        results["cleanup_problems"] = await services.close()
        results["meta"]["elapsed_s"] = time.monotonic() - began
    return results


# -- report ---------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """bench/soak.md: the run, the slot counts, the drift verdicts with their rule."""
    meta = results["meta"]
    lines = [
        "# anarchon soak",
        "",
        f"Run `{meta['command']}` on {meta['date']}: {meta['minutes']} min, {meta['cpu']}, "
        f"{meta['cores']} cores, load average {meta['load_start']} at start and "
        f"{meta.get('load_end_of_run', '?')} at the end (the machine was shared); took "
        f"{meta.get('elapsed_s', 0) / 60:.0f} min in all. Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + ".",
        "",
        f"Workload: every backend at the same time, {meta['instances']} instances (processes) per "
        f"backend, each registering the same {meta['jobs']:,} jobs with default options; job n is "
        f"due every {meta['period_min']} minutes at second n mod 60 "
        f"({meta['jobs'] / (meta['period_min'] * 60):.1f} slots a second per backend). "
        "How to run it and read it: bench/README.md, docs/benchmarks.md.",
        "",
        "## Slots: every slot due must run once",
        "",
    ]
    rows = []
    for name, r in results["backends"].items():
        if "error" in r:
            rows.append([name, r["error"], *["–"] * 6])
            continue
        s = r["slots"]
        ok = s["missed"] == 0 and s["duplicates_all"] == 0 and not s["exited_early"]
        rows.append(
            [
                name,
                f"{s['ran']:,}/{s['expected']:,}",
                str(s["missed"]),
                str(s["duplicates_all"]),
                f"{_num(s['p50_ms'])} / {_num(s['p99_ms'])} / {_num(s['max_ms'])} ms",
                f"{s['clean_exits']}/{meta['instances']}",
                f"{s['warnings']}"
                + (
                    f" ({s['top_warnings'][0][0][:70]} ×{s['top_warnings'][0][1]})"
                    if s["top_warnings"]
                    else ""
                ),
                "**pass**" if ok else "**fail**",
            ]
        )
    lines += _table(
        [
            "backend",
            "slots ran/due",
            "missed",
            "duplicates",
            "lag p50 / p99 / max",
            "clean exits",
            "log warnings",
            "verdict",
        ],
        rows,
    )
    lines += [
        "",
        "Due: every slot between the instances being ready and 5 s before the stop. Duplicates: "
        "first attempts of one slot started more than once, over the whole run. Lag: first "
        "start − slot (default jitter included).",
        "",
        "## Drift: growth over the run must be flat within noise",
        "",
        f"Rule ({drift.__name__.split('.')[-1]}.py): drop the first {meta['warmup_s']:.0f} s "
        "(warm-up), cut the remaining samples into quarters; drift = median of the last quarter "
        "− median of the first. Pass when the drift ≤ the series' tolerance (below); only "
        "growth fails. The least-squares slope per hour is a second reading, not the verdict. "
        f"Sampled every {meta['sample_s']:g} s.",
        "",
    ]
    rows = []
    for key, series in SERIES.items():
        for name, r in results["backends"].items():
            d = r.get("drift", {}).get(key) if "error" not in r else None
            if d is None:
                why = "no server count" if key == "server" else "too few samples"
                why = "not run" if "error" in r else why
                rows.append([series.title, name, "–", "–", "–", "–", "–", why])
                continue
            rows.append(
                [
                    f"{series.title} ({series.unit})",
                    name,
                    _num(d["first"], 2),
                    _num(d["last"], 2),
                    f"{d['change']:+.2f}",
                    f"{d['slope_per_h']:+.2f}",
                    f"{d['tolerance']:.2f} = {series.rule.describe(series.unit)}",
                    "**pass**" if d["ok"] else "**fail**",
                ]
            )
    lines += _table(
        [
            "series",
            "backend",
            "first quarter",
            "last quarter",
            "drift",
            "slope / h",
            "tolerance",
            "verdict",
        ],
        rows,
    )
    lines += ["", "Series over time: [soak.png](soak.png).", ""]
    if results.get("cleanup_problems"):
        lines += ["Clean-up problems: " + "; ".join(results["cleanup_problems"]), ""]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def plot(results: dict[str, Any], path: Path) -> bool:
    """bench/soak.png: one panel per series, one line per backend; False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = {n: r for n, r in results["backends"].items() if r.get("samples")}
    if not backends:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = dict(zip(BACKENDS, palette, strict=False))
    warmup = results["meta"]["warmup_s"] / 60
    for ax, (key, series) in zip(axes.flat, SERIES.items(), strict=True):
        for name, r in backends.items():
            points = [(s["t"] / 60, s[key]) for s in r["samples"] if s.get(key) is not None]
            if points:
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                ax.plot(xs, ys, label=name, linewidth=1, color=colors.get(name))
        ax.axvspan(0, warmup, color="grey", alpha=0.15)
        ax.set_title(series.title, fontsize=10)
        ax.set_xlabel("minutes (grey: warm-up)")
        ax.set_ylabel(series.unit)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(f"anarchon soak, {results['meta']['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1000, help="jobs per instance (the same on each)")
    p.add_argument("--period", type=int, default=5, help="minutes between a job's slots")
    p.add_argument("--sample-s", type=float, help="default: run / 150, within 5-30 s")
    p.add_argument("--warmup-s", type=float, help="default: 10 %% of the run, at least 60 s")
    p.add_argument("--out", default=str(BENCH / "soak.md"))
    p.add_argument("--plot", default=str(BENCH / "soak.png"))
    p.add_argument("--work", default=str(BENCH / ".work"))
    p.add_argument("--report-from", help="write the report of a saved run (soak-last.json) only")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    for name in args.backends:
        if name not in BACKENDS:
            p.error(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if args.minutes <= 0:
        p.error(f"--minutes {args.minutes:g} must be > 0")
    if args.instances < 1 or args.jobs < 1:
        p.error(f"--instances {args.instances} and --jobs {args.jobs} must be >= 1")
    if args.period < 1 or 60 % args.period:
        p.error(f"--period {args.period} must divide 60 (1, 2, 3, 4, 5, 6, 10, 15, 20, 30)")
    seconds = args.minutes * 60
    if args.sample_s is None:
        args.sample_s = min(30.0, max(5.0, seconds / 150))
    if args.warmup_s is None:
        args.warmup_s = max(60.0, seconds / 10)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the soak; write the report and the plot; exit 1 if a verdict failed."""
    args = parse(argv)
    if args.report_from:
        _write(json.loads(Path(args.report_from).read_text()), args)
        return

    async def guarded() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await run(args)

    try:
        results = asyncio.run(guarded())
    except asyncio.CancelledError:
        stop_everything()
        print("soak interrupted; its processes were stopped", file=sys.stderr)
        raise SystemExit(130) from None
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "soak-last.json").write_text(json.dumps(results, indent=1, default=str))
    _write(results, args)
    if not passed(results):
        raise SystemExit(1)


def passed(results: dict[str, Any]) -> bool:
    """Whether every backend ran, missed and duplicated nothing, and no series drifted."""
    for r in results["backends"].values():
        if "error" in r:
            return False
        s = r["slots"]
        if s["missed"] or s["duplicates_all"] or s["exited_early"]:
            return False
        if any(d is not None and not d["ok"] for d in r["drift"].values()):
            return False
    return True


def _write(results: dict[str, Any], args: argparse.Namespace) -> None:
    text = markdown(results)
    Path(args.out).write_text(text + "\n")
    if plot(results, Path(args.plot)):
        print(f"[soak] plot: {args.plot}", file=sys.stderr)
    print(text)
    print(f"[soak] tables: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
