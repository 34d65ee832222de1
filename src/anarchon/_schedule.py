"""Cron schedules: parsing, validation and slot computation, with Debian cron's DST rule.

A slot is an integer number of milliseconds since the Unix epoch (UTC). Every instance computes
the same slots from the same expression and zone, so ``<job>:<slot>`` names one run everywhere.

Daylight saving time follows Debian cron for 5- and 6-field expressions alike:

* a *fixed-time* job (no sub-day field starts with ``*``: seconds, minutes and hours are given
  explicitly) is computed on local wall-clock time. A time that does not exist (spring forward)
  fires once, right after the gap; a time that occurs twice (fall back) fires once, at the first.
* any other job (a sub-day field is ``*`` or a ``*/n`` step) fires in real time, so ``0 * * * *``
  and ``*/30 * * * *`` keep their rhythm through both changes.

cronsim implements that rule for 5-field expressions only; :class:`CronSchedule` applies it to
6-field expressions too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import InvalidSchedule, InvalidTimezone

__all__ = ["CronSchedule", "load_timezone"]

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIVE_FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
SIX_FIELDS: Final = ("second", *FIVE_FIELDS)
_BAD_FIELD = re.compile(r"Bad (second|minute|hour|day-of-month|month|day-of-week)")
# Beyond this distance a cached iterator is rebuilt rather than walked forward.
_REBUILD_AFTER_MS: Final = 36 * 3600 * 1000


def load_timezone(name: str) -> ZoneInfo:
    """Return the IANA zone ``name``, or raise :class:`InvalidTimezone` naming it."""
    if not isinstance(name, str) or not name:
        raise InvalidTimezone(
            f"time zone {name!r} is not an IANA zone name such as 'Europe/Athens'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidTimezone(
            f"time zone {name!r} is not a known IANA zone name (such as 'UTC' or 'Europe/Athens')"
        ) from None


class _DebianCronSim(CronSim):
    """CronSim that applies the fixed-time DST rule to 6-field expressions as well."""

    def __init__(self, expr: str, dt: datetime) -> None:
        super().__init__(expr, dt)
        parts = expr.split()
        if (
            len(parts) == 6
            and self.fixup_tz is None
            and self.dt.tzinfo not in (None, UTC)
            and not any(field.startswith("*") for field in parts[:3])
        ):
            self.fixup_tz = self.dt.tzinfo
            self.dt = self.dt.replace(tzinfo=None)


class CronSchedule:
    """A validated cron expression in a time zone that yields slots (epoch milliseconds, UTC).

    Accepts 5 fields (minute first), 6 fields (seconds first: ``"* * * * * *"`` is every
    second) and the macros ``@yearly``, ``@monthly``, ``@weekly``, ``@daily``, ``@hourly``.
    """

    __slots__ = ("_expr", "_iter", "_last", "expression", "timezone", "zone")

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        self.expression = expression
        self.timezone = timezone
        self.zone = load_timezone(timezone)
        self._expr = _normalise(expression)
        self._iter: Iterator[datetime] | None = None
        self._last = 0
        # Parse now and ask for one slot, so every error surfaces when the job is added.
        try:
            first = self.next_slot(_now_ms())
        except StopIteration:
            raise InvalidSchedule(
                f"cron expression {expression!r} never fires: no matching time in 50 years"
            ) from None
        del first

    @property
    def seconds_field(self) -> bool:
        """True when the expression has a seconds field (6 fields)."""
        return len(self._expr.split()) == 6

    def next_slot(self, after_ms: int) -> int:
        """Return the first slot strictly after ``after_ms`` (epoch milliseconds)."""
        if self._iter is None or after_ms < self._last or after_ms - self._last > _REBUILD_AFTER_MS:
            self._iter = self._start(after_ms)
            self._last = _to_ms(next(self._iter))
        while self._last <= after_ms:
            self._last = _to_ms(next(self._iter))
        return self._last

    def slots(self, after_ms: int, until_ms: int) -> list[int]:
        """Return every slot in ``(after_ms, until_ms]``, oldest first."""
        found: list[int] = []
        it = self._start(after_ms)
        for moment in it:
            slot = _to_ms(moment)
            if slot > until_ms:
                break
            if slot > after_ms:
                found.append(slot)
        return found

    def next_times(self, after: datetime, count: int) -> list[datetime]:
        """Return the next ``count`` fire times after ``after``, as aware datetimes in the zone."""
        out: list[datetime] = []
        slot = int(after.timestamp() * 1000)
        for _ in range(count):
            slot = self.next_slot(slot)
            out.append(datetime.fromtimestamp(slot / 1000, self.zone))
        return out

    def _start(self, after_ms: int) -> Iterator[datetime]:
        # CronSim ticks one second before matching, so starting at the whole second that
        # contains ``after_ms`` yields slots strictly after it (slots are whole seconds).
        start = datetime.fromtimestamp(after_ms // 1000, self.zone)
        try:
            return _DebianCronSim(self._expr, start)
        except CronSimError as exc:
            raise _explain(self.expression, self._expr, exc) from None

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, timezone={self.timezone!r})"


def _normalise(expression: str) -> str:
    if not isinstance(expression, str):
        raise InvalidSchedule(f"cron expression {expression!r} must be a string")
    text = " ".join(expression.split())
    lowered = text.lower()
    if lowered == "@reboot":
        raise InvalidSchedule(
            "cron expression '@reboot' is not supported: anarchon schedules times, "
            "not start-ups; run start-up work before scheduler.start()"
        )
    if lowered.startswith("@"):
        if lowered not in MACROS:
            raise InvalidSchedule(
                f"cron expression {expression!r} is not a known macro; use one of "
                + ", ".join(sorted(MACROS))
            )
        return MACROS[lowered]
    count = len(text.split())
    if count not in (5, 6):
        raise InvalidSchedule(
            f"cron expression {expression!r} has {count} field{'' if count == 1 else 's'}; it "
            "needs 5 (minute hour day-of-month month day-of-week) or 6 (a seconds field first)"
        )
    return text


def _explain(original: str, expr: str, exc: CronSimError) -> InvalidSchedule:
    fields = expr.split()
    names = SIX_FIELDS if len(fields) == 6 else FIVE_FIELDS
    match = _BAD_FIELD.search(str(exc))
    if match and match.group(1) in names:
        name = match.group(1)
        value = fields[names.index(name)]
        return InvalidSchedule(
            f"cron expression {original!r} is invalid: the {name} field {value!r} is out of "
            "range or malformed"
        )
    return InvalidSchedule(f"cron expression {original!r} is invalid: {exc}")


def _to_ms(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def slot_to_datetime(slot_ms: int) -> datetime:
    """Return the aware UTC datetime of a slot."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=slot_ms)
