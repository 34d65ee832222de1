"""The one parser of the times people give (anarchon._times): what it reads, what it refuses and
how it says so, the end a pause may have, and stored ends no time holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from anarchon._times import (
    EVERY_ZONE,
    LATEST_MS,
    NAIVE_RULE,
    PAUSE_HORIZON_MS,
    RANGE_RULE,
    Reading,
    check_time_ms,
    check_until_ms,
    parse_duration_ms,
    parse_time,
    parse_time_ms,
    read_time,
)
from anarchon.control import Pause, paused_reason
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
        # Read as 03:30 EDT before, so explain answered "not a slot" for a job at 30 2 * * *.
        ("2027-03-14T02:30:00", "America/New_York", "does not exist in America/New_York"),
        ("2027-03-14T02:00", "America/New_York", "skip from 02:00 to 03:00 on 2027-03-14"),
        ("2027-03-28T03:00", "Europe/Athens", "skip from 03:00 to 04:00 on 2027-03-28"),
        ("2011-12-30T12:00", "Pacific/Apia", "skip from 2011-12-30 00:00 to 2011-12-31 00:00"),
        # Cut to the millisecond before, silently.
        ("2026-01-01T00:00:00.000001Z", "UTC", "finer than a millisecond"),
        ("2026-01-01T00:00:00.2505", "UTC", "finer than a millisecond"),
        # "not an ISO 8601 time" before.
        ("2027-02-29", "UTC", "is no such date or time: day is out"),
        ("2026-13-01T00:00", "UTC", "is no such date or time: month must be in 1..12"),
        ("2026-01-01T25:00", "UTC", "is no such date or time: hour must be in 0..23"),
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


@pytest.mark.parametrize(
    ("until", "said"),
    [
        (NOW, "until=1796571690000 ms is not in the future"),
        # The clock as a time an operator reads (anarchon pause --until 0s said only the ms).
        (NOW - 1, "(the backend's clock reads 2026-12-06T15:41:30Z, 1796571690000 ms)"),
        (NOW // 1000 + 3600, "(epoch seconds? multiply by 1000 for milliseconds)"),
        (NOW + PAUSE_HORIZON_MS + 1, "is more than 10 years after the backend's clock"),
        (datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000, "must be epoch milliseconds"),
        (NOW * 1000, "(after 9998) is more than 10 years"),
        (NOW * 1000, "(epoch microseconds? divide by 1,000 for milliseconds)"),
        (10**20, "leave the end out to pause until resumed"),
    ],
)
def test_a_pause_ends_in_the_future_within_ten_years(until: object, said: str) -> None:
    with pytest.raises(InvalidOption) as info:
        check_until_ms(until, NOW)
    assert said in str(info.value), info.value


def test_a_pause_end_at_the_horizon_is_taken_and_named_as_given() -> None:
    assert check_until_ms(NOW + 1, NOW) == NOW + 1
    assert check_until_ms(NOW + PAUSE_HORIZON_MS, NOW) == NOW + PAUSE_HORIZON_MS
    with pytest.raises(InvalidOption, match=r"^--until '2100-01-01' \(2100-01-01T00:00:00Z\)"):
        check_until_ms(4_102_444_800_000, NOW, what="--until '2100-01-01'")


@pytest.mark.parametrize("stored", [LATEST_MS + 1, NOW * 1000, NOW * 1_000_000, 10**20])
def test_a_stored_end_no_time_holds_reads_as_until_resumed(stored: int) -> None:
    # Written by an earlier version, which took any end: every reader got OverflowError.
    row = {"job": "tick", "by": "old@ops", "at_ms": NOW, "until_ms": stored}
    for pause in (Pause.from_dict(row), Pause.from_json(Pause.from_dict(row).to_json())):
        assert pause.until_ms is None and pause.active(NOW + 10**15)
        assert paused_reason(pause) == "paused by old@ops"
    assert Pause(job="tick", by="b", at_ms=NOW, until_ms=LATEST_MS).until_ms == LATEST_MS


def test_the_gap_message_offers_the_time_after_it_with_its_offset() -> None:
    with pytest.raises(InvalidOption, match=r"such as 2027-03-14T03:00:00-04:00"):
        parse_time_ms("2027-03-14T02:30:00", "America/New_York", what="SLOT")


@pytest.mark.parametrize(
    ("text", "zone", "ms"),
    [
        ("2027-03-14T03:00:00", "America/New_York", 1_805_007_600_000),  # just after the gap
        ("2027-03-14T02:30:00-04:00", "America/New_York", 1_805_005_800_000),  # its offset
        ("2026-11-01T01:30", "America/New_York", 1_793_511_000_000),  # repeated: the first
        ("2026-01-01T00:00:00.250000Z", "UTC", NEW_YEAR + 250),
    ],
)
def test_times_next_to_a_gap_repeated_ones_and_whole_milliseconds_are_read(
    text: str, zone: str, ms: int
) -> None:
    assert parse_time_ms(text, zone, what="SLOT") == ms


def test_a_time_without_an_offset_is_refused_where_no_jobs_zone_applies() -> None:
    # Read in UTC before (the default zone): `pause --all --until 2027-01-01T10:00`.
    with pytest.raises(InvalidOption) as info:
        parse_time_ms("2027-01-01T10:00", None, what="--until", no_zone=EVERY_ZONE)
    assert str(info.value) == (
        f"--until '2027-01-01T10:00' has no offset, and no job's time zone applies ({EVERY_ZONE}):"
        f" {NAIVE_RULE}; write the offset (2027-01-01T10:00:00Z for UTC, or +02:00 and the "
        "like) or give epoch milliseconds"
    )
    with pytest.raises(InvalidOption, match=r"^SLOT '2027-01-01' has no offset, .* applies: a"):
        parse_time_ms("2027-01-01", what="SLOT")  # no zone given: none applies
    # With an offset, as epoch ms or as a duration, no zone is needed.
    assert parse_time_ms("2026-01-01T02:00+02:00", None, what="--until") == NEW_YEAR
    assert parse_time_ms(str(NEW_YEAR), None, what="--until") == NEW_YEAR
    assert parse_time_ms("1h", None, what="--until", now_ms=NOW) == NOW + 3_600_000


@pytest.mark.parametrize(
    ("text", "zone", "first", "second"),
    [
        # America/New_York puts its clocks back at 02:00 EDT on 2026-11-01.
        ("2026-11-01T01:30", "America/New_York", "2026-11-01T01:30:00-04:00", "-05:00"),
        ("2026-10-25T03:30", "Europe/Athens", "2026-10-25T03:30:00+03:00", "+02:00"),
        # Lord Howe: half an hour back at 02:00 (+11:00 to +10:30) on 2026-04-05.
        ("2026-04-05T01:45", "Australia/Lord_Howe", "2026-04-05T01:45:00+11:00", "+10:30"),
    ],
)
def test_a_local_time_the_clocks_show_twice_is_the_first_and_a_note_says_so(
    text: str, zone: str, first: str, second: str
) -> None:
    reading = read_time(text, zone, what="SLOT")
    assert reading.ms == int(datetime.fromisoformat(first).timestamp() * 1000)
    assert reading.note == (
        f"{text!r} occurs twice in {zone} (the clocks are put back there): read as the first, "
        f"{first}, where a job at that fixed time fires; give {first[:19]}{second} for the second"
    )
    assert read_time(first, zone, what="SLOT") == Reading(reading.ms)  # an offset: no note
    assert read_time(text, "UTC", what="SLOT").note is None  # UTC never repeats a time


def test_a_local_time_the_clocks_skip_names_the_rule_it_was_read_by() -> None:
    with pytest.raises(InvalidOption) as info:
        parse_time_ms("2027-03-14T02:30:00", "America/New_York", what="SLOT")
    said = f"does not exist in America/New_York: {NAIVE_RULE}, and the clocks there skip from"
    assert said in str(info.value), info.value


def test_a_time_parsed_once_reads_as_read_time_reads_it_in_any_zone() -> None:
    """:func:`parse_time` parses the text once; :meth:`Written.read` gives what
    :func:`read_time` gives, for each zone and clock, and refuses what it refuses."""
    for text in ("2h", str(NEW_YEAR), "2026-01-01T02:00+02:00", "2026-10-25T03:30"):
        written = parse_time(text, what="--until", durations=True)
        for zone in ("UTC", "Europe/Athens", "Pacific/Kiritimati"):
            wanted = read_time(text, zone, what="--until", now_ms=NOW)
            assert written.read(zone, now_ms=NOW) == wanted, (text, zone)
    with pytest.raises(InvalidOption, match="no job's time zone applies"):
        parse_time("2027-01-01T10:00", what="--until").read(None, no_zone=EVERY_ZONE)
    with pytest.raises(InvalidOption, match="nor a duration such as 30m"):
        parse_time("soon", what="--until", durations=True)
    with pytest.raises(InvalidOption, match="'2h' is not an ISO 8601 time"):
        parse_time("2h", what="SLOT")  # no durations: not a time
    with pytest.raises(ValueError, match="is a duration: give now_ms"):
        parse_time("2h", what="--until", durations=True).read("UTC")
