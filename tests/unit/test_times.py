"""The one parser of the times people give (anarchon._times): what it reads, what it refuses and
how it says so."""

from __future__ import annotations

import pytest

from anarchon._times import (
    LATEST_MS,
    RANGE_RULE,
    check_time_ms,
    parse_duration_ms,
    parse_time_ms,
)
from anarchon.errors import InvalidOption

NEW_YEAR = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = 1_796_571_690_000  # 2026-12-06T15:41:30Z


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30m", 1_800_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("45s", 45_000),
        ("2w", 1_209_600_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "30", "m", "2 hours", "1.5h", "-1h", "2026-01-01", "1" * 70 + "s"]
)
def test_not_durations(text: str) -> None:
    assert parse_duration_ms(text) is None


@pytest.mark.parametrize(
    ("text", "zone", "ms"),
    [
        ("2026-01-01T00:00:00Z", "UTC", NEW_YEAR),
        ("2026-01-01T02:00:00+02:00", "UTC", NEW_YEAR),
        ("2026-01-01T00:00:00", "UTC", NEW_YEAR),
        ("2026-01-01T02:00:00", "Europe/Athens", NEW_YEAR),
        (" 2026-01-01 ", "UTC", NEW_YEAR),
        (str(NEW_YEAR), "Europe/Athens", NEW_YEAR),
        ("0", "UTC", 0),
        ("1970-01-01T00:00:00Z", "UTC", 0),
        (str(LATEST_MS), "UTC", LATEST_MS),
        ("9998-12-31T23:59:59.999Z", "UTC", LATEST_MS),
        ("9998-12-31T23:59:59.999", "Pacific/Kiritimati", LATEST_MS - 14 * 3_600_000),
    ],
)
def test_times_with_and_without_a_zone_and_epoch_ms(text: str, zone: str, ms: int) -> None:
    assert parse_time_ms(text, zone, what="SLOT") == ms


@pytest.mark.parametrize(
    ("text", "zone", "said"),
    [
        # Each raised ValueError or OverflowError from datetime before (a traceback, exit 1).
        ("99999999999999999999999", "UTC", "is out of range"),
        ("0001-01-01T00:00:00", "Europe/Athens", "is out of range"),
        ("0001-01-01T00:00:00", "UTC", "is out of range"),
        ("253402300800000", "UTC", "is out of range"),
        (str(LATEST_MS + 1), "UTC", "is out of range"),
        ("9999-12-31T23:59:59-02:00", "UTC", "is out of range"),
        ("9999-06-01T00:00:00Z", "UTC", "is out of range"),
        ("1969-12-31T23:59:59Z", "UTC", "is out of range"),
        ("1796571690227009", "UTC", "(epoch microseconds? divide by 1,000 for milliseconds)"),
        ("1796571690227009123", "UTC", "(epoch nanoseconds? divide by 1,000,000"),
        ("noon", "UTC", "'noon' is not an ISO 8601 time"),
        ("-5", "UTC", "nor epoch milliseconds"),
        ("9" * 5000, "UTC", "'" + "9" * 64 + "...' is not an ISO 8601 time"),
    ],
)
def test_times_out_of_range_or_unreadable_are_refused_naming_value_and_rule(
    text: str, zone: str, said: str
) -> None:
    with pytest.raises(InvalidOption) as info:
        parse_time_ms(text, zone, what="SLOT")
    message = str(info.value)
    assert message.startswith("SLOT '") and said in message, message
    if "out of range" in said:
        assert RANGE_RULE in message


def test_a_duration_counts_from_now_and_must_end_in_range() -> None:
    assert parse_time_ms("2h", what="--until", now_ms=NOW) == NOW + 7_200_000
    with pytest.raises(InvalidOption, match="'2h' is not an ISO 8601 time"):
        parse_time_ms("2h", what="SLOT")  # no now: no duration
    with pytest.raises(InvalidOption, match="nor a duration such as 30m"):
        parse_time_ms("soon", what="--until", now_ms=NOW)
    with pytest.raises(InvalidOption, match="'1000000w' from now ends out of range"):
        parse_time_ms("1000000w", what="--until", now_ms=NOW)


def test_check_time_ms() -> None:
    assert check_time_ms(NOW, "slot") == NOW
    for bad, said in (
        (-1, "slot=-1 is out of range"),
        (LATEST_MS + 1, f"slot={LATEST_MS + 1} is out of range"),
        (True, "must be epoch milliseconds (an int)"),
        (1.5, "must be epoch milliseconds (an int)"),
    ):
        with pytest.raises(InvalidOption, match=said.replace("(", r"\(").replace(")", r"\)")):
            check_time_ms(bad, "slot")
