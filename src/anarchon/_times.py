"""Times people give anarchon: one parser, one range, one rule for a pause's end.

Every time a person types or passes goes through here before anything is computed or stored:
``anarchon pause --until`` and ``anarchon explain``'s SLOT (:func:`parse_time_ms`), the
dashboard's ``from``, ``to``, ``end`` and slot addresses (:func:`parse_time_ms`),
:func:`anarchon.explain.explain`'s slot (:func:`check_time_ms`), and the end of a pause from the
command line, the dashboard, ``Scheduler.pause``/``pause_all`` and
:func:`anarchon.steering.pause` (:func:`check_until_ms`). Each refuses a value that breaks the
rule with :class:`~anarchon.errors.InvalidOption` naming the value and the rule: exit code 2 on
the command line, 400 on the dashboard.

The times anarchon handles run from 1970-01-01T00:00:00Z (epoch ms 0) to
9998-12-31T23:59:59.999Z (:data:`LATEST_MS`): a year short of the last moment Python's
``datetime`` holds, so a time in range is a date in every time zone as well. A pause ends
within :data:`PAUSE_HORIZON_MS` of being stored: ten years, the longest history a job keeps
(``history_ttl_ms``); a later end is almost always a unit gone wrong (epoch microseconds or
nanoseconds), and "until resumed" says the same without one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

from ._readable import DAY_MS, iso, ms_of
from ._schedule import load_timezone
from .errors import InvalidOption

__all__ = [
    "EARLIEST_MS",
    "LATEST_MS",
    "PAUSE_HORIZON_MS",
    "RANGE_RULE",
    "check_time_ms",
    "check_until_ms",
    "in_range",
    "parse_duration_ms",
    "parse_time_ms",
]

EARLIEST_MS: Final = 0
"""1970-01-01T00:00:00Z: the earliest time anarchon handles (epoch ms)."""
LATEST_MS: Final = 253_370_764_799_999
"""9998-12-31T23:59:59.999Z: the latest time anarchon handles (epoch ms)."""
PAUSE_HORIZON_MS: Final = 10 * 365 * DAY_MS
"""A pause ends at most this long after it is stored (the longest ``history_ttl_ms``)."""
RANGE_RULE: Final = (
    "a time is from 1970-01-01T00:00:00Z to 9998-12-31T23:59:59.999Z "
    f"(epoch milliseconds {EARLIEST_MS} to {LATEST_MS})"
)
"""The range as messages state it."""
UNITS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION: Final = re.compile(r"(?:(\d+)([smhdw]))+")
_DIGITS: Final = re.compile(r"[0-9]+")
_ISO_SHAPED: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}|$)")
# No time or duration is longer; a longer text is not read any further (int() of thousands of
# digits is refused by Python itself).
_LONGEST: Final = 64
# 2001-09-09T01:46:40Z: epoch ms from here up to ten times as much (2286) are the times people
# mean; a number that reads as one of them in another unit was likely given in that unit.
_PLAUSIBLE_MS: Final = 10**12
_NOT_A_TIME: Final = (
    "is not an ISO 8601 time (2026-01-15T10:33:00, with or without a zone such as +02:00 or Z) "
    "nor epoch milliseconds"
)


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut after :data:`_LONGEST` characters."""
    return repr(text if len(text) <= _LONGEST else text[:_LONGEST] + "...")


def _unit_hint(ms: int) -> str:
    """A guess at the unit a number past :data:`LATEST_MS` was meant in (one that reads as a
    time between 2001 and 2286 in it), or ``""``."""
    if ms <= LATEST_MS:
        return ""
    for factor, unit in ((1_000, "microseconds"), (1_000_000, "nanoseconds")):
        if _PLAUSIBLE_MS <= ms // factor < _PLAUSIBLE_MS * 10:
            return f" (epoch {unit}? divide by {factor:,} for milliseconds)"
    return ""


def in_range(ms: int) -> bool:
    """True when ``ms`` is a time anarchon handles (:data:`EARLIEST_MS` to :data:`LATEST_MS`)."""
    return EARLIEST_MS <= ms <= LATEST_MS


