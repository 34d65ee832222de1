"""Debian cron's main loop, simulated minute by minute: the reference for daylight saving time.

Read from Debian's ``cron.c`` (cron 3.0pl1, the loop it shares with ISC cron 4.1). The daemon
wakes once a minute. Its clocks count *local* minutes: ``clockTime = (time() + GMToff) / 60``,
with ``GMToff`` re-read only when ``tm_isdst`` flips (``set_time``). ``virtualTime`` is the last
minute it has run jobs for. On each wake it sets ``timeRunning = clockTime`` and classifies
``timeDiff = timeRunning - virtualTime``:

* ``1``: the normal case; run every job of the new minute.
* ``2..5``: woke up late; run every job for each minute until caught up.
* ``6..180``: a forward jump (DST starts); run the *wildcard* jobs for the current minute, then the
  *fixed-time* jobs for every minute skipped, up to and including the current one.
* ``-180..0``: a backward jump (DST ends); run the wildcard jobs only; virtual time stays put until
  the clock has caught up with it.
* otherwise the clock jumped a lot; jump virtual time and run everything for the current minute.

``find_jobs`` matches the job's fields against the wall-clock fields of the minute it is given,
and a job is *wildcard* when its minute or hour field starts with ``*`` (``MIN_STAR|HR_STAR``).
A job runs at the wake-up that found it; a job found twice in one wake-up (several skipped minutes)
runs once per find, which is the multiplicity the comparison leaves aside.

For 6-field expressions (anarchon's extension) the loop is the same on the minute fields, a
seconds field starting with ``*`` also makes the job wildcard, and a job found at a wake-up fires at
each second of that real minute that its seconds field allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from .vixie import EPOCH, Spec

MINUTE_COUNT = 60


@dataclass(frozen=True)
class Call:
    """One ``find_jobs`` call made at a wake-up."""

    real_minute: int  # the wake-up: minutes since the epoch, UTC
    local_minute: int  # the minute matched: local wall-clock minutes since 1970-01-01 00:00
    wild: bool
    fixed: bool


@dataclass(frozen=True)
class Run:
    """Consecutive normal wake-ups at one offset: ``local = real + offset``, both kinds of job."""

    first_real: int
    last_real: int
    offset: int


@dataclass
class Loop:
    """What the loop did from one real minute to another: normal runs and the other calls."""

    runs: list[Run]
    calls: list[Call]

    def fires(self, spec: Spec) -> set[int]:
        """Epoch seconds at which ``spec`` ran (each once, whatever the multiplicity)."""
        minutes: set[int] = set()
        for run in self.runs:
            low, high = run.first_real + run.offset, run.last_real + run.offset
            for day in range(low // 1440, high // 1440 + 1):
                if not spec.day_matches(EPOCH + timedelta(days=day)):
                    continue
                base = day * 1440
                for minute_of_day in spec.minutes_of_day:
                    local = base + minute_of_day
                    if low <= local <= high:
                        minutes.add(local - run.offset)
        for call in self.calls:
            runs_kind = call.wild if spec.wildcard else call.fixed
            if runs_kind and spec.matches_minute(call.local_minute):
                minutes.add(call.real_minute)
        return {minute * 60 + second for minute in minutes for second in spec.seconds}


def simulate(zone: ZoneInfo, first_real_minute: int, last_real_minute: int) -> Loop:
    """Run Debian's loop from start-up at ``first_real_minute`` to the wake-up at the last one.

    The daemon starts at ``first_real_minute`` (jobs of that minute are not run: the loop first
    waits for the minute to change) and wakes one second after each real minute boundary.
    """
    runs: list[Run] = []
    calls: list[Call] = []
    isdst, gmtoff = _localtime(zone, first_real_minute * 60)
    clock_time = (first_real_minute * 60 + gmtoff) // 60
    time_running = virtual_time = clock_time
    run: list[int] | None = None  # [first_real, last_real, offset] of the normal run being built

    def flush() -> None:
        nonlocal run
        if run is not None:
            runs.append(Run(*run))
            run = None

    for real in range(first_real_minute + 1, last_real_minute + 1):
        now = real * 60 + 1
        now_isdst, now_gmtoff = _localtime(zone, now)
        if now_isdst != isdst:  # set_time(): GMToff is re-read only when tm_isdst flips
            isdst, gmtoff = now_isdst, now_gmtoff
        clock_time = (now + gmtoff) // 60
        if clock_time == time_running:
            continue  # the do/while around cron_sleep() keeps sleeping
        time_running = clock_time
        diff = time_running - virtual_time
        if diff == 1:
            virtual_time = time_running
            offset = time_running - real
            if run is not None and run[2] == offset and run[1] == real - 1:
                run[1] = real
            else:
                flush()
                run = [real, real, offset]
            continue
        flush()
        if 0 < diff <= 5:
            while virtual_time < time_running:
                virtual_time += 1
                calls.append(Call(real, virtual_time, True, True))
        elif 5 < diff <= 3 * MINUTE_COUNT:
            calls.append(Call(real, time_running, True, False))
            while virtual_time < time_running:
                virtual_time += 1
                calls.append(Call(real, virtual_time, False, True))
        elif -3 * MINUTE_COUNT < diff <= 0:
            calls.append(Call(real, time_running, True, False))
        else:
            virtual_time = time_running
            calls.append(Call(real, time_running, True, True))
    flush()
    return Loop(runs, calls)


def _localtime(zone: ZoneInfo, epoch_s: int) -> tuple[bool, int]:
    """``tm_isdst`` and ``tm_gmtoff`` (seconds) of ``localtime()`` at ``epoch_s``."""
    moment = datetime.fromtimestamp(epoch_s, zone)
    offset = moment.utcoffset()
    dst = moment.dst()
    assert offset is not None
    return bool(dst), int(offset.total_seconds())


@dataclass(frozen=True)
class Transition:
    """A change of a zone's UTC offset: at epoch second ``at``, ``before`` -> ``after`` minutes."""

    zone: str
    at: int
    before: int
    after: int

    @property
    def shift(self) -> int:
        """Minutes the wall clock jumps: positive forward (a gap), negative back (a repeat)."""
        return self.after - self.before


def transitions(names: list[str], year: int) -> list[Transition]:
    """Every change of UTC offset in ``year`` of each zone in ``names`` (daily probes, bisected).

    Two changes less than a day apart would hide each other; the assertion in the test on the
    Debian flag (every found change flips ``tm_isdst``) and the counts keep that honest.
    """
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    found: list[Transition] = []
    for name in names:
        zone = ZoneInfo(name)
        previous_t, previous = start, _offset(zone, start)
        for t in range(start + 86400, end + 86400, 86400):
            offset = _offset(zone, t)
            if offset != previous:
                low, high = previous_t, t
                while high - low > 1:
                    middle = (low + high) // 2
                    if _offset(zone, middle) == previous:
                        low = middle
                    else:
                        high = middle
                if start <= high < end:
                    found.append(Transition(name, high, previous // 60, offset // 60))
            previous_t, previous = t, offset
    return found


def _offset(zone: ZoneInfo, epoch_s: int) -> int:
    offset = datetime.fromtimestamp(epoch_s, zone).utcoffset()
    assert offset is not None
    return int(offset.total_seconds())
