"""The Prometheus exporter: names by the conventions, every series from the start, counts that
follow the scheduler, and the tiny HTTP server of ``anarchon run --metrics-port``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import anarchon.prometheus
from anarchon import MemoryBackend, RunContext, Scheduler
from anarchon._http import ROUTES, HttpServer, Request, Response
from anarchon._metrics import SLOT_OUTCOMES
from anarchon.errors import InvalidOption, MissingDependency


def _scrape(registry: CollectorRegistry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


JOB_SERIES = 21
"""Series per job by default: 9 slot outcomes, 3 run statuses, 4 counters, 5 gauges."""


def _scheduler() -> Scheduler:
    scheduler = Scheduler(MemoryBackend())
    scheduler.add("report", "0 6 * * *", lambda ctx: None)
    scheduler.add("sync", "*/5 * * * *", lambda ctx: None)
    return scheduler


def test_every_series_is_there_from_the_start_at_zero_and_named_by_the_conventions() -> None:
    registry = CollectorRegistry()
    anarchon.prometheus.register(_scheduler(), registry)
    samples = _scrape(registry)
    slots = samples["anarchon_slots_total"]
    assert len(slots) == 2 * len(SLOT_OUTCOMES) and set(slots.values()) == {0.0}
    assert (("anarchon_job", "sync"), ("outcome", "skipped"), ("reason", "paused")) in slots
    runs = samples["anarchon_runs_total"]
    assert sorted(dict(k)["status"] for k in runs if dict(k)["anarchon_job"] == "report") == [
        "failed",
        "skipped",
        "succeeded",
    ]
    for name in (
        "anarchon_takeovers_total",
        "anarchon_handovers_total",
        "anarchon_leases_lost_total",
        "anarchon_results_refused_total",
        "anarchon_running_runs",
        "anarchon_job_next_slot_timestamp_seconds",
        "anarchon_job_seconds_since_last_success",
    ):
        assert len(samples[name]) == 2, name
    assert samples["anarchon_jobs"][()] == 2
    assert samples["anarchon_scheduler_running"][()] == 0
    assert samples["anarchon_claim_latency_seconds_count"][(("backend", "memory"),)] == 0
    # By default the fire lag and handler duration histograms are the instance's.
    assert samples["anarchon_fire_lag_seconds_count"] == {(): 0}
    assert samples["anarchon_handler_duration_seconds_count"] == {(): 0}
    les = sorted(float(dict(k)["le"]) for k in samples["anarchon_fire_lag_seconds_bucket"])
    assert les[0] == 0.001 and les[-2] == 10.0
    of_sync = [
        (name, k)
        for name, series in samples.items()
        for k in series
        if dict(k).get("anarchon_job") == "sync"
    ]
    assert len(of_sync) == JOB_SERIES, of_sync
    interval = samples["anarchon_job_interval_seconds"]
    assert interval[(("anarchon_job", "sync"),)] == 300 and interval[(("anarchon_job", "report"),)]
    for name, series in samples.items():
        assert name.startswith(("anarchon_", "process_", "python_")), name
        for labels in series:
            names = {label for label, _ in labels}
            assert not names & {"job", "instance", "slot", "run_id"}, (name, names)


async def test_the_counts_follow_the_scheduler() -> None:
    scheduler = Scheduler(MemoryBackend())
    calls = 0

    async def flaky(ctx: RunContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first call fails")

    scheduler.add("flaky", "* * * * * *", flaky, jitter_ms=0)
    registry = CollectorRegistry()
    anarchon.prometheus.register(scheduler, registry)
    async with scheduler:
        for _ in range(60):
            if scheduler.metrics().runs_succeeded >= 1:
                break
            await asyncio.sleep(0.1)
        samples = _scrape(registry)
    job = ("anarchon_job", "flaky")
    ran = samples["anarchon_slots_total"][(job, ("outcome", "ran"), ("reason", ""))]
    runs = samples["anarchon_runs_total"]
    assert runs[(job, ("status", "failed"))] == 1 and runs[(job, ("status", "succeeded"))] >= 1
    assert ran == sum(runs.values()) >= 2
    assert samples["anarchon_fire_lag_seconds_count"][()] == ran  # the only job
    assert samples["anarchon_handler_duration_seconds_count"][()] == ran
    assert samples["anarchon_claim_latency_seconds_count"][(("backend", "memory"),)] >= ran
    assert samples["anarchon_job_last_success_timestamp_seconds"][(job,)] > 1e9
    assert samples["anarchon_job_seconds_since_last_success"][(job,)] < 5
    assert samples["anarchon_scheduler_running"][()] == 1
    snapshot = scheduler.metrics()
    figures = snapshot.by_job["flaky"]
    assert figures.slots["ran"] == snapshot.claims_won and figures.runs["failed"] == 1
    assert snapshot.fire_lag == figures.fire_lag
    assert snapshot.handler_duration == figures.handler_duration
    assert "by_job" not in snapshot.as_dict() and snapshot["runs_failed"] == 1


def test_register_is_idempotent_and_one_registry_holds_one_scheduler() -> None:
    registry = CollectorRegistry()
    scheduler = _scheduler()
    first = anarchon.prometheus.register(scheduler, registry)
    assert anarchon.prometheus.register(scheduler, registry) is first
    with pytest.raises(InvalidOption, match="one registry holds one scheduler"):
        anarchon.prometheus.register(_scheduler(), registry)
    with pytest.raises(InvalidOption, match="must be an anarchon Scheduler"):
        anarchon.prometheus.register("scheduler", registry)  # type: ignore[arg-type]


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    with pytest.raises(MissingDependency, match=r"anarchon\[prometheus\]"):
        anarchon.prometheus.AnarchonCollector(_scheduler())


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A port free on the loopback address (closed again on exit)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_http_server_serves_metrics_and_routes_others_add(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        ROUTES, "/ping", lambda s: lambda r: Response(200, f"pong {sorted(r.query)}".encode())
    )
    server = HttpServer(_scheduler(), 0, "127.0.0.1")
    server.start()
    try:
        base = f"http://127.0.0.1:{server.address[1]}"
        status, body = _get(f"{base}/metrics")
        assert status == 200 and 'anarchon_slots_total{anarchon_job="sync"' in body
        assert _get(f"{base}/ping?x=1") == (200, "pong ['x']")
        status, body = _get(f"{base}/nope")
        assert status == 404 and "/metrics" in body
    finally:
        server.stop()


def test_a_failing_route_answers_500() -> None:
    def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    server = HttpServer(_scheduler(), 0, "127.0.0.1", routes={"/broken": lambda s: broken})
    assert server.answer("/broken").status == 500


@pytest.mark.parametrize("port", [-1, 65_536, "80"])
def test_a_bad_port_is_refused_with_the_rule(port: object) -> None:
    with pytest.raises(InvalidOption, match=r"port=.*0 to 65535|port=.*0 to 65 535|port="):
        HttpServer(_scheduler(), port, "127.0.0.1", routes={})  # type: ignore[arg-type]


APP = """
from anarchon import MemoryBackend, Scheduler