def check_time_ms(value: object, what: str) -> int:
    """``value``, epoch milliseconds within the range; :class:`~anarchon.errors.InvalidOption`
    naming ``what``, the value and the rule otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{what}={value!r} must be epoch milliseconds (an int)")
    if not in_range(value):
        raise InvalidOption(f"{what}={value!r} is out of range: {RANGE_RULE}{_unit_hint(value)}")
    return value


def parse_duration_ms(text: str) -> int | None:
    """``30m``, ``2h``, ``1d``, ``1h30m`` (units ``s``, ``m``, ``h``, ``d``, ``w``) as
    milliseconds; None if ``text`` is not one."""
    text = text.strip()
    if len(text) > _LONGEST or not DURATION.fullmatch(text):
        return None
    return sum(int(n) * UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", text))


def parse_time_ms(text: str, zone: str = "UTC", *, what: str, now_ms: int | None = None) -> int:
    """Epoch ms of ``text``: an ISO 8601 time (without a zone: in ``zone``) or epoch ms digits,
    and with ``now_ms`` also a duration from then (:func:`parse_duration_ms`). The time must
    be in the range (:data:`RANGE_RULE`); :class:`~anarchon.errors.InvalidOption` naming
    ``what``, the text and the rule otherwise."""
    text = text.strip()
    if now_ms is not None:
        span = parse_duration_ms(text)
        if span is not None:
            at_ms = now_ms + span
            if not in_range(at_ms):
                raise InvalidOption(
                    f"{what} {_shown(text)} from now ends out of range: {RANGE_RULE}"
                )
            return at_ms
    if len(text) <= _LONGEST and _DIGITS.fullmatch(text):
        value = int(text)
        if not in_range(value):
            raise InvalidOption(
                f"{what} {_shown(text)} is out of range: {RANGE_RULE}{_unit_hint(value)}"
            )
        return value
    also = " nor a duration such as 30m, 2h, 1d or 1h30m" if now_ms is not None else ""
    at = _read_iso(text, what, also)
    if at.microsecond % 1000:
        raise InvalidOption(
            f"{what} {_shown(text)} has a fraction of a second finer than a millisecond: "
            "anarchon's times are whole milliseconds (at most 3 decimals, such as .250)"
        )
    local = at.tzinfo is None
    if local:
        at = at.replace(tzinfo=load_timezone(zone))
    try:
        value = ms_of(at)
    except (OverflowError, ValueError):  # a date that is no date in UTC (year 0, year 10000)
        value = LATEST_MS + 1
    if not in_range(value):
        raise InvalidOption(f"{what} {_shown(text)} is out of range: {RANGE_RULE}")
    if local:
        _check_exists(at, text, zone, what)
    return value


def _read_iso(text: str, what: str, also: str) -> datetime:
    """``text`` as an ISO 8601 time; :class:`~anarchon.errors.InvalidOption` otherwise,
    saying "no such date or time" for one shaped as a date that the calendar lacks."""
    try:
        if len(text) > _LONGEST:
            raise ValueError(text)
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError as exc:
        if _ISO_SHAPED.match(text) and len(text) <= _LONGEST:
            # Shaped as a date and time, but no such one: 2027-02-29, 2026-13-01, T25:00.
            raise InvalidOption(f"{what} {_shown(text)} is no such date or time: {exc}") from None
        raise InvalidOption(f"{what} {_shown(text)} {_NOT_A_TIME}{also}") from None


def _check_exists(at: datetime, text: str, zone: str, what: str) -> None:
    """Refuse a local time ``at`` (in ``zone``) that the clocks there skip (a DST gap): read
    with either offset it would name another time than the one given."""
    utc = at.astimezone(UTC)
    if utc.astimezone(at.tzinfo).replace(tzinfo=None) == at.replace(tzinfo=None):
        return
    before, after = at.replace(fold=0).utcoffset(), at.replace(fold=1).utcoffset()
    if before is None or after is None:
        return
    # The transition: the first second (UTC) with the later offset, between the two readings.
    lo = int(at.replace(fold=1).astimezone(UTC).timestamp())
    hi = int(at.replace(fold=0).astimezone(UTC).timestamp())
    lo, hi = min(lo, hi), max(lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, at.tzinfo).utcoffset() == before:
            lo = mid + 1
        else:
            hi = mid
    switch = datetime.fromtimestamp(lo, UTC).replace(tzinfo=None)
    start, end = switch + before, switch + after
    span = (
        f"from {start:%H:%M} to {end:%H:%M} on {start:%Y-%m-%d}"
        if start.date() == end.date()
        else f"from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}"
    )
    raise InvalidOption(
        f"{what} {_shown(text)} does not exist in {zone}: the clocks there skip {span} (put "
        f"forward, as at the start of daylight saving time); give a time outside the gap, or "
        f"one with its offset such as {end.isoformat()}{_offset(after)}"
    )


def _offset(delta: timedelta) -> str:
    """``+03:00``, ``-04:00``: a UTC offset as ISO 8601 writes it."""
    minutes = int(delta.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def check_until_ms(until_ms: object, now_ms: int, *, what: str | None = None) -> int:
    """``until_ms``, the end of a pause stored at ``now_ms`` (backend clock): epoch ms after
    ``now_ms`` and at most :data:`PAUSE_HORIZON_MS` later. :class:`~anarchon.errors.
    InvalidOption` naming the value (``what``, default ``until=<ms> ms``) and the rule
    otherwise: checked before anything is stored, so no instance, command or page ever reads
    such an end."""
    if isinstance(until_ms, bool) or not isinstance(until_ms, int):
        raise InvalidOption(
            f"until={until_ms!r} must be epoch milliseconds (an int), or None to pause until "
            "resumed"
        )
    label = what or f"until={until_ms!r} ms"
    if until_ms <= now_ms:
        hint = ""
        if _PLAUSIBLE_MS // 1000 <= until_ms < _PLAUSIBLE_MS // 100:
            hint = " (epoch seconds? multiply by 1000 for milliseconds)"
        raise InvalidOption(
            f"{label} is not in the future (the backend's clock reads {iso(now_ms)}, {now_ms} ms)"
            f"{hint}: a pause "
            "ends at a later time, or leave it out to pause until resumed"
        )
    if until_ms - now_ms > PAUSE_HORIZON_MS:
        when = iso(until_ms) if in_range(until_ms) else "after 9998"
        raise InvalidOption(
            f"{label} ({when}) is more than 10 years after the backend's clock "
            f"({iso(now_ms)}){_unit_hint(until_ms)}: a pause ends within 10 years "
            f"({PAUSE_HORIZON_MS} ms); leave the end out to pause until resumed"
        )
    return until_ms
