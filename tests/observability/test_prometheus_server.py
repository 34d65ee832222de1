"""A real Prometheus server scrapes three real instances; its counts equal history.

Debian's ``prometheus`` (installed when missing) scrapes every second three processes that share
one SQLite file and run a job every second that fails now and then (and overruns now and then,
so its next slot is skipped for overlap); the job was last run 20 s before they start (so the
first to start records missed slots), and is paused for 3 s midway. Once the schedulers have
stopped and Prometheus has scraped each instance after its stop, the sums Prometheus answers
(``/api/v1/query``), per instance and over the fleet, must equal what history records: slots by
outcome and reason class, runs by status. Then every PromQL expression of the Grafana dashboard
(docs/grafana/anarchon.json) must name only metrics this Prometheus scraped, and evaluate.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from anarchon import Overlap, RunStatus, SQLiteBackend, Trigger, steering
from anarchon._metrics import SLOT_OUTCOMES, skip_class
from anarchon.backend import ClaimRequest, ClaimStatus
from tests.observability.instance import JOB
from tests.observability.prom import Prometheus, ensure_installed
from tests.ports import any_free

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "anarchon.json"
INSTANCES = 3
SEED_AGE_S = 20


def _prometheus() -> None:
    reason = ensure_installed()
    if reason is not None:
        if os.geteuid() != 0:
            pytest.skip(reason)
        pytest.fail(reason)


def _start(tmp: Path, db: Path, n: int, port: int) -> tuple[subprocess.Popen[bytes], Path, Path]:
    ready, stopped, log = tmp / f"w{n}.ready", tmp / f"w{n}.stopped", tmp / f"w{n}.log"
    args = [
        sys.executable,
        "-m",
        "tests.observability.instance",
        "--db",
        str(db),
        "--port",
        str(port),
        "--instance",
        f"w{n}",
        "--ready",
        str(ready),
        "--stopped",
        str(stopped),
    ]
    with log.open("wb") as handle:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    return proc, ready, stopped


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[bytes]], tmp: Path, s: float) -> None:
    deadline = time.monotonic() + s
    while not all(p.exists() for p in paths):
        for n, proc in enumerate(procs):
            if proc.poll() is not None:
                raise AssertionError(f"w{n} exited early:\n{(tmp / f'w{n}.log').read_text()}")
        if time.monotonic() > deadline:
            logs = "\n".join((tmp / f"w{n}.log").read_text() for n in range(len(procs)))
            raise AssertionError(f"not all of {[p.name for p in paths]} appeared:\n{logs}")
        time.sleep(0.05)


async def _seed(backend: SQLiteBackend) -> None:
    """A run of the job 20 s ago: the first instance to start records the slots since missed."""
    slot = (int(time.time()) - SEED_AGE_S) * 1000
    [outcome] = await backend.claim(
        [
            ClaimRequest(
                job=JOB,
                slot=slot,
                run_id="seed",
                token="seed",
                instance="seed",
                trigger=Trigger.SCHEDULE,
                lease_ms=15_000,
                overlap=Overlap.SKIP,
            )
        ]
    )
    assert outcome.status is ClaimStatus.WON and outcome.ticket is not None
    await backend.finish(outcome.ticket, RunStatus.SUCCEEDED, None)


def _history_counts(
    runs: list[Any],
) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str]]]:
    """(instance, outcome, reason) of each slot and (instance, status) of each finished run, as
    history records them (the seed left out)."""
    slots: Counter[tuple[str, str, str]] = Counter()
    statuses: Counter[tuple[str, str]] = Counter()
    for run in runs:
        if run.instance == "seed":
            continue
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            statuses[run.instance, run.status.value] += 1
        if run.trigger not in (Trigger.SCHEDULE, Trigger.CATCH_UP) or run.attempt != 1:
            continue
        if run.status is RunStatus.SKIPPED:
            key = skip_class(run.skip_cause)
        elif run.status is RunStatus.MISSED:
            key = "missed"
        else:
            key = "ran"
        slots[(run.instance, *SLOT_OUTCOMES[key])] += 1
    return slots, statuses


def _vector(
    result: list[dict[str, Any]], labels: tuple[str, ...], who: dict[str, str]
) -> dict[Any, float]:
    """A query's result by ``labels`` (a target's address as its worker's name), zeros left out
    as history has no record of them."""
    out: dict[Any, float] = {}
    for sample in result:
        metric = sample["metric"]
        key = tuple(who.get(metric.get(n, ""), metric.get(n, "")) for n in labels)
        out[key] = out.get(key, 0.0) + float(sample["value"][1])
    return {key: value for key, value in out.items() if value}


def _fleet(counts: Mapping[Any, float]) -> Counter[Any]:
    """Counts by instance and more, added over the instances."""
    out: Counter[Any] = Counter()
    for key, n in counts.items():
        out[key[1:]] += n  # type: ignore[assignment]
    return out


def alert_rules() -> str:
    """The alert rules of docs/metrics.md (its YAML block), for the server's rule_files."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return text.split("```yaml\n", 1)[1].split("```", 1)[0]


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the Grafana dashboard (panel targets and variables)."""
    board = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            query = node.get("query")
            if isinstance(query, dict) and isinstance(query.get("query"), str):
                exprs.append(query["query"])
            elif isinstance(query, str) and node.get("type") == "query":
                exprs.append(query)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(board)
    return exprs


def _concrete(expr: str) -> str:
    """A dashboard expression as Prometheus can run it: Grafana's variables filled in."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr.strip())
    if match:
        expr = f"count by ({match.group(2)}) ({match.group(1)})"
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    expr = expr.replace("$__range", "5m")
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)


