"""The faults, and one trial of a fault on a backend.

A trial starts three instances (worker processes) on a fresh namespace, every option at its
default unless the fault needs another, plans one slot of a job ``work`` a few seconds ahead (a
fixed time of day, 6 fields), finds the instance that runs it (the runner), does the fault to it,
waits until the slot has settled, kills whatever is left, and measures (tests/chaos/measure.py).
Some faults also run ``tick``, a short job every 3 s, to count the slots the fault makes the
instances miss. Timings are generous: the machine is small and shared.
"""

from __future__ import annotations

import itertools
import math
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from tests.chaos.faketime import ensure_installed
from tests.chaos.fleet import Fleet, Instance, TrialError
from tests.chaos.measure import ACCEPTED, Counts, measure
from tests.chaos.targets import BACKENDS, LEASE_BACKENDS, Target, open_target

LEASE_S: Final = 15  # the default lease_ms, which every trial keeps
GRACE_S: Final = 30  # the default grace_ms
LEAD_S: Final = 10  # from handing out the specs to the planned slot (start-up under load: 5 s seen)
FAULT_AFTER_S: Final = 3  # from the runner's start to the fault
TICK_PERIOD_S: Final = 3
STUCK_MARGIN_S: Final = 15  # a SIGTERMed process must be gone by grace + this
TAIL_S: Final = 20  # slots this close to the end of a trial are not expected yet
RECOVERY_S: Final = 5  # after a server restart, slots due this soon are excused (see _restart)
JITTER_S: Final = 2  # the default jitter_ms


def at(slot_s: int) -> str:
    """A 6-field cron expression that fires once a day, at ``slot_s`` (epoch seconds, UTC)."""
    moment = datetime.fromtimestamp(slot_s, UTC)
    return f"{moment.second} {moment.minute} {moment.hour} * * *"


def work(slot_s: int, behaviour: str = "normal", **params: Any) -> dict[str, Any]:
    return {"name": "work", "schedule": at(slot_s), "behaviour": behaviour, **params}


def tick(behaviour: str = "normal") -> dict[str, Any]:
    return {
        "name": "tick",
        "schedule": f"*/{TICK_PERIOD_S} * * * * *",
        "behaviour": behaviour,
        "duration_ms": 200,
        "step_ms": 200,
    }


