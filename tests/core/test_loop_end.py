"""An application whose ``main`` returns (or raises) under ``asyncio.run()`` with its scheduler
still running, never stopped, on SQLite and Redis with every option at its default: the loop's
end stops the scheduler (grace cut short, a WARNING ``loop_ended``), so its run is handed over
and another instance takes it over at once, not after its lease (15 s); and its instance record
leaves the registry instead of staying "alive" until it falls silent. A plain handler's thread,
which no cancellation stops, is waited for (within the grace) and its result recorded."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from anarchon import RunStatus, Scheduler
from tests.conformance.procs import ROOT, Fleet, wait_for
from tests.conformance.test_failover import one_slot
from tests.harness import Harness, Namespace
from tests.nats.servers import _die_with_parent

pytestmark = pytest.mark.slow

# A hand-over reaches the other instance within a moment; a lease left to expire takes 10 to 15
# s (renewed every third of the default 15 s).
TAKEN_OVER_WITHIN_S = 6.0


@pytest.fixture(params=["sqlite", "redis"])
async def ns(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Namespace]:
    harness: Harness = importlib.import_module(f"tests.backends.{request.param}").HARNESS
    async with harness.namespace(tmp_path) as namespace:
        yield namespace


async def _instances(ns: Namespace) -> list[str]:
    async with Scheduler(ns.make(), instance_id="reader") as reader:
        view = await reader.cluster()
    return sorted(i.id for i in view.instances if i.id != "reader")


@pytest.mark.parametrize("end", ["return", "raise"])
async def test_main_ending_with_the_scheduler_running_hands_its_run_over(
    ns: Namespace, tmp_path: Path, end: str
) -> None:
    assert ns.url is not None
    schedule, slot = one_slot(lead_s=8)
    out, log = tmp_path / "ending.jsonl", tmp_path / "ending.log"
    fleet = Fleet(ns.url, tmp_path)
    ending = _start_ending(ns.url, out, log, schedule, end)

    def records(event: str) -> list[dict[str, object]]:
        return [r for r in fleet.records() if r["event"] == event] + [
            r for r in _read(out) if r["event"] == event
        ]

    try:
        wait_for(lambda: records("start"), "the first run's start", 40)
        # The other instance starts now, every option at its default but a short grace (its
        # own stop at the end): it finds the run open and watches it.
        [other] = fleet.spawn(1, schedule=schedule, seconds=120, sleep_ms=60_000, grace_ms=500)
        fleet.wait_ready([other])
        time.sleep(1.0)  # noqa: ASYNC251 - it adopts the open run meanwhile; nothing to await
        ending.send_signal(signal.SIGUSR1)  # main() returns (or raises) now
        assert ending.wait(60) == 0, log.read_text()
        [ended] = records("ending")
        taken = wait_for(
            lambda: [r for r in other.records() if r["event"] == "start" and r["attempt"] == 2],
            "the other instance's takeover",
            40,
        )[0]
        after_s = taken["t"] - float(ended["t"])  # type: ignore[arg-type]
        left = await _instances(ns)
    finally:
        _stop(ending, fleet)
    text = log.read_text()
    print(f"{end}: taken over {after_s:.2f} s after main() ended; instances left: {left}")
    assert taken["slot"] == slot
    assert after_s < TAKEN_OVER_WITHIN_S, (
        f"taken over {after_s:.1f} s after main ended (a lease left to expire)\n{text}"
    )
    assert "the event loop is ending while it runs" in text, text
    assert left == ["w0"], f"instances still recorded alive: {left}"


async def test_main_ending_while_a_plain_handler_runs_waits_for_its_thread(
    ns: Namespace, tmp_path: Path
) -> None:
    # A thread cannot be cancelled: the loop's end waits for it within the grace (30 s by
    # default), its lease still renewed, and records its result. Before, asyncio.run() came
    # back at once, the thread's finish was lost with the process, and the run stayed open
    # until its lease expired and another instance ran the slot again.
    assert ns.url is not None
    schedule, slot = one_slot(lead_s=8)
    out, log, release = tmp_path / "plain.jsonl", tmp_path / "plain.log", tmp_path / "release"
    fleet = Fleet(ns.url, tmp_path)
    ending = _start_ending(ns.url, out, log, schedule, "return", plain=release)

    def events(name: str) -> list[dict[str, object]]:
        return [r for r in _read(out) if r["event"] == name]

    try:
        wait_for(lambda: events("start"), "the plain handler's start", 40)
        [other] = fleet.spawn(1, schedule=schedule, seconds=120, sleep_ms=60_000, grace_ms=500)
        fleet.wait_ready([other])
        time.sleep(1.0)  # noqa: ASYNC251 - it adopts the open run meanwhile; nothing to await
        ending.send_signal(signal.SIGUSR1)  # main() returns now, the thread still working
        wait_for(
            lambda: "the event loop is ending while it runs" in log.read_text(),
            "the loop_ended warning",
            30,
        )
        assert events("ending"), log.read_text()
        # The stop waits for the thread: asyncio.run() has not come back.
        assert ending.poll() is None, f"the process exited under its thread\n{log.read_text()}"
        assert not events("exited"), log.read_text()
        release.touch()
        assert ending.wait(60) == 0, log.read_text()
        backend = ns.make()
        await backend.start()
        try:
            runs = [r for r in await backend.history("tick") if r.slot_ms == slot]
        finally:
            await backend.stop()
        takeovers = [r for r in other.records() if r["event"] == "start"]
    finally:
        _stop(ending, fleet)
    text = log.read_text()
    [ended], [finished], [exited] = events("ending"), events("finished"), events("exited")
    assert float(ended["t"]) <= float(finished["t"]) <= float(exited["t"]), text  # type: ignore[arg-type]
    assert [(r.attempt, r.status, r.instance) for r in runs] == [
        (1, RunStatus.SUCCEEDED, "ending")
    ], f"{runs}\n{text}"
    assert takeovers == [], takeovers


def _stop(ending: subprocess.Popen[bytes], fleet: Fleet) -> None:
    """Kill the application if it still runs; stop the other instances."""
    if ending.poll() is None:
        ending.kill()
        ending.wait(10)
    fleet.stop_all()


def _start_ending(
    url: str, out: Path, log: Path, schedule: str, end: str, plain: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the application whose main() ends with its scheduler running (loop_end_worker);
    with ``plain``, its handler is a plain function that returns once that file exists."""
    args = ["--url", url, "--out", str(out), "--schedule", schedule, "--end", end]
    if plain is not None:
        args += ["--plain", str(plain)]
    with log.open("wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.core.loop_end_worker", *args],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )


def _read(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