scheduler = Scheduler(MemoryBackend())
scheduler.add("tick", "* * * * * *", lambda ctx: None, jitter_ms=0)
"""


@pytest.mark.slow
def test_anarchon_run_serves_metrics_on_its_port(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    with socket_port() as port:
        pass
    args = [sys.executable, "-m", "anarchon", "run", "app:scheduler", "--metrics-port", str(port)]
    args += ["--metrics-host", "127.0.0.1"]
    log = tmp_path / "run.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen(args, cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        body = ""
        while 'anarchon_slots_total{anarchon_job="tick",outcome="ran",reason=""} 0' in body or (
            "anarchon_scheduler_running 1" not in body
        ):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
            try:
                body = _get(f"http://127.0.0.1:{port}/metrics")[1]
            except OSError:
                continue
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


SLOW_APP = """
import asyncio
from anarchon import Scheduler, SQLiteBackend

scheduler = Scheduler(SQLiteBackend("anarchon.db"), grace_ms=1_000)


async def slow(ctx):
    await asyncio.sleep(120)


scheduler.add("slow", "* * * * * *", slow, jitter_ms=0, overlap="skip")
"""


STOPPED = '"action": "stopped"'  # the scheduler's, in a JSON log line


def _sample(body: str, line_start: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return None


@pytest.mark.slow
def test_anarchon_run_serves_through_the_stop_and_lingers_for_the_final_scrape(
    tmp_path: Path,
) -> None:
    """The hand-over happens at the end of the stop: a scrape during the stop cannot see it,
    one after it can, while ``--metrics-linger`` keeps the server up; that scrape ends the
    wait (the process exits long before the 60 s)."""
    (tmp_path / "app.py").write_text(SLOW_APP)
    with socket_port() as port:
        pass
    args = [sys.executable, "-m", "anarchon", "run", "app:scheduler", "--metrics-port", str(port)]
    args += ["--metrics-host", "127.0.0.1", "--metrics-linger", "60", "--log-format", "json"]
    log = tmp_path / "run.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen(args, cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    running = 'anarchon_running_runs{anarchon_job="slow"}'
    handovers = 'anarchon_handovers_total{anarchon_job="slow"}'
    try:
        deadline = time.monotonic() + 30
        body = ""
        while _sample(body, running) != 1:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
            with contextlib.suppress(OSError):
                body = _get(url)[1]
        os.kill(proc.pid, signal.SIGTERM)
        signalled = time.monotonic()
        seen: list[tuple[float, float | None, float | None, float | None]] = []
        while True:  # every scrape from the signal on is answered, until the final counts
            assert time.monotonic() < signalled + 30, (seen[-5:], log.read_text())
            status, body = _get(url)
            assert status == 200
            state = _sample(body, "anarchon_scheduler_running")
            seen.append(
                (
                    time.monotonic() - signalled,
                    state,
                    _sample(body, running),
                    _sample(body, handovers),
                )
            )
            if state == 0 and STOPPED in log.read_text():
                break
            time.sleep(0.1)
        final = seen[-1]
        assert final[2:] == (0, 1), seen  # no run in progress; the one handed over is counted
        assert seen[0][3] == 0, seen  # before the end of the stop, none was
        # Scraped on, as Prometheus would: the first scrape once the server lingers ends it. A
        # scrape sent while the process exits after that one may be cut (refused, reset, or a
        # body cut short: http.client.IncompleteRead): a failed scrape, after the final counts.
        while proc.poll() is None:
            assert time.monotonic() < signalled + 40, log.read_text()
            with contextlib.suppress(OSError, HTTPException):
                _get(url)
            time.sleep(0.2)
        assert proc.wait() == 0
        exited = time.monotonic() - signalled
        assert exited < 40, exited  # long before the 60 s of --metrics-linger
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    http = [(r["action"], r.get("scraped")) for r in records if r["logger"] == "anarchon.http"]
    assert http == [
        ("http_serving", None),
        ("http_linger", None),
        ("http_linger", True),
        ("http_stopped", None),
    ], http


def test_anarchon_run_refuses_a_bad_metrics_port(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "anarchon", "run", "app:scheduler", "--metrics-port", "70000"]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "from 0 to 65535" in done.stderr, done.stderr


async def test_healthz_is_served_beside_metrics_and_answers_for_a_running_scheduler() -> None:
    scheduler = _scheduler()
    # The default registry holds another test's scheduler: serve the probe alone.
    server = HttpServer(scheduler, 0, "127.0.0.1", routes={"/healthz": ROUTES["/healthz"]})
    server.start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        # Not started: not live, so both probes fail (the request runs on the server's thread).
        status, body = await asyncio.to_thread(_get, f"{base}/healthz")
        assert status == 503 and json.loads(body)["live"] is False
        await scheduler.start()
        status, body = await asyncio.to_thread(_get, f"{base}/healthz")
        assert status == 200, body
        assert json.loads(body)["healthy"] is True
        status, _ = await asyncio.to_thread(_get, f"{base}/healthz?live=1")
        assert status == 200
    finally:
        server.stop()
        await scheduler.stop()


def test_job_histograms_give_each_job_its_own_and_register_keeps_one_setting() -> None:
    registry = CollectorRegistry()
    scheduler = _scheduler()
    anarchon.prometheus.register(scheduler, registry, job_histograms=True)
    samples = _scrape(registry)
    assert samples["anarchon_fire_lag_seconds_count"] == {
        (("anarchon_job", "report"),): 0,
        (("anarchon_job", "sync"),): 0,
    }
    assert len(samples["anarchon_handler_duration_seconds_bucket"]) == 2 * 14
    of_sync = [k for series in samples.values() for k in series if ("anarchon_job", "sync") in k]
    assert len(of_sync) == JOB_SERIES + 32
    with pytest.raises(InvalidOption, match=r"job_histograms=False: .* job_histograms=True"):
        anarchon.prometheus.register(scheduler, registry)
    with pytest.raises(InvalidOption, match="job_histograms='yes' must be True or False"):
        anarchon.prometheus.AnarchonCollector(scheduler, job_histograms="yes")  # type: ignore[arg-type]


def _parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("anarchon_"):
                key = (sample.name, tuple(sorted(sample.labels.items())))
                out[key] = sample.value
    return out


@pytest.mark.parametrize("job_histograms", [False, True])
async def test_the_exposition_anarchon_writes_equals_the_clients(job_histograms: bool) -> None:
    """The same samples, value for value (NaN aside), as prometheus_client writes from the
    collector, with counts and histograms that moved and an instance id to escape."""
    scheduler = Scheduler(MemoryBackend(), instance_id='odd"id\\with')

    async def flaky(ctx: RunContext) -> None:
        if ctx.slot is not None and int(ctx.slot.timestamp()) % 2:
            raise RuntimeError("odd second")

    scheduler.add("flaky", "* * * * * *", flaky, jitter_ms=0)
    scheduler.add("daily", "0 6 * * *", lambda ctx: None)
    ours = anarchon.prometheus.Exposition(
        scheduler, CollectorRegistry(), job_histograms=job_histograms
    )
    theirs = CollectorRegistry()
    anarchon.prometheus.register(scheduler, theirs, job_histograms=job_histograms)
    async with scheduler:
        for _ in range(80):
            m = scheduler.metrics()
            if m.runs_succeeded >= 1 and m.runs_failed >= 1:
                break
            await asyncio.sleep(0.1)
        for _ in range(5):  # a second may turn between the two reads: try again
            text = (await asyncio.to_thread(ours._render)).decode()
            mine, client = _parsed(text), _parsed(generate_latest(theirs).decode())
            since = "anarchon_job_seconds_since_last_success"
            mine = {k: v for k, v in mine.items() if k[0] != since}
            client = {k: v for k, v in client.items() if k[0] != since}
            if mine.keys() == client.keys() and all(
                v == client[k] or (v != v and client[k] != client[k]) for k, v in mine.items()
            ):
                break
            await asyncio.sleep(0.3)
        else:
            raise AssertionError(sorted(set(mine.items()) ^ set(client.items())))
    fleet = "anarchon_fire_lag_seconds_count"
    assert sum(v for k, v in mine.items() if k[0] == fleet) >= 2
    info = mine[
        "anarchon_instance_info",
        (
            ("backend", "memory"),
            ("instance_id", 'odd"id\\with'),
            ("version", anarchon.__version__),
        ),
    ]
    assert info == 1
    assert "# TYPE anarchon_slots_total counter" in text
    assert "# TYPE anarchon_instance_info gauge" in text


def _jobs(n: int) -> Scheduler:
    scheduler = Scheduler(MemoryBackend())
    for i in range(n):
        scheduler.add(
            f"job-{i:05d}", "* * * * * *" if i % 5 == 0 else "0 0 1 1 *", lambda ctx: None
        )
    return scheduler


def test_a_scrape_of_10_000_jobs_is_cheap() -> None:
    """The probe's case: 490 044 samples (37 MB) took 3.9 to 5.8 s through prometheus_client;
    anarchon's own exposition writes 21 series a job, some 0.2 s (the bound leaves room for a
    busy machine)."""
    scheduler = _jobs(10_000)
    exposition = anarchon.prometheus.Exposition(scheduler, CollectorRegistry())
    took = []
    for _ in range(3):
        began = time.perf_counter()
        body = exposition._render()
        took.append(time.perf_counter() - began)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    assert samples < 10_000 * JOB_SERIES + 200, samples
    assert len(body) < 15_000_000
    assert min(took) < 1.5, took


def test_scrapes_at_once_share_one_render_and_a_stop_is_never_served_stale() -> None:
    scheduler = _jobs(2_000)
    exposition = anarchon.prometheus.Exposition(scheduler, CollectorRegistry())
    renders = 0
    render = exposition._render

    def counted() -> bytes:
        nonlocal renders
        renders += 1
        time.sleep(0.3)  # a slow render: the others arrive while it is made
        return render()

    exposition._render = counted  # type: ignore[method-assign]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda _: exposition.render(), range(8)))
    assert renders == 1 and len(set(bodies)) == 1
    # Young enough (under 10 times what it took): served again.
    assert exposition.render() is bodies[0] and renders == 1
    # The scheduler's state changed (here: stopped before it started): rendered anew.
    asyncio.run(scheduler.stop())
    after = exposition.render()
    assert renders == 2 and b"anarchon_scheduler_running 0" in after
    # Old: rendered anew.
    last = exposition._last
    assert last is not None
    exposition._last = dataclasses.replace(last, began=time.monotonic() - 60)
    exposition.render()
    assert renders == 3


def test_register_holds_registries_weakly_and_never_hands_a_new_one_a_dead_ones_collector() -> None:
    """Keyed by id(registry), a new registry at a freed one's address got the old collector
    (and no metrics), and every collector kept its scheduler alive for good."""
    scheduler = _scheduler()
    empty = 0
    for _ in range(50):
        registry = CollectorRegistry()
        anarchon.prometheus.register(scheduler, registry)
        if b"anarchon_jobs " not in generate_latest(registry):
            empty += 1
        del registry
        gc.collect()
    assert empty == 0
    other = _scheduler()
    alive = weakref.ref(other)
    registry = CollectorRegistry()
    anarchon.prometheus.register(other, registry)
    del other, registry
    gc.collect()
    assert alive() is None


def _request(method: str, url: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_head_is_answered_and_live_takes_a_documented_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anarchon.health

    asked: list[bool] = []

    def healthz(scheduler: Scheduler, live: bool = False) -> tuple[int, bytes]:
        asked.append(live)
        return 200, b"{}"

    monkeypatch.setattr(anarchon.health, "healthz", healthz)
    routes = {
        "/healthz": ROUTES["/healthz"],
        "/metrics": lambda s: lambda r: Response(200, b"m 1\n"),
    }
    server = HttpServer(_scheduler(), 0, "127.0.0.1", routes=routes)
    server.start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        status, headers, body = _request("HEAD", f"{base}/metrics")
        assert (status, headers["Content-Length"], body) == (200, "4", b"")
        assert _request("HEAD", f"{base}/nope")[0] == 404
        for value, live in [
            ("1", True), ("true", True), ("Yes", True), ("ON", True), ("False", False),
            ("no", False), ("0", False), ("OFF", False), ("", False),
        ]:  # fmt: skip
            asked.clear()
            status, _, body = _request("GET", f"{base}/healthz?live={value}")
            assert (status, asked) == (200, [live]), (value, body)
        asked.clear()
        assert _request("GET", f"{base}/healthz")[0] == 200 and asked == [False]
        asked.clear()
        status, _, body = _request("GET", f"{base}/healthz?live=maybe")
        assert status == 400 and b"live='maybe'" in body and b"yes" in body and not asked
    finally:
        server.stop()


def test_the_listen_backlog_holds_a_burst_of_connections() -> None:
    """With the standard library's backlog of 5, connections beyond it wait for the kernel to
    retry their SYN (a second or more) while the server is busy."""
    server = HttpServer(_scheduler(), 0, "127.0.0.1", routes={})
    server.start()
    port = server.address[1]
    assert server._server is not None
    server._server.shutdown()  # listening still, accepting nothing: a busy server
    sockets = []
    try:
        for _ in range(64):
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
    assert len(sockets) == 64


def test_the_server_logs_its_own_actions(caplog: pytest.LogCaptureFixture) -> None:
    server = HttpServer(_scheduler(), 0, "127.0.0.1", routes={})
    with caplog.at_level(logging.INFO, logger="anarchon.http"):
        server.start()
        port = server.address[1]
        server.stop()
    actions = [
        (r.name, getattr(r, "action", None), getattr(r, "address", None)) for r in caplog.records
    ]
    address = f"http://127.0.0.1:{port}"
    assert actions == [
        ("anarchon.http", "http_serving", address),
        ("anarchon.http", "http_stopped", address),
    ]


async def test_pending_requests_are_a_gauge_by_job_and_kind_that_no_scrape_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run requests not claimed yet, of every job (one that no instance carries too), by
    job and kind, as the request poller last read them: in ``metrics()`` and both
    expositions, a pair seen once kept at 0 when none is pending; a scrape never reads the
    store (it costs what is pending, not history). Every option at its default but the
    poll."""
    from anarchon import steering
    from anarchon.control import RunRequest
    from tests.records import waiting_retry

    backend = MemoryBackend()
    scheduler = Scheduler(backend, control_poll_ms=100)
    scheduler.add("daily", "0 6 * * *", lambda ctx: None)
    ours = anarchon.prometheus.Exposition(scheduler, CollectorRegistry())
    theirs = CollectorRegistry()
    anarchon.prometheus.register(scheduler, theirs)
    assert scheduler.metrics().requests_pending is None
    assert "anarchon_requests_pending" not in _scrape(theirs)

    async def pending(count: int) -> None:
        for _ in range(100):
            if scheduler.metrics().requests_pending == count:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(scheduler.metrics().pending_requests)

    async with scheduler:
        control = backend.control()
        assert control is not None
        now = int(time.time() * 1000)
        await control.request(waiting_retry("daily", 1_800_000_000_000, now))
        for _ in range(2):
            await steering.trigger(backend, "ghost", by="ops")
        await pending(3)
        m = scheduler.metrics()
        assert m.pending_requests == {("daily", "retry"): 1, ("ghost", "trigger"): 2}
        assert m["requests_pending"] == 3 and "pending_requests" not in m.as_dict()
        assert _scrape(theirs)["anarchon_requests_pending"] == {
            (("anarchon_job", "daily"), ("kind", "retry")): 1.0,
            (("anarchon_job", "ghost"), ("kind", "trigger")): 2.0,
        }
        text = (await asyncio.to_thread(ours._render)).decode()
        assert 'anarchon_requests_pending{anarchon_job="ghost",kind="trigger"} 2' in text
        await steering.cancel_requests(backend, await steering.pending_requests(backend))
        await pending(0)
        # None pending now: each series seen drops to 0 and stays (before, they vanished, and
        # a rate() or an alert on them saw no drop), in both expositions.
        zero = {("daily", "retry"): 0, ("ghost", "trigger"): 0}
        assert scheduler.metrics().pending_requests == zero
        assert _scrape(theirs)["anarchon_requests_pending"] == {
            (("anarchon_job", "daily"), ("kind", "retry")): 0.0,
            (("anarchon_job", "ghost"), ("kind", "trigger")): 0.0,
        }
        lines = (await asyncio.to_thread(ours._render)).decode().splitlines()
        assert 'anarchon_requests_pending{anarchon_job="ghost",kind="trigger"} 0' in lines
        assert 'anarchon_requests_pending{anarchon_job="daily",kind="retry"} 0' in lines
        await steering.trigger(backend, "ghost", by="ops")
        await pending(1)
    reads = 0
    listed = type(control).requests

    async def counted(self: object, jobs: object = None) -> list[RunRequest]:
        nonlocal reads
        reads += 1
        return await listed(control, None)

    monkeypatch.setattr(type(control), "requests", counted)
    for _ in range(5):
        assert _scrape(theirs)["anarchon_requests_pending"] == {
            (("anarchon_job", "daily"), ("kind", "retry")): 0.0,
            (("anarchon_job", "ghost"), ("kind", "trigger")): 1.0,
        }
        ours._render()
    assert reads == 0