@dataclass
class Trial:
    """One fault on one backend: its fleet, its target, its plan, and what it found."""

    fault: Fault
    backend: str
    directory: Path
    fleet: Fleet
    target: Target
    slot_s: int = 0
    expected: dict[str, set[int]] = field(default_factory=dict)
    stuck: int = 0
    sigterm_exits: list[float] = field(default_factory=list)
    notes: Counter[str] = field(default_factory=Counter)
    wall_minus_mono: float = field(default_factory=lambda: time.time() - time.monotonic())

    @property
    def broker(self) -> bool:
        return self.backend not in LEASE_BACKENDS

    @property
    def slot_ms(self) -> int:
        return self.slot_s * 1000

    # -- start ------------------------------------------------------------------------------

    def launch(
        self,
        jobs: Callable[[int, int], list[dict[str, Any]]],
        count: int = 3,
        scheduler: dict[str, Any] | None = None,
    ) -> list[Instance]:
        """Start ``count`` instances; ``jobs(slot_s, n)`` gives instance n its jobs."""
        instances = self.fleet.spawn(count, faked=self.fault.faked)
        self.fleet.wait_event(instances, "loaded", 90)
        self.slot_s = math.ceil(time.time()) + LEAD_S
        for n, instance in enumerate(instances):
            spec = {
                "url": self.target.instance_urls[n],
                "jobs": jobs(self.slot_s, n),
                "scheduler": scheduler or {},
            }
            self.fleet.go(instance, spec)
        self.fleet.note("go", slot=self.slot_ms)
        self.fleet.wait_event(instances, "started", 60)
        return instances

    # -- watching ---------------------------------------------------------------------------

    def attempts(self, job: str = "work", slot: int | None = None) -> list[dict[str, Any]]:
        """Start records of ``job``'s slot (the planned one by default), oldest first."""
        slot = self.slot_ms if slot is None else slot
        starts = [
            r
            for r in self.fleet.records()
            if r["event"] == "start" and r.get("job") == job and r.get("slot") == slot
        ]
        return sorted(starts, key=lambda r: float(r["mono"]))

    def first_start(self, job: str = "work", timeout: float = 40) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            starts = self.attempts(job)
            if starts:
                return starts[0]
            time.sleep(0.1)
        raise TrialError(f"nobody started {job} slot {self.slot_ms}:\n{self.fleet.logs()}")

    def runner(self, start: dict[str, Any]) -> Instance:
        return self.fleet.by_pid(int(start["pid"]))

    def sleep_until(self, mono: float) -> None:
        while (left := mono - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def settle(
        self, quiet_s: float = 3, at_least: float = 0, limit_s: float = 90, job: str = "work"
    ) -> float:
        """Wait until the slot's last attempt has completed (or been cut short) and nothing
        happened to the slot for ``quiet_s`` (for a lease and more if that attempt's result was
        not accepted), but not before ``at_least`` (monotonic) and not longer than ``limit_s``
        after the first start. Returns when it stopped waiting."""
        first = self.first_start(job)
        limit = float(first["mono"]) + limit_s
        while (now := time.monotonic()) < limit:
            ours = [
                r
                for r in self.fleet.records()
                if r.get("job") == job and r.get("slot") == self.slot_ms and "run_id" in r
            ]
            last_start = max((r for r in ours if r["event"] == "start"), key=lambda r: r["mono"])
            finished = {r["run_id"] for r in ours if r["event"] in ("end", "lost", "cancelled")}
            recorded = {r["run_id"] for r in ours if r.get("action") in ACCEPTED}
            dead = not self.fleet.by_pid(int(last_start["pid"])).alive()
            latest = max(float(r["mono"]) for r in ours)
            # Unless the last attempt's result was accepted, a backup may still take the slot
            # over when that attempt's lease runs out: watch for that long.
            quiet = quiet_s if last_start["run_id"] in recorded else max(quiet_s, LEASE_S + 8)
            if (
                now >= at_least
                and (last_start["run_id"] in finished or dead)
                and now - latest >= quiet
            ):
                return now
            time.sleep(0.25)
        self.notes["settle limit reached"] += 1
        return time.monotonic()

    def watch_exit(self, instance: Instance, since: float) -> None:
        """Count ``instance`` stuck if it is alive ``grace + margin`` after ``since`` (SIGTERM)."""
        deadline = since + GRACE_S + STUCK_MARGIN_S
        while instance.alive() and time.monotonic() < deadline:
            time.sleep(0.25)
        if instance.alive():
            self.stuck += 1
            self.notes["alive grace+15 s after SIGTERM"] += 1
        else:
            assert instance.exited_mono is not None
            self.sigterm_exits.append(instance.exited_mono - since)

    # -- expectations -----------------------------------------------------------------------

    def expect_work(self) -> None:
        self.expected.setdefault("work", set()).add(self.slot_ms)

    def expect_ticks(
        self,
        first_mono: float,
        last_mono: float,
        offsets: dict[str, list[tuple[float, int]]],
        excused: tuple[float, float] | None = None,
    ) -> None:
        """Expect every tick slot that some instance's wall clock read between the two
        monotonic moments. ``offsets``: per instance, its clock steps (monotonic moment, new
        offset in seconds). A step back makes a clock read slots before the trial again: those
        are not expected, nor the slots due just before the step back (their claims wait for the
        clock to come back); a step forward passes over slots: those are not expected either
        (what a scheduler does with them is its own policy: a burst of late claims that overlap
        skips), nor the slots due just after it. Except on SQLite, an instance whose clock is
        ahead of the backend's waits for the backend's time (docs/clocks.md): the slots its
        clock reads ahead of real time are not due yet, so its forward offset counts as none.
        ``excused``: monotonic moments between which slots need not run (an outage)."""
        slots: set[int] = set()
        start = self.wall(first_mono)
        # One host (SQLite): every instance stepped alike, and slots fire by the stepped clock.
        ahead_waits = self.backend != "sqlite"
        for instance in self.fleet.instances:
            points: list[tuple[float, int | None]] = [
                (first_mono, 0),
                *offsets.get(instance.name, []),
                (last_mono, None),
            ]
            for n, ((t0, offset), (t1, then)) in enumerate(itertools.pairwise(points)):
                assert offset is not None
                if ahead_waits:
                    offset = min(offset, 0)
                    then = None if then is None else min(then, 0)
                # Just after a step, a slot may fall into the burst of claims the step caused.
                low = self.wall(t0) + offset + (TICK_PERIOD_S if n else 0)
                high = self.wall(t1) + offset
                if then is not None and then < offset:
                    # A slot whose claim still waited out its jitter when the clock went back is
                    # due again only when the clock reaches it again: not firing it early is right.
                    high -= JITTER_S + 1
                slots |= _tick_slots(max(start, low), high)
        if excused is not None:
            slots -= _tick_slots(self.wall(excused[0]), self.wall(excused[1]))
        self.expected["tick"] = slots

    def wall(self, mono: float) -> float:
        """The real wall-clock time (this process is never faked) of a monotonic stamp."""
        return mono + self.wall_minus_mono


def _tick_slots(low: float, high: float) -> set[int]:
    first = math.ceil(low / TICK_PERIOD_S) * TICK_PERIOD_S
    return {s * 1000 for s in range(first, math.floor(high) + 1, TICK_PERIOD_S)}


# -- the faults --------------------------------------------------------------------------------


def _sigterm(trial: Trial) -> None:
    """SIGTERM to the runner 3 s into a 24 s run: it drains (grace 30 s) past the 15 s lease."""
    trial.launch(lambda s, n: [work(s, duration_ms=24_000, retry_duration_ms=5_000)])
    first = trial.first_start()
    runner = trial.runner(first)
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    sent = trial.fleet.signal(runner, signal.SIGTERM)
    trial.watch_exit(runner, sent)
    trial.settle(quiet_s=3, at_least=sent + LEASE_S + 5, limit_s=90)
    trial.expect_work()


def _kill9(trial: Trial) -> None:
    """kill -9 of the runner 3 s into a 12 s run: a backup takes over at lease expiry."""
    trial.launch(lambda s, n: [work(s, duration_ms=12_000)])
    first = trial.first_start()
    runner = trial.runner(first)
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    killed = trial.fleet.signal(runner, signal.SIGKILL)
    trial.settle(quiet_s=3, at_least=killed + LEASE_S + 3, limit_s=75)
    if not trial.broker:  # a broker has no backups: the run is lost by design
        trial.expect_work()


def _sigstop(trial: Trial) -> None:
    """SIGSTOP of the runner 3 s into a 24 s run, SIGCONT 20 s later (past the lease)."""
    trial.launch(lambda s, n: [work(s, duration_ms=24_000, retry_duration_ms=8_000)])
    first = trial.first_start()
    runner = trial.runner(first)
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    stopped = trial.fleet.signal(runner, signal.SIGSTOP)
    trial.sleep_until(stopped + LEASE_S + 5)
    trial.fleet.signal(runner, signal.SIGCONT)
    trial.settle(quiet_s=4, at_least=time.monotonic() + 3, limit_s=90)
    trial.expect_work()


def _clock_step(offset_s: int) -> Callable[[Trial], None]:
    def run(trial: Trial) -> None:
        instances = trial.launch(
            lambda s, n: [work(s, duration_ms=24_000, retry_duration_ms=8_000), tick()]
        )
        began = time.monotonic()
        first = trial.first_start()
        runner = trial.runner(first)
        trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
        # SQLite: every process of the host shares one clock, so the host's clock is stepped.
        # Elsewhere only the runner's, as an NTP step or a resumed VM does to one machine.
        stepped = instances if trial.backend == "sqlite" else [runner]
        offsets: dict[str, list[tuple[float, int]]] = {}
        for instance in stepped:
            assert instance.clock is not None
            instance.clock.set(offset_s)
            mono = trial.fleet.note("clock", target=instance.name, offset_s=offset_s)
            offsets[instance.name] = [(mono, offset_s)]
        # Long enough after the step that the slots it affects are due and decided.
        ended = trial.settle(quiet_s=3, at_least=time.monotonic() + 45, limit_s=90)
        ended = max(ended, time.monotonic())
        trial.expect_work()
        trial.expect_ticks(began + 2, ended - TAIL_S, offsets)

    run.__doc__ = (
        f"The runner's wall clock stepped {offset_s:+d} s 3 s into a 24 s run (SQLite: the "
        "host's, every process); monotonic clocks untouched. A tick job every 3 s runs beside."
    )
    return run


def _restart(trial: Trial) -> None:
    """The backend (a private server) stopped 3 s into a 24 s run and started 5 s later; a
    tick job every 3 s runs beside (slots due from 3 s before the outage to 5 s after it are
    excused)."""
    trial.launch(lambda s, n: [work(s, duration_ms=24_000, retry_duration_ms=8_000), tick()])
    began = time.monotonic()
    first = trial.first_start()
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    server = trial.target.server
    assert server is not None
    stopped = trial.fleet.note("server stop")
    server.stop()
    time.sleep(5)
    server.start()
    restarted = trial.fleet.note("server start")
    ended = trial.settle(quiet_s=3, at_least=time.monotonic() + LEASE_S + 5, limit_s=80)
    trial.expect_work()
    # Slots due while the server is down, just before (their claim waits out its jitter) or
    # just after, are claimed late and together; with overlap="skip" all but one of them may be
    # skipped. Fail-closed claims promise no more.
    outage = (stopped - JITTER_S - 1, restarted + RECOVERY_S)
    trial.expect_ticks(began + 2, max(ended, time.monotonic()) - TAIL_S, {}, outage)


def _slow_link(mode: str) -> Callable[[Trial], None]:
    def run(trial: Trial) -> None:
        trial.launch(lambda s, n: [work(s, duration_ms=24_000, retry_duration_ms=8_000)])
        first = trial.first_start()
        runner = trial.runner(first)
        trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
        proxy = trial.target.proxies[trial.fleet.instances.index(runner)]
        proxy.set(mode, delay_s=20.0)
        began = trial.fleet.note("link", target=runner.name, mode=mode)
        trial.sleep_until(began + 25)
        proxy.set("pass")
        trial.fleet.note("link", target=runner.name, mode="pass")
        trial.settle(quiet_s=4, at_least=time.monotonic() + 5, limit_s=100)
        trial.expect_work()

    what = "held (a black hole)" if mode == "hold" else "delayed by 20 s"
    run.__doc__ = f"The runner's link to the backend {what} for 25 s, 3 s into a 24 s run."
    return run


def _handler_exit(trial: Trial) -> None:
    """The handler calls sys.exit() after one step; a tick job every 3 s runs beside."""
    trial.launch(lambda s, n: [work(s, "exit"), tick()])
    began = time.monotonic()
    trial.first_start()
    ended = trial.settle(quiet_s=LEASE_S + 8, limit_s=75)
    trial.expect_work()
    trial.expect_ticks(began + 2, max(ended, time.monotonic()) - TAIL_S, {})


def _handler_hang(trial: Trial) -> None:
    """A plain handler hangs forever after one step; SIGTERM to its instance 3 s later."""
    trial.launch(lambda s, n: [work(s, "hang")])
    first = trial.first_start()
    runner = trial.runner(first)
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    sent = trial.fleet.signal(runner, signal.SIGTERM)
    trial.watch_exit(runner, sent)
    trial.sleep_until(time.monotonic() + 5)
    # The slot never completes (its handler hangs by design): not expected.


def _handler_ignore_cancel(trial: Trial) -> None:
    """An async handler that swallows CancelledError and works on for 50 s (without checking
    the lease); SIGTERM to its instance 3 s in, so the grace (30 s) ends while it works."""
    trial.launch(
        lambda s, n: [work(s, "ignore_cancel", duration_ms=50_000, retry_duration_ms=5_000)]
    )
    first = trial.first_start()
    runner = trial.runner(first)
    trial.sleep_until(float(first["mono"]) + FAULT_AFTER_S)
    sent = trial.fleet.signal(runner, signal.SIGTERM)
    trial.watch_exit(runner, sent)
    trial.settle(quiet_s=4, at_least=time.monotonic(), limit_s=110)
    trial.expect_work()


def _handler_block_loop(trial: Trial) -> None:
    """An async handler calls time.sleep(20) (the event loop blocked past the 15 s lease),
    then works 3 s more."""
    trial.launch(lambda s, n: [work(s, "block_loop", block_ms=20_000, duration_ms=3_000)])
    first = trial.first_start()
    trial.settle(quiet_s=4, at_least=float(first["mono"]) + 24, limit_s=100)
    trial.expect_work()


def _hung_32(trial: Trial) -> None:
    """32 plain handlers of one instance hang (its 32 worker threads, the default, are all
    taken); a plain tick job every 3 s runs on all three instances."""

    def jobs(slot_s: int, n: int) -> list[dict[str, Any]]:
        hung = [{**work(slot_s, "hang"), "name": f"hang-{k:02d}"} for k in range(32)]
        return [*(hung if n == 0 else []), tick("sync")]

    trial.launch(jobs)
    began = time.monotonic()
    hangs = [r for r in trial.fleet.records() if r["event"] == "hang"]
    deadline = time.monotonic() + 30
    while len(hangs) < 32 and time.monotonic() < deadline:
        time.sleep(0.25)
        hangs = [r for r in trial.fleet.records() if r["event"] == "hang"]
    if len(hangs) < 32:
        raise TrialError(f"only {len(hangs)} of 32 handlers hung:\n{trial.fleet.logs()}")
    hung_at = max(float(r["mono"]) for r in hangs)
    trial.sleep_until(hung_at + 45)
    # No takeover is involved: a tick slot is run within seconds or not at all.
    trial.expect_ticks(max(began + 2, hung_at + 1), time.monotonic() - 8, {})


def _every_second(trial: Trial) -> None:
    """An every-second job with every option at its default (jitter 2 s, overlap skip), a
    0.3 s handler, on 3 instances, for 40 s: no slot may be skipped."""
    # 0.3 s leaves the next slot's claim 0.7 s less its jitter: a busy machine does not make a
    # run outlast its period, while a jitter near the period still does.
    job = {
        "name": "tick",
        "schedule": "* * * * * *",
        "behaviour": "normal",
        "duration_ms": 300,
        "step_ms": 300,
    }
    trial.launch(lambda s, n: [job])
    began = time.monotonic()
    trial.sleep_until(began + 40)
    slots = {
        s * 1000 for s in range(math.ceil(trial.wall(began + 3)), int(trial.wall(began + 30)) + 1)
    }
    trial.expected["tick"] = slots


@dataclass(frozen=True)
class Fault:
    """A fault the suite can do, and the backends it applies to."""

    name: str
    run: Callable[[Trial], None]
    backends: tuple[str, ...]
    faked: bool = False
    proxied: bool = False
    private: bool = False

    @property
    def summary(self) -> str:
        return " ".join((self.run.__doc__ or self.name).split())


FAULTS: Final = {
    f.name: f
    for f in (
        Fault("sigterm", _sigterm, BACKENDS),
        Fault("kill-9", _kill9, BACKENDS),
        Fault("sigstop", _sigstop, BACKENDS),
        Fault("clock-back", _clock_step(-60), BACKENDS, faked=True),
        Fault("clock-forward", _clock_step(+60), BACKENDS, faked=True),
        Fault("restart", _restart, ("postgres", "redis", "nats"), private=True),
        Fault("link-hold", _slow_link("hold"), ("postgres", "redis", "nats"), proxied=True),
        Fault("link-delay", _slow_link("delay"), ("postgres", "redis", "nats"), proxied=True),
        Fault("handler-exit", _handler_exit, LEASE_BACKENDS),
        Fault("handler-hang", _handler_hang, LEASE_BACKENDS),
        Fault("ignore-cancel", _handler_ignore_cancel, LEASE_BACKENDS),
        Fault("block-loop", _handler_block_loop, LEASE_BACKENDS),
        Fault("32-hung", _hung_32, LEASE_BACKENDS),
        Fault("every-second", _every_second, BACKENDS),
    )
}


def run_trial(fault: Fault, backend: str, directory: Path) -> Counts:
    """Run one trial and measure it; a trial that could not be carried out counts as an error.

    The records, the harness's timeline and the logs stay in ``directory``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if fault.faked and (why := ensure_installed()):
        return _error(directory, f"libfaketime: {why}")
    try:
        with open_target(backend, directory, 3, fault.private, fault.proxied) as target:
            fleet = Fleet(directory)
            trial = Trial(fault, backend, directory, fleet, target)
            try:
                fault.run(trial)
            finally:
                fleet.kill_all()
                _save(fleet, directory)
            return _measure(trial)
    except Exception:
        return _error(directory, traceback.format_exc())


def _measure(trial: Trial) -> Counts:
    fleet = trial.fleet
    records = fleet.records()
    jobs = sorted({str(r["job"]) for r in records if r["event"] == "start"} | set(trial.expected))
    histories = {job: trial.target.history(job) for job in jobs if not job.startswith("hang-")}
    deaths = {}
    for instance in fleet.instances:
        kill = [mono for mono, name in instance.signals if name == "SIGKILL"]
        died = min([*kill, *([instance.exited_mono] if instance.exited_mono else [])], default=None)
        if died is not None:
            deaths[instance.pid] = died
    counts = measure(records, histories, trial.expected, deaths, trial.broker)
    counts.stuck = trial.stuck
    counts.sigterm_exits = list(trial.sigterm_exits)
    counts.notes.update(trial.notes)
    counts.notes.update(_observed(records, histories, fleet))
    return counts


def _observed(
    records: list[dict[str, Any]], histories: dict[str, list[dict[str, Any]]], fleet: Fleet
) -> Counter[str]:
    """What else happened, for the notes column."""
    seen: Counter[str] = Counter()
    for r in records:
        if r["event"] == "log" and r.get("action") in ("result_refused", "taken_over"):
            seen[str(r["action"]).replace("_", " ")] += 1
        elif r["event"] == "crash":
            seen["scheduler crashed"] += 1
    for runs in histories.values():
        for run in runs:
            if run["status"] == "skipped":
                reason = str(run.get("reason") or "")
                seen[f"skipped ({reason.split(':')[0] or '?'})"] += 1
    for instance in fleet.instances:
        signalled = {name for _, name in instance.signals}
        code = instance.proc.returncode
        if code is not None and code != -signal.SIGKILL and "SIGTERM" not in signalled:
            seen[f"instance exited by itself (code {code})"] += 1
    return seen


def _save(fleet: Fleet, directory: Path) -> None:
    import json

    (directory / "timeline.json").write_text(json.dumps(fleet.timeline, indent=1))
    (directory / "pids.json").write_text(
        json.dumps({i.name: i.pid for i in fleet.instances}, indent=1)
    )


def _error(directory: Path, why: str) -> Counts:
    (directory / "error.txt").write_text(why)
    counts = Counts(trials=1, errors=1)
    counts.notes["trial error (see error.txt)"] += 1
    return counts