async def test_prometheus_counts_equal_history(tmp_path: Path) -> None:
    _prometheus()
    db = tmp_path / "anarchon.db"
    backend = SQLiteBackend(db)
    await backend.start()
    ports = [any_free() for _ in range(INSTANCES)]
    who = {f"127.0.0.1:{port}": f"w{n}" for n, port in enumerate(ports)}
    server = Prometheus(tmp_path, list(who), rules=alert_rules())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await _seed(backend)
        server.start()
        started = [_start(tmp_path, db, n, port) for n, port in enumerate(ports)]
        procs = [proc for proc, _, _ in started]
        _wait_for([ready for _, ready, _ in started], procs, tmp_path, 30)
        began = time.time()
        # Prometheus passes on its targets some 5 s after it starts: wait for a scrape of each.
        deadline = time.monotonic() + 20
        while len(server.query("up == 1")) < INSTANCES:
            assert time.monotonic() < deadline, server.query("up")
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.5)
        window_from = time.time()  # every instance has a sample by now: the window starts here
        await asyncio.sleep(4)
        await steering.pause(backend, JOB, until_ms=int(time.time() * 1000) + 3_000, by="test")
        await asyncio.sleep(11)
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
        stops = [stopped for _, _, stopped in started]
        _wait_for(stops, procs, tmp_path, 20)
        stopped_at = {f"w{n}": json.loads(path.read_text())["t"] for n, path in enumerate(stops)}
        # Wait for a scrape of every instance that began after its scheduler had stopped.
        deadline = time.monotonic() + 15
        while True:
            scraped = {
                who[s["metric"]["instance"]]: float(s["value"][1])
                for s in server.query("timestamp(anarchon_jobs)")
            }
            if len(scraped) == INSTANCES and all(scraped[w] > t for w, t in stopped_at.items()):
                break
            assert time.monotonic() < deadline, (scraped, stopped_at)
            await asyncio.sleep(0.25)
        final = time.time()

        runs = await backend.history(JOB, limit=10_000)
        history_slots, history_runs = _history_counts(runs)
        prom_slots = _vector(
            server.query("sum by (instance, outcome, reason) (anarchon_slots_total)"),
            ("instance", "outcome", "reason"),
            who,
        )
        prom_runs = _vector(
            server.query("sum by (instance, status) (anarchon_runs_total)"),
            ("instance", "status"),
            who,
        )
        # A window: the counters' growth from the samples at window_from to the last ones,
        # beside the slots history holds in that window (a sample may precede its time by up
        # to the scrape interval, so a slot at the window's edge may fall on either side).
        span = round(final - window_from)
        delta = _vector(
            server.query(
                f"sum by (outcome, reason) (anarchon_slots_total - anarchon_slots_total offset "
                f"{span}s)",
                at=final,
            ),
            ("outcome", "reason"),
            who,
        )
        in_window = _fleet(
            _history_counts(
                [r for r in runs if r.slot_ms is not None and r.slot_ms > (final - span) * 1000]
            )[0]
        )
        increase = _vector(
            server.query("sum by (outcome) (increase(anarchon_slots_total[1m]))", at=final),
            ("outcome",),
            who,
        )
        report = {
            "seconds": round(final - began, 1),
            "prometheus_slots": sorted(_fleet(prom_slots).items()),
            "history_slots": sorted(_fleet(history_slots).items()),
            "prometheus_runs": sorted(_fleet(prom_runs).items()),
            "history_runs": sorted(_fleet(history_runs).items()),
            f"prometheus_growth_last_{span}s": sorted(delta.items()),
            f"history_last_{span}s": sorted(in_window.items()),
            "sum by (outcome) (increase(anarchon_slots_total[1m]))": sorted(increase.items()),
        }
        print("\nreal-Prometheus test:", json.dumps(report, indent=1))
        assert prom_slots == history_slots, report
        assert prom_runs == history_runs, report
        fleet = _fleet(history_slots)
        for key in (("ran", ""), ("missed", ""), ("skipped", "paused"), ("skipped", "overlap")):
            assert fleet[key] > 0, f"no {key} slot: the test did not exercise it ({report})"
        assert history_runs and any(k[1] == "failed" for k in history_runs), report
        for key in (set(delta) | set(in_window)) - {("missed", "")}:
            # Missed slots are counted when they are recorded, which is after the fact (the
            # newer ones of a gap up to max_late_ms + jitter_ms + 5 s after a start): their
            # counter grows in a later window than their slots'. Their totals are exact above.
            assert abs(delta.get(key, 0) - in_window.get(key, 0)) <= 2, (key, report)
        assert in_window["skipped", "paused"] >= 2, report  # the pause was inside the window
        # increase() sees no growth before an instance's first scrape (the missed slots are
        # recorded at start): at most what history holds.
        for (outcome,), n in increase.items():
            assert n <= sum(v for k, v in fleet.items() if k[0] == outcome) + 1, report

        # The dashboard: every metric it names was scraped here, and every query runs.
        scraped_names = server.names()
        queries = dashboard_queries()
        assert len(queries) >= 10, queries
        for expr in queries:
            named = set(re.findall(r"\banarchon_\w+", expr)) - {"anarchon_job"}
            missing = named - scraped_names
            assert not missing, f"{expr!r} names {missing}, which Prometheus never scraped"
            server.query(_concrete(expr))  # raises unless Prometheus accepts it

        # The alert rules of docs/metrics.md: loaded, each evaluated without error, and the
        # failed runs fired AnarchonRunFailed.
        [group] = server.api("rules")["groups"]
        health = {rule["name"]: (rule["health"], rule.get("lastError")) for rule in group["rules"]}
        assert len(health) >= 5, health
        assert all(state == "ok" for state, _ in health.values()), health
        firing = {a["labels"]["alertname"] for a in server.api("alerts")["alerts"]}
        assert "AnarchonRunFailed" in firing, (firing, health)
    finally:
        await backend.stop()
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        server.stop()
