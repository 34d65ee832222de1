"""Slot computation: cron syntax, macros, and Debian cron's DST rule for 5 and 6 fields."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from anarchon import CronSchedule, InvalidSchedule, InvalidTimezone

NY = "America/New_York"
ATHENS = "Europe/Athens"

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


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "minute field '61'"),
        ("* 24 * * *", "hour field '24'"),
        ("* * 0 * *", "day-of-month field '0'"),
        ("* * * 13 *", "month field '13'"),
        ("* * * * 8", "day-of-week field '8'"),
        ("60 * * * * *", "second field '60'"),
        ("* * * * MON-XYZ", "day-of-week field 'MON-XYZ'"),
        ("*/0 * * * *", "minute field '\\*/0'"),
        ("0 0 30 2 *", "day-of-month field '30'"),
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("", "0 fields"),
        ("@reboot", "@reboot"),
        ("@every_minute", "not a known macro"),
    ],
)
def test_bad_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message) as caught:
        CronSchedule(expression)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe/athens "])
def test_unknown_zones_are_refused(zone: str) -> None:
    with pytest.raises(InvalidTimezone, match="IANA"):
        CronSchedule("* * * * *", zone)
