"""Slot computation: cron syntax, macros, and Debian cron's DST rule for 5 and 6 fields.

The broad checks live beside this table: random expressions against a brute-force Vixie matcher
(test_cron_oracle.py) and every 2027 DST change against Debian cron's main loop
(test_dst_oracle.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from anarchon import (
    CronSchedule,
    InvalidOption,
    InvalidSchedule,
    InvalidTimezone,
    RunContext,
    Scheduler,
)
from anarchon._schedule import _normalise, load_timezone
from anarchon.testing import MemoryBackend

NY = "America/New_York"
ATHENS = "Europe/Athens"
LORD_HOWE = "Australia/Lord_Howe"  # +10:30, and +11:00 in summer: its clocks move 30 minutes

# (expression, zone, start (local wall time), expected next fire times, ISO with offset)
TABLE: list[tuple[str, str, str, list[str]]] = [
    # -- New York, spring forward 2025-03-09: 02:00 EST -> 03:00 EDT --------------------------
    # A fixed time inside the gap fires once, right after it.
    ("30 2 * * *", NY, "2025-03-08T12:00", ["2025-03-09T03:00:00-04:00", "2025-03-10T02:30:00-04:00"]),
    ("0 30 2 * * *", NY, "2025-03-08T12:00", ["2025-03-09T03:00:00-04:00", "2025-03-10T02:30:00-04:00"]),
    ("0 0 2 * * *", NY, "2025-03-08T12:00", ["2025-03-09T03:00:00-04:00", "2025-03-10T02:00:00-04:00"]),
    ("15 30 2 * * *", NY, "2025-03-08T12:00", ["2025-03-09T03:00:15-04:00", "2025-03-10T02:30:15-04:00"]),
    # Wildcard hours keep firing in real time.
    ("0 * * * *", NY, "2025-03-09T00:30", ["2025-03-09T01:00:00-05:00", "2025-03-09T03:00:00-04:00", "2025-03-09T04:00:00-04:00"]),
    ("*/30 * * * *", NY, "2025-03-09T01:10", ["2025-03-09T01:30:00-05:00", "2025-03-09T03:00:00-04:00", "2025-03-09T03:30:00-04:00"]),
    ("0 */30 * * * *", NY, "2025-03-09T01:10", ["2025-03-09T01:30:00-05:00", "2025-03-09T03:00:00-04:00", "2025-03-09T03:30:00-04:00"]),
    # -- New York, fall back 2025-11-02: 02:00 EDT -> 01:00 EST --------------------------------
    # A fixed time that occurs twice fires once, at the first.
    ("30 1 * * *", NY, "2025-11-01T12:00", ["2025-11-02T01:30:00-04:00", "2025-11-03T01:30:00-05:00"]),
    ("0 30 1 * * *", NY, "2025-11-01T12:00", ["2025-11-02T01:30:00-04:00", "2025-11-03T01:30:00-05:00"]),
    ("0 1 * * *", NY, "2025-11-01T12:00", ["2025-11-02T01:00:00-04:00", "2025-11-03T01:00:00-05:00"]),
    ("*/30 * * * *", NY, "2025-11-02T00:10", [
        "2025-11-02T00:30:00-04:00", "2025-11-02T01:00:00-04:00", "2025-11-02T01:30:00-04:00",
        "2025-11-02T01:00:00-05:00", "2025-11-02T01:30:00-05:00", "2025-11-02T02:00:00-05:00"]),
    ("0 */30 * * * *", NY, "2025-11-02T00:10", [
        "2025-11-02T00:30:00-04:00", "2025-11-02T01:00:00-04:00", "2025-11-02T01:30:00-04:00",
        "2025-11-02T01:00:00-05:00", "2025-11-02T01:30:00-05:00", "2025-11-02T02:00:00-05:00"]),
    ("0 * * * *", NY, "2025-11-02T00:10", ["2025-11-02T01:00:00-04:00", "2025-11-02T01:00:00-05:00", "2025-11-02T02:00:00-05:00"]),
    # -- Athens, spring forward 2025-03-30: 03:00 EET -> 04:00 EEST ----------------------------
    ("30 3 * * *", ATHENS, "2025-03-29T12:00", ["2025-03-30T04:00:00+03:00", "2025-03-31T03:30:00+03:00"]),
    ("0 30 3 * * *", ATHENS, "2025-03-29T12:00", ["2025-03-30T04:00:00+03:00", "2025-03-31T03:30:00+03:00"]),
    ("0 * * * *", ATHENS, "2025-03-30T01:30", ["2025-03-30T02:00:00+02:00", "2025-03-30T04:00:00+03:00", "2025-03-30T05:00:00+03:00"]),
    # -- Athens, fall back 2025-10-26: 04:00 EEST -> 03:00 EET --------------------------------
    ("30 3 * * *", ATHENS, "2025-10-25T12:00", ["2025-10-26T03:30:00+03:00", "2025-10-27T03:30:00+02:00"]),
    ("0 30 3 * * *", ATHENS, "2025-10-25T12:00", ["2025-10-26T03:30:00+03:00", "2025-10-27T03:30:00+02:00"]),
    ("*/30 * * * *", ATHENS, "2025-10-26T02:50", [
        "2025-10-26T03:00:00+03:00", "2025-10-26T03:30:00+03:00", "2025-10-26T03:00:00+02:00",
        "2025-10-26T03:30:00+02:00", "2025-10-26T04:00:00+02:00"]),
    ("@hourly", ATHENS, "2025-10-26T01:10", ["2025-10-26T02:00:00+03:00", "2025-10-26T03:00:00+03:00", "2025-10-26T03:00:00+02:00", "2025-10-26T04:00:00+02:00"]),
    # -- Lord Howe, autumn 2027-04-04: 02:00 +11:00 -> 01:30 +10:30 (issue 11, item 9) --------
    # A wildcard-hour job fires at both 01:30s, and the hours stay whole afterwards.
    ("30 * * * *", LORD_HOWE, "2027-04-04T00:50", ["2027-04-04T01:30:00+11:00", "2027-04-04T01:30:00+10:30", "2027-04-04T02:30:00+10:30"]),
    ("0 */30 * * * *", LORD_HOWE, "2027-04-04T01:10", ["2027-04-04T01:30:00+11:00", "2027-04-04T01:30:00+10:30", "2027-04-04T02:00:00+10:30", "2027-04-04T02:30:00+10:30"]),
    ("* 23 * * *", LORD_HOWE, "2027-04-03T23:58", ["2027-04-03T23:59:00+11:00", "2027-04-04T23:00:00+10:30", "2027-04-04T23:01:00+10:30"]),
    ("45 1 * * *", LORD_HOWE, "2027-04-03T12:00", ["2027-04-04T01:45:00+11:00", "2027-04-05T01:45:00+10:30"]),
    # -- Lord Howe, spring 2027-10-03: 02:00 +10:30 -> 02:30 +11:00 ---------------------------
    ("30 * * * *", LORD_HOWE, "2027-10-03T00:50", ["2027-10-03T01:30:00+10:30", "2027-10-03T02:30:00+11:00", "2027-10-03T03:30:00+11:00"]),
    ("*/30 * * * *", LORD_HOWE, "2027-10-03T01:10", ["2027-10-03T01:30:00+10:30", "2027-10-03T02:30:00+11:00", "2027-10-03T03:00:00+11:00", "2027-10-03T03:30:00+11:00"]),
    ("* 23 * * *", LORD_HOWE, "2027-10-02T23:58", ["2027-10-02T23:59:00+10:30", "2027-10-03T23:00:00+11:00", "2027-10-03T23:01:00+11:00"]),
    ("15 2 * * *", LORD_HOWE, "2027-10-02T12:00", ["2027-10-03T02:30:00+11:00", "2027-10-04T02:15:00+11:00"]),
    ("0 15 2 * * *", LORD_HOWE, "2027-10-02T12:00", ["2027-10-03T02:30:00+11:00", "2027-10-04T02:15:00+11:00"]),
    # -- syntax, in UTC ---------------------------------------------------------------------
    ("* * * * * *", "UTC", "2026-01-01T00:00:00.500", ["2026-01-01T00:00:01+00:00", "2026-01-01T00:00:02+00:00", "2026-01-01T00:00:03+00:00"]),
    ("*/15 * * * * *", "UTC", "2026-01-01T00:00", ["2026-01-01T00:00:15+00:00", "2026-01-01T00:00:30+00:00", "2026-01-01T00:00:45+00:00"]),
    ("0 9-17/4 * * MON-FRI", "UTC", "2026-01-02T00:00", [
        "2026-01-02T09:00:00+00:00", "2026-01-02T13:00:00+00:00", "2026-01-02T17:00:00+00:00", "2026-01-05T09:00:00+00:00"]),
    ("@hourly", "UTC", "2026-01-01T12:00", ["2026-01-01T13:00:00+00:00"]),
    ("@daily", "UTC", "2026-01-01T12:00", ["2026-01-02T00:00:00+00:00"]),
    ("@weekly", "UTC", "2026-01-01T12:00", ["2026-01-04T00:00:00+00:00"]),
    ("@monthly", "UTC", "2026-01-01T12:00", ["2026-02-01T00:00:00+00:00"]),
    ("@yearly", "UTC", "2026-01-01T12:00", ["2027-01-01T00:00:00+00:00"]),
    ("@annually", "UTC", "2026-01-01T12:00", ["2027-01-01T00:00:00+00:00"]),
    # Day-of-month and day-of-week are OR-ed when both are restricted (the 13th, or Fridays).
    ("0 0 13 * FRI", "UTC", "2026-02-01T00:00", ["2026-02-06T00:00:00+00:00", "2026-02-13T00:00:00+00:00", "2026-02-20T00:00:00+00:00"]),
    ("0 12 * JAN,JUL *", "UTC", "2026-01-31T13:00", ["2026-07-01T12:00:00+00:00"]),
    ("5 4 * * 7", "UTC", "2026-01-01T00:00", ["2026-01-04T04:05:00+00:00"]),
    ("0 0 L * *", "UTC", "2026-02-01T00:00", ["2026-02-28T00:00:00+00:00"]),
    # A range with a step is stepped inside the range, N-N/s is N alone (issue 11, item 8).
    ("0 2 * * 4-4/3", "UTC", "2027-01-01T00:00", ["2027-01-07T02:00:00+00:00", "2027-01-14T02:00:00+00:00"]),
    ("0 0 1 10-10/2 *", "UTC", "2027-01-01T00:00", ["2027-10-01T00:00:00+00:00", "2028-10-01T00:00:00+00:00"]),
    ("0 0 * * MON-MON/2", "UTC", "2027-01-01T00:00", ["2027-01-04T00:00:00+00:00", "2027-01-11T00:00:00+00:00"]),
    ("0 0 0 1 JAN-MAR/2 *", "UTC", "2027-01-01T00:00", ["2027-03-01T00:00:00+00:00", "2028-01-01T00:00:00+00:00"]),
    ("  0   6  *  *  MON-FRI ", "UTC", "2026-01-03T00:00", ["2026-01-05T06:00:00+00:00"]),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "zone", "start", "expected"), TABLE)
def test_next_fire_times(expression: str, zone: str, start: str, expected: list[str]) -> None:
    schedule = CronSchedule(expression, zone)
    after = datetime.fromisoformat(start).replace(tzinfo=ZoneInfo(zone))
    got = [t.isoformat() for t in schedule.next_times(after, len(expected))]
    assert got == expected


@pytest.mark.parametrize("zone", [NY, ATHENS, "Australia/Lord_Howe", "UTC"])
@pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 1 * * *", "*/20 * * * *", "0 * * * *"])
def test_slots_strictly_rise_and_agree_everywhere(expression: str, zone: str) -> None:
    start = int(datetime(2025, 1, 1, tzinfo=ZoneInfo("UTC")).timestamp() * 1000)
    end = start + 366 * 24 * 3600 * 1000
    one, other = CronSchedule(expression, zone), CronSchedule(expression, zone)
    slots = one.slots(start, end)
    assert slots == sorted(set(slots)), "slots repeat or go backwards"
    assert all(s % 1000 == 0 for s in slots)
    walked, slot = [], start
    while (slot := other.next_slot(slot)) <= end:
        walked.append(slot)
    assert walked == slots


def test_next_slot_can_go_back_in_time() -> None:
    schedule = CronSchedule("0 * * * *")
    later = schedule.next_slot(1_800_000_000_000)
    earlier = schedule.next_slot(1_700_000_000_000)
    assert earlier < later
    assert schedule.next_slot(earlier) == earlier + 3_600_000


@pytest.mark.timeout(20)
def test_a_repeated_hour_in_a_quarter_hour_zone_ends() -> None:
    """Chatham (+13:45 -> +12:45, 2027-04-04 03:45): the old walk went round 03:00-03:44 forever."""
    zone = ZoneInfo("Pacific/Chatham")
    start = int(datetime(2027, 4, 4, 2, 0, tzinfo=zone).timestamp() * 1000)
    slots = CronSchedule("* 3 * * *", "Pacific/Chatham").slots(start, start + 6 * 3600 * 1000)
    local = [datetime.fromtimestamp(s / 1000, zone).isoformat()[11:] for s in slots]
    first = [f"03:{m:02d}:00+13:45" for m in range(45)]
    second = [f"03:{m:02d}:00+12:45" for m in range(60)]
    assert local == first + second
    walked = CronSchedule("* 3 * * *", "Pacific/Chatham")
    slot = start
    for expected in slots:
        slot = walked.next_slot(slot)
        assert slot == expected


@pytest.mark.parametrize(
    ("expression", "fields"),
    [
        ("* 2 * * 4-4/3", ["*", "2", "*", "*", "4"]),
        ("0 0 1 10-10/2 *", ["0", "0", "1", "10", "*"]),
        ("0 0 * * MON-MON/2", ["0", "0", "*", "*", "1"]),
        ("0 0 * * mon-fri/2", ["0", "0", "*", "*", "1,3,5"]),
        ("0 0 * * 5/1", ["0", "0", "*", "*", "5,6,7"]),
        ("*/15 1-5 L JAN-MAR 5L,FRI#2", ["*/15", "1-5", "L", "1-3", "5L,5#2"]),
        ("0 0 * * 7#1", ["0", "0", "*", "*", "0#1"]),
        ("@hourly", ["0", "*", "*", "*", "*"]),
    ],
)
def test_fields_reach_cronsim_in_a_form_every_version_reads_alike(
    expression: str, fields: list[str]
) -> None:
    """A range with a step is written out as its values: cronsim 2.8 read N-N/s as N-max/s."""
    assert _normalise(expression) == fields


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "the minute field '61' has 61, out of range: each value is a number 0-59"),
        ("* 24 * * *", "the hour field '24' has 24, out of range: each value is a number 0-23"),
        (
            "* * 0 * *",
            "the day-of-month field '0' has 0, out of range: each value is a number 1-31",
        ),
        ("* * * 13 *", "the month field '13' has 13, out of range: each value is a number 1-12 or"),
        ("* * * * 8", "the day-of-week field '8' has 8, out of range: each value is a number 0-7"),
        ("60 * * * * *", "the second field '60' has 60, out of range"),
        (
            "* * * * MON-XYZ",
            "the day-of-week field 'MON-XYZ' has 'XYZ' where a value goes: each value is a number 0-7 .* a name SUN-SAT",
        ),
        (
            "*/0 * * * *",
            "the minute field '\\*/0' has the step '0': a step is a whole number, 1 or more",
        ),
        ("5-3 * * * *", "the minute field '5-3' has the range '5-3', which runs backwards"),
        (
            "* * * * fri-sun",
            "the day-of-week field 'fri-sun' has the range 'FRI-SUN', which runs backwards: .* Sunday is 0 or 7, so write it 7 here",
        ),
        ("1,,2 * * * *", "the minute field '1,,2' has an empty item"),
        ("* * ? * *", "the day-of-month field '\\?' uses '\\?'.* write '\\*'"),
        ("* * * * L", "the day-of-week field 'L' uses 'L' without a day: write '5L'"),
        ("* * * * 5#6", "the day-of-week field '5#6' has '5#6': after '#' comes which week, 1-5"),
        (
            "* * 5L * *",
            "the day-of-month field '5L' has '5L' where a value goes: each value is a number 1-31, 'L'",
        ),
        ("* * * * * * *", "7 fields"),
        ("* * * *", "4 fields"),
        ("", "0 fields"),
        ("@reboot", "@reboot"),
        ("@every_minute", "not a known macro"),
    ],
)
def test_bad_expressions_name_the_field_and_the_rule(expression: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message) as caught:
        CronSchedule(expression)
    assert isinstance(caught.value, ValueError)
    assert repr(expression) in str(caught.value)


@pytest.mark.parametrize(
    ("expression", "fields"),
    [
        ("0 0 30 2 *", "the day-of-month field '30' asks for day 30 or later, and the month field '2' allows only months of at most 29 days"),
        ("0 0 31 4,6,9,11 *", "the day-of-month field '31' asks for day 31 or later, and the month field '4,6,9,11' allows only months of at most 30 days"),
        ("0 0 30,31 FEB */2", "the day-of-month field '30,31' asks for day 30 or later, and the month field 'FEB'"),
        ("0 0 0 31 2 *", "the day-of-month field '31' asks for day 31 or later"),
    ],
)  # fmt: skip
def test_a_date_that_never_comes_is_said_to_never_fire(expression: str, fields: str) -> None:
    """A valid field combination with no matching date: not "out of range" (issue 10, 11 f)."""
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule(expression)
    message = str(caught.value)
    assert message.startswith(f"cron expression {expression!r} never fires: ")
    assert fields in message
    assert "each field is valid alone, but no date matches both" in message
    assert "out of range" not in message


def test_day_fields_that_never_meet_are_said_to_never_fire() -> None:
    """Day 1 is never the fifth Monday: no date in 50 years, and the message quotes the fields."""
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule("0 0 */40 * MON#5")
    assert str(caught.value) == (
        "cron expression '0 0 */40 * MON#5' never fires: no date in 50 years matches its "
        "day-of-month field '*/40', month field '*' and day-of-week field 'MON#5' together"
    )


def test_a_day_that_only_the_or_rule_reaches_is_fine() -> None:
    """Both day fields restricted are OR-ed (Vixie): 30 February never comes, but Mondays do."""
    schedule = CronSchedule("0 0 30 2 MON")
    got = schedule.next_times(datetime(2027, 1, 1, tzinfo=UTC), 2)
    assert [t.date().isoformat() for t in got] == ["2027-02-01", "2027-02-08"]


def test_a_zoneinfo_object_is_a_time_zone() -> None:
    """``ZoneInfo("Europe/Athens")`` works as the name does, and the name is kept for display."""
    by_object = CronSchedule("0 9 * * *", ZoneInfo(ATHENS))
    by_name = CronSchedule("0 9 * * *", ATHENS)
    assert by_object.timezone == ATHENS
    assert repr(by_object) == "CronSchedule('0 9 * * *', timezone='Europe/Athens')"
    start = int(datetime(2027, 3, 1, tzinfo=UTC).timestamp() * 1000)
    year = start + 366 * 86400 * 1000
    assert by_object.slots(start, year) == by_name.slots(start, year)
    assert by_object.next_times(datetime(2027, 3, 1, tzinfo=UTC), 1)[0].isoformat() == (
        "2027-03-01T09:00:00+02:00"
    )


def test_a_zoneinfo_without_a_name_is_refused(tmp_path: Path) -> None:
    source = Path("/usr/share/zoneinfo/Europe/Athens")
    if not source.exists():
        pytest.skip("no system zone files to read a nameless ZoneInfo from")
    with source.open("rb") as handle:
        nameless = ZoneInfo.from_file(handle)
    with pytest.raises(InvalidTimezone, match="has no IANA name; pass ZoneInfo\\('Area/City'\\)"):
        CronSchedule("0 9 * * *", nameless)


@pytest.mark.parametrize("zone", [UTC, 3, None])
def test_other_zone_objects_are_refused(zone: object) -> None:
    with pytest.raises(InvalidTimezone, match="IANA zone name such as 'Europe/Athens'"):
        CronSchedule("0 9 * * *", zone)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe/athens "])
def test_unknown_zones_are_refused(zone: str) -> None:
    with pytest.raises(InvalidTimezone, match="IANA"):
        CronSchedule("* * * * *", zone)


@pytest.mark.parametrize(
    ("zone", "why"),
    [
        ("localtime", "the host's own zone setting (/etc/localtime)"),
        ("LocalTime", "the host's own zone setting"),
        ("posixrules", "POSIX TZ strings"),
        ("posix/Europe/Athens", "only some systems install; pass 'Europe/Athens'"),
        ("right/Europe/Athens", "count leap seconds"),
    ],
)
def test_zone_names_that_depend_on_the_host_are_refused(zone: str, why: str) -> None:
    async def handler(ctx: RunContext) -> None:
        pass

    scheduler = Scheduler(MemoryBackend())
    for attempt in (
        lambda: CronSchedule("* * * * *", zone),
        lambda: scheduler.add("job", "* * * * *", handler, timezone=zone),
        lambda: load_timezone(zone),
    ):
        with pytest.raises(InvalidTimezone) as caught:
            attempt()
        text = str(caught.value)
        assert f"time zone {zone!r} is not an IANA zone name" in text and why in text, text
    try:
        loaded = ZoneInfo(zone)
    except (OSError, ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return  # this host has no such file: refused as unknown anyway
    with pytest.raises(InvalidTimezone, match=why.replace("(", r"\(").replace(")", r"\)")):
        CronSchedule("* * * * *", loaded)
    assert scheduler.jobs == {}


def test_next_times_refuses_a_naive_after() -> None:
    """A naive ``after`` was read in this host's zone: 15:00 under TZ=UTC, 20:00 under New York.
    It is refused, naming the value and the rule; an aware one gives the same answer anywhere."""
    schedule = CronSchedule("0 * * * *", ATHENS)
    with pytest.raises(InvalidOption) as caught:
        schedule.next_times(datetime(2026, 1, 1, 12, 30), 1)
    assert str(caught.value) == (
        "after=datetime.datetime(2026, 1, 1, 12, 30) for CronSchedule.next_times must be an "
        "aware datetime (with a time zone, e.g. datetime.now(ZoneInfo('Europe/Athens'))): a "
        "naive one would be read in this host's time zone"
    )
    for text in ("2026-01-01T12:30:00", 1767270600):
        with pytest.raises(InvalidOption, match=r"must be an aware datetime .*, not a (str|int)$"):
            schedule.next_times(text, 1)  # type: ignore[arg-type]
    [got] = schedule.next_times(datetime(2026, 1, 1, 12, 30, tzinfo=UTC), 1)
    assert got.isoformat() == "2026-01-01T15:00:00+02:00"


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (-1, "count=-1 for CronSchedule.next_times is out of range: it must be an integer "
         "from 1 to 10000"),
        (0, "count=0 for CronSchedule.next_times is out of range"),
        (10**9, "count=1000000000 for CronSchedule.next_times is out of range"),
        (1.5, "count=1.5 for CronSchedule.next_times must be an integer from 1 to 10000, "
         "not a float"),
        (True, "count=True for CronSchedule.next_times must be an integer from 1 to 10000, "
         "not a bool"),
    ],
)  # fmt: skip
def test_next_times_refuses_a_bad_count(count: object, said: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        CronSchedule("* * * * *").next_times(datetime(2026, 1, 1, tzinfo=UTC), count)  # type: ignore[arg-type]
    assert str(caught.value).startswith(said), caught.value


def test_next_times_stops_where_the_times_anarchon_handles_end() -> None:
    """As ``anarchon next`` does: the times end at 9998-12-31T23:59:59.999Z, so fewer are
    returned (it raised OverflowError past year 9999). At the defaults: 1 and 10 000."""
    daily = CronSchedule("0 0 * * *")
    got = daily.next_times(datetime(9998, 12, 30, tzinfo=UTC), 5)
    assert [t.isoformat() for t in got] == ["9998-12-31T00:00:00+00:00"]
    leap = CronSchedule("0 0 29 2 *").next_times(datetime(9990, 1, 1, tzinfo=UTC), 10)
    assert [t.year for t in leap] == [9992, 9996]
    assert daily.next_times(datetime.max.replace(tzinfo=UTC), 1) == []
    assert len(daily.next_times(datetime(2026, 1, 1, tzinfo=UTC), 10_000)) == 10_000
    assert CronSchedule("0 0 * * *").next_times(datetime(2026, 1, 1, tzinfo=UTC), 1)[0].day == 2
