"""Job options and backend constructor options: types, ranges, handlers, time zones, jitter."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from anarchon import InvalidOption, MemoryBackend, RunContext, Scheduler, SQLiteBackend

EVERY_SECOND = "* * * * * *"
OPTIONS = [
    "catch_up_window_ms",
    "history_ttl_ms",
    "jitter_ms",
    "lease_ms",
    "max_attempts",
    "max_late_ms",
    "timeout_ms",
]


async def handler(ctx: RunContext) -> None:
    pass


@pytest.fixture
def scheduler() -> Scheduler:
    return Scheduler(MemoryBackend())


def test_the_checker_names_value_option_owner_and_range() -> None:
    from anarchon._options import Bound, check_bool, check_int, ms_text

    bound = Bound(300, 86_400_000, ms=True)
    assert check_int("lease_ms", 300, bound, "job 'a'") == 300
    with pytest.raises(InvalidOption) as info:
        check_int("lease_ms", 10**19, bound, "job 'a'")
    assert str(info.value) == (
        "lease_ms=10000000000000000000 for job 'a' is out of range: it must be an integer "
        "from 300 to 86400000 (300 ms to 1 day)"
    )
    with pytest.raises(InvalidOption, match=r"lease_ms='5s' for job 'a' must be an integer .*str"):
        check_int("lease_ms", "5s", bound, "job 'a'")
    with pytest.raises(InvalidOption, match="lease_ms=True"):
        check_int("lease_ms", True, bound, "job 'a'")
    assert check_bool("handover", False, "job 'a'") is False
    with pytest.raises(InvalidOption, match="handover='no' for job 'a' must be True or False"):
        check_bool("handover", "no", "job 'a'")
    assert [ms_text(n) for n in (300, 1_000, 90_000, 3_600_000, 2 * 86_400_000)] == [
        "300 ms",
        "1 s",
        "90 s",
        "1 hour",
        "2 days",
    ]


@pytest.mark.parametrize("option", OPTIONS)
def test_every_numeric_job_option_has_a_range_checked_at_add(
    scheduler: Scheduler, option: str
) -> None:
    from anarchon._job import BOUNDS

    assert sorted(BOUNDS) == OPTIONS
    bound = BOUNDS[option]
    # Keep the other rules (jitter < max_late_ms < history_ttl_ms) out of the way.
    base: dict[str, Any] = {
        "jitter_ms": {"max_late_ms": bound.high + 1},
        "max_late_ms": {"jitter_ms": 0, "history_ttl_ms": BOUNDS["history_ttl_ms"].high},
        "history_ttl_ms": {"jitter_ms": 0, "max_late_ms": 1_000},
    }.get(option, {})
    schedule = "0 0 1 1 *"  # yearly: the period does not limit the jitter here
    for n, good in enumerate((bound.low, bound.high)):
        if option == "jitter_ms" and good == 0:
            continue
        scheduler.add(f"{option}{n}", schedule, handler, **{**base, option: good})
    for bad in (bound.low - 1, bound.high + 1, 10**19, "5", 2.5, True):
        with pytest.raises(InvalidOption) as info:
            scheduler.add("bad", schedule, handler, **{**base, option: bad})
        message = str(info.value)
        assert message.startswith(f"{option}={bad!r} for job 'bad' "), message
        assert f"from {bound.low} to {bound.high}" in message, message


def test_values_that_once_overflowed_the_backend_are_refused_at_add(tmp_path: Path) -> None:
    scheduler = Scheduler(SQLiteBackend(tmp_path / "x.db"))
    with pytest.raises(InvalidOption, match=r"lease_ms=10000000000000000000 for job 'j'.*1 day"):
        scheduler.add("j", "* * * * *", handler, lease_ms=10**19)
    with pytest.raises(InvalidOption, match=r"history_ttl_ms=10000000000000000000.*10 years"):
        scheduler.add("j", "* * * * *", handler, history_ttl_ms=10**19)
    with pytest.raises(InvalidOption, match=r"max_attempts=101 for job 'j'.*from 1 to 100"):
        scheduler.add("j", "* * * * *", handler, max_attempts=101)


def test_boolean_options_must_be_bools(scheduler: Scheduler) -> None:
    for bad in ("no", "false", 0, 1):
        with pytest.raises(InvalidOption, match=f"handover={re.escape(repr(bad))} for job 'j'"):
            scheduler.add("j", "* * * * *", handler, handover=bad)  # type: ignore[arg-type]
    scheduler.add("j", "* * * * *", handler, handover=False)
    assert scheduler._jobs["j"].policy.handover is False


@pytest.mark.parametrize(
    "make",
    [
        lambda: MemoryBackend(history_size="a"),  # type: ignore[arg-type]
        lambda: MemoryBackend(history_size=0),
        lambda: MemoryBackend(history_size=10**12),
        lambda: SQLiteBackend("x.db", history_size="a"),  # type: ignore[arg-type]
        lambda: SQLiteBackend("x.db", busy_timeout_ms=10**19),
        lambda: SQLiteBackend("x.db", busy_timeout_ms=-1),
    ],
)
def test_backend_constructors_check_their_numbers(make: Any) -> None:
    with pytest.raises(InvalidOption, match=r"(history_size|busy_timeout_ms)=.* for \w+Backend"):
        make()


def test_a_handler_that_cannot_take_ctx_is_refused_at_add(scheduler: Scheduler) -> None:
    def no_argument() -> None:
        pass

    async def two_arguments(ctx: RunContext, other: int) -> None:
        pass

    def keyword_only(*, ctx: RunContext) -> None:
        pass

    for bad in (no_argument, two_arguments, keyword_only):
        with pytest.raises(InvalidOption) as info:
            scheduler.add("j", "* * * * *", bad)  # type: ignore[arg-type]
        message = str(info.value)
        assert "job 'j'" in message and bad.__qualname__ in message, message
        assert "handler(ctx)" in message, message

    class Callable:
        def __call__(self, ctx: RunContext) -> None:
            pass

    def with_default(ctx: RunContext, retries: int = 3) -> None:
        pass

    def star_args(*args: Any) -> None:
        pass

    def partial_target(prefix: str, ctx: RunContext) -> None:
        pass

    good: list[Any] = [
        handler,
        Callable(),
        with_default,
        star_args,
        lambda ctx: None,
        functools.partial(partial_target, "x"),
        print,
    ]
    for n, ok in enumerate(good):
        scheduler.add(f"ok{n}", "* * * * *", ok)
    assert len(scheduler.jobs) == len(good)


def test_a_zoneinfo_is_accepted_as_timezone(scheduler: Scheduler) -> None:
    scheduler.add("athens", "0 6 * * *", handler, timezone=ZoneInfo("Europe/Athens"))
    schedule = scheduler._jobs["athens"].schedule
    assert schedule.zone == ZoneInfo("Europe/Athens")
    slot = schedule.next_slot(1_767_225_600_000)  # 2026-01-01T00:00Z = 02:00 in Athens
    assert slot == 1_767_225_600_000 + 4 * 3_600_000  # 06:00 Athens is 04:00 UTC in winter


@pytest.mark.parametrize(
    ("schedule", "options", "jitter"),
    [
        (EVERY_SECOND, {}, 100),
        ("*/2 * * * * *", {}, 200),
        ("*/7 * * * * *", {}, 400),  # the gap from :56 to :00 is 4 s
        ("*/10 * * * * *", {}, 1_000),
        ("* * * * *", {}, 2_000),
        ("0 6 * * *", {}, 2_000),
        ("* * * * *", {"max_late_ms": 1_000}, 500),
        (EVERY_SECOND, {"jitter_ms": 999}, 999),
    ],
)
def test_the_default_jitter_derives_from_the_period(
    scheduler: Scheduler, schedule: str, options: dict[str, Any], jitter: int
) -> None:
    scheduler.add("j", schedule, handler, **options)
    assert scheduler._jobs["j"].policy.jitter_ms == jitter


def test_a_jitter_that_reaches_the_period_or_max_late_is_refused(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidOption) as info:
        scheduler.add("j", EVERY_SECOND, handler, jitter_ms=2_000)
    message = str(info.value)
    assert "jitter_ms=2000 for job 'j' must be less than the job's period, 1 s" in message
    assert "a tenth of the period (100 ms)" in message
    with pytest.raises(InvalidOption, match=r"jitter_ms=1000 .* period, 1 s"):
        scheduler.add("j", EVERY_SECOND, handler, jitter_ms=1_000)
    with pytest.raises(InvalidOption, match="jitter_ms=5000 for job 'j' must be less than"):
        scheduler.add("j", "* * * * *", handler, jitter_ms=5_000, max_late_ms=5_000)
    scheduler.add("j", "* * * * *", handler, jitter_ms=0, max_late_ms=1_000)


@pytest.mark.parametrize("value", [0, 1, 200, 999])
def test_a_max_late_below_one_second_is_refused_naming_the_value_and_the_rule(
    scheduler: Scheduler, value: int
) -> None:
    with pytest.raises(InvalidOption) as info:
        scheduler.add("j", "* * * * *", handler, max_late_ms=value)
    message = str(info.value)
    assert f"max_late_ms={value} for job 'j' is out of range" in message
    assert "from 1000 to 604800000" in message and "slots would go unrun" in message
    scheduler.add("j", "* * * * *", handler, max_late_ms=1_000)
    assert scheduler._jobs["j"].policy.max_late_ms == 1_000


def test_options_resolved_for_one_job_serve_others_only_of_the_same_types_and_period(
    scheduler: Scheduler,
) -> None:
    """Jobs that share options resolve them once (100 000 jobs on one set of options), each
    with its own name; a value equal but of another type, or the same jitter on a shorter
    period, is checked again (each add below would pass if the first resolution were reused)."""
    from anarchon._job import JobOptions, resolve

    scheduler.add("a", "*/10 * * * * *", handler, jitter_ms=5_000)
    with pytest.raises(InvalidOption, match=r"jitter_ms=5000 for job 'b' .* period, 2 s"):
        scheduler.add("b", "*/2 * * * * *", handler, jitter_ms=5_000)
    scheduler.add("c", "* * * * *", handler, max_attempts=1)
    with pytest.raises(InvalidOption, match=r"max_attempts=True for job 'd' must be an integer"):
        scheduler.add("d", "* * * * *", handler, max_attempts=True)
    for name in ("e", "f"):
        scheduler.add(name, "0 6 * * *", handler, lease_ms=60_000)
    for name, options in (("a", JobOptions(jitter_ms=5_000)), ("f", JobOptions(lease_ms=60_000))):
        job = scheduler._jobs[name]
        fresh = resolve(name, options, scheduler.backend, job.schedule)
        assert job.policy == fresh and job.policy.name == name


def test_options_that_cannot_be_hashed_are_resolved_for_each_job(scheduler: Scheduler) -> None:
    class Hook:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, run: object) -> None:
            pass

    hook = Hook()
    scheduler.add("a", "* * * * *", handler, on_failure=hook)
    scheduler.add("b", "* * * * *", handler, on_failure=hook)
    job = scheduler._jobs["b"]
    assert job.policy.name == "b" and job.options.on_failure is hook
