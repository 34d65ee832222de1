"""Times people give anarchon: one parser, one range, one rule for a pause's end.

Every time a person types or passes goes through here before anything is computed or stored:
``anarchon pause --until``, ``anarchon explain``'s SLOT and the dashboard's slot addresses
(:func:`parse_time`, once, then :meth:`Written.read` in the job's zone once it is known), the
dashboard's ``from``, ``to`` and ``end`` (:func:`parse_time_ms`),
:func:`anarchon.explain.explain`'s slot (:func:`check_time_ms`), and the end of a pause from the
command line, the dashboard, ``Scheduler.pause``/``pause_all`` and
:func:`anarchon.steering.pause` (:func:`check_until_ms`). Each refuses a value that breaks the
rule with :class:`~anarchon.errors.InvalidOption` naming the value and the rule: exit code 2 on
the command line, 400 on the dashboard.

A time written without an offset (no ``Z``, no ``+02:00``) is a wall-clock time in the zone of
the job it is about (:data:`NAIVE_RULE`), on the command line and the dashboard alike: a job in
Europe/Athens whose slot shows as ``03:30:00+03:00`` is found by typing ``03:30``. Where no
single zone applies (``pause --all``, a job no live instance carries) such a time is refused:
it would be a guess. A local time the zone skips (spring forward) is refused naming the gap; one
it has twice (fall back) is the first of the two, where a job at that fixed time fires (Debian
cron's rule), and :func:`read_time` says so in a note naming the second with its offset.

The times anarchon handles run from 1970-01-01T00:00:00Z (epoch ms 0) to
9998-12-31T23:59:59.999Z (:data:`LATEST_MS`): a year short of the last moment Python's
``datetime`` holds, so a time in range is a date in every time zone as well. A pause ends
within :data:`PAUSE_HORIZON_MS` of being stored: ten years, the longest history a job keeps
(``history_ttl_ms``); a later end is almost always a unit gone wrong (epoch microseconds or
nanoseconds), and "until resumed" says the same without one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from ._readable import DAY_MS, iso, ms_of
from ._schedule import load_timezone
from .errors import InvalidOption

__all__ = [
    "ANY_ZONE",
    "EARLIEST_MS",
    "EVERY_ZONE",
    "LATEST_MS",
    "NAIVE_RULE",
    "PAUSE_HORIZON_MS",
    "RANGE_RULE",
    "Reading",
    "Written",
    "check_readable",
    "check_time_ms",
    "check_until_ms",
    "in_range",
    "no_carrier",
    "parse_duration_ms",
    "parse_time",
    "parse_time_ms",
    "read_time",
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
NAIVE_RULE: Final = (
    "a time without an offset (no Z, no +02:00) is read in the time zone of the job it is about"
)
"""How a time without an offset is read, as messages state it."""
ANY_ZONE: Final = ("UTC", "Etc/GMT+12", "Etc/GMT-14")
"""UTC and the zones at the ends of the offsets from UTC: a time none reads is in no zone."""
EVERY_ZONE: Final = "--all is about every job, whatever their time zones"
"""Why a time without an offset is refused for every job at once."""
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
    "is not an ISO 8601 time (2026-01-15T10:33:00, with or without an offset such as +02:00 or Z) "
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


@dataclass(frozen=True, slots=True)
class Reading:
    """A time as :func:`read_time` read it: epoch ms, and a note when the text named a local
    time its zone has twice (read as the first)."""

    ms: int
    note: str | None = None


def parse_time_ms(
    text: str,
    zone: str | None = None,
    *,
    what: str,
    now_ms: int | None = None,
    no_zone: str = "",
) -> int:
    """Epoch ms of ``text``, as :func:`read_time` reads it."""
    return read_time(text, zone, what=what, now_ms=now_ms, no_zone=no_zone).ms


@dataclass(frozen=True, slots=True)
class Written:
    """A time as a person wrote it, parsed once (:func:`parse_time`) and read later, once the
    zone of the job it is about and the clock are known (:meth:`read`): a duration from now,
    epoch ms or an ISO 8601 time with its offset (``ms``), or a wall-clock time without one
    (``local``, naive)."""

    text: str
    """The text, stripped: what messages quote."""
    what: str
    """What the time is (``--until``, ``SLOT``), as messages name it."""
    span_ms: int | None = None
    """A duration from now (``30m``), in ms."""
    ms: int | None = None
    """Epoch ms of a time that needs no zone (epoch ms digits, an offset), in the range."""
    local: datetime | None = None
    """A time without an offset: a wall-clock time in the zone of the job it is about."""

    def read(self, zone: str | None, *, now_ms: int | None = None, no_zone: str = "") -> Reading:
        """The time in epoch ms, as :func:`read_time` documents it: a duration counts from
        ``now_ms``, a time without an offset is read in ``zone`` (None: refused, ``no_zone``
        saying why); :class:`~anarchon.errors.InvalidOption` naming :attr:`what`, the text and
        the rule for a time out of range or one ``zone`` skips."""
        if self.span_ms is not None:
            if now_ms is None:
                raise ValueError(f"{self.what} {_shown(self.text)} is a duration: give now_ms")
            at_ms = now_ms + self.span_ms
            if not in_range(at_ms):
                raise InvalidOption(
                    f"{self.what} {_shown(self.text)} from now ends out of range: {RANGE_RULE}"
                )
            return Reading(at_ms)
        if self.ms is not None:
            return Reading(self.ms)
        assert self.local is not None
        if zone is None:
            example = self.local.isoformat(timespec="seconds") + "Z"
            raise InvalidOption(
                f"{self.what} {_shown(self.text)} has no offset, and no job's time zone applies"
                f"{f' ({no_zone})' if no_zone else ''}: {NAIVE_RULE}; write the offset "
                f"({example} for UTC, or +02:00 and the like) or give epoch milliseconds"
            )
        at = self.local.replace(tzinfo=load_timezone(zone))
        value = _ms_in_range(at, self.text, self.what)
        _check_exists(at, self.text, zone, self.what)
        return Reading(value, _repeated(at, self.text, zone))


def parse_time(text: str, *, what: str, durations: bool = False) -> Written:
    """Parse ``text`` once, before the zone of the job it is about or the clock is known: an
    ISO 8601 time, epoch ms digits, and with ``durations`` a duration from now
    (:func:`parse_duration_ms`). :class:`~anarchon.errors.InvalidOption` naming ``what``, the
    text and the rule for what no zone reads (not a time, no such date, a fraction finer than a
    millisecond, epoch ms or a time with its offset out of range); :meth:`Written.read` tells
    the rest."""
    text = text.strip()
    if durations:
        span = parse_duration_ms(text)
        if span is not None:
            return Written(text, what, span_ms=span)
    if len(text) <= _LONGEST and _DIGITS.fullmatch(text):
        value = int(text)
        if not in_range(value):
            raise InvalidOption(
                f"{what} {_shown(text)} is out of range: {RANGE_RULE}{_unit_hint(value)}"
            )
        return Written(text, what, ms=value)
    also = " nor a duration such as 30m, 2h, 1d or 1h30m" if durations else ""
    at = _read_iso(text, what, also)
    if at.microsecond % 1000:
        raise InvalidOption(
            f"{what} {_shown(text)} has a fraction of a second finer than a millisecond: "
            "anarchon's times are whole milliseconds (at most 3 decimals, such as .250)"
        )
    if at.tzinfo is None:
        return Written(text, what, local=at)
    return Written(text, what, ms=_ms_in_range(at, text, what))


def _ms_in_range(at: datetime, text: str, what: str) -> int:
    """Epoch ms of the aware ``at``, in the range; InvalidOption naming ``text`` otherwise."""
    try:
        value = ms_of(at)
    except (OverflowError, ValueError):  # a date that is no date in UTC (year 0, year 10000)
        value = LATEST_MS + 1
    if not in_range(value):
        raise InvalidOption(f"{what} {_shown(text)} is out of range: {RANGE_RULE}")
    return value


def read_time(
    text: str,
    zone: str | None,
    *,
    what: str,
    now_ms: int | None = None,
    no_zone: str = "",
) -> Reading:
    """``text`` read as a time: an ISO 8601 time (without an offset: a wall-clock time in
    ``zone``, the zone of the job it is about, by :data:`NAIVE_RULE`) or epoch ms digits, and
    with ``now_ms`` also a duration from then (:func:`parse_duration_ms`). ``zone`` None means
    no job's zone applies (``no_zone`` says why): a time without an offset is refused. The
    time must be in the range (:data:`RANGE_RULE`) and, without an offset, exist in ``zone``;
    :class:`~anarchon.errors.InvalidOption` naming ``what``, the text and the rule
    otherwise. :func:`parse_time` and :meth:`Written.read` in one."""
    written = parse_time(text, what=what, durations=now_ms is not None)
    return written.read(zone, now_ms=now_ms, no_zone=no_zone)


def no_carrier(job: str) -> str:
    """Why no zone applies to a time about ``job`` (for ``no_zone``): no live instance
    carries it, so its definition, zone included, is unknown."""
    return f"no live instance carries job {job!r}, so its time zone is unknown"


def check_readable(
    text: str | Written,
    *,
    what: str,
    now_ms: int | None = None,
    zones: tuple[str | None, ...] = ANY_ZONE,
) -> None:
    """Refuse, before the job's zone is known, a ``text`` (or a time parsed already by
    :func:`parse_time`) that no zone of ``zones`` reads (``notatime``, a date the calendar
    lacks, a time out of range whatever the zone): the first zone's
    :class:`~anarchon.errors.InvalidOption`. What only the job's zone decides (a gap) is
    checked when it is read."""
    written = (
        text
        if isinstance(text, Written)
        else parse_time(text, what=what, durations=now_ms is not None)
    )
    first: InvalidOption | None = None
    for zone in zones:
        try:
            written.read(zone, now_ms=now_ms, no_zone=EVERY_ZONE)
        except InvalidOption as exc:
            first = first or exc
        else:
            return
    if first is not None:
        raise first


def _repeated(at: datetime, text: str, zone: str) -> str | None:
    """A note for a local time ``at`` (in ``zone``, known to exist) that the clocks there show
    twice (put back): it is read as the first, and the second has another offset."""
    first, second = at.replace(fold=0), at.replace(fold=1)
    if first.utcoffset() == second.utcoffset():
        return None
    return (
        f"{_shown(text)} occurs twice in {zone} (the clocks are put back there): read as the "
        f"first, {first.isoformat()}, where a job at that fixed time fires; give "
        f"{second.isoformat()} for the second"
    )


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
        f"{what} {_shown(text)} does not exist in {zone}: {NAIVE_RULE}, and the clocks "
        f"there skip {span} (put "
        f"forward, as at the start of daylight saving time); give a time outside the gap, or "
        f"one with its offset such as {end.isoformat()}{_offset(after)}"
    )


def _offset(delta: timedelta) -> str:
    """``+03:00``, ``-04:00``: a UTC offset as ISO 8601 writes it."""
    minutes = int(delta.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def check_until_ms(
    until_ms: object, now_ms: int, *, what: str | None = None, clock: str = "the backend's clock"
) -> int:
    """``until_ms``, the end of a pause stored at ``now_ms`` (backend clock): epoch ms after
    ``now_ms`` and at most :data:`PAUSE_HORIZON_MS` later. :class:`~anarchon.errors.
    InvalidOption` naming the value (``what``, default ``until=<ms> ms``) and the rule
    otherwise: checked before anything is stored, so no instance, command or page ever reads
    such an end. ``clock``: whose clock ``now_ms`` read, as the message names it."""
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
            f"{label} is not in the future ({clock} reads {iso(now_ms)}, {now_ms} ms)"
            f"{hint}: a pause "
            "ends at a later time, or leave it out to pause until resumed"
        )
    if until_ms - now_ms > PAUSE_HORIZON_MS:
        when = iso(until_ms) if in_range(until_ms) else "after 9998"
        raise InvalidOption(
            f"{label} ({when}) is more than 10 years after {clock} "
            f"({iso(now_ms)}){_unit_hint(until_ms)}: a pause ends within 10 years "
            f"({PAUSE_HORIZON_MS} ms); leave the end out to pause until resumed"
        )
    return until_ms
