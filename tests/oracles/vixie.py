"""A brute-force cron matcher with Vixie/Debian cron semantics, written from crontab(5).

It shares no code with anarchon or cronsim: each field is parsed into the set of values it allows
(Vixie's ``get_range``: ``*``, ``a``, ``a-b``, ``a-b/s`` stepping ``s`` from ``a`` to ``b``,
``*/s``), and a day matches by Vixie's rule: when the day-of-month or the day-of-week field starts
with ``*`` both must match, otherwise either may. On top of Vixie it knows the extensions anarchon
documents: a seconds field first (6 fields), ``a/s`` (``a`` to the field's maximum, stepping ``s``,
as cronie reads it), ``L`` and ``LW`` in the day of month, ``5L`` (last Friday) and ``5#2`` (second
Friday) in the day of week, and the ``@`` macros. ``wildcard`` is Debian's ``MIN_STAR | HR_STAR``
flag (any sub-day field starting with ``*``), which decides how a job crosses a DST change.

Slots are found the slow, obvious way: day by day, every time of day the fields allow.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import cached_property

MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
EPOCH = date(1970, 1, 1)


@dataclass(frozen=True)
class Field:
    """One cron field's name, bounds and value names."""

    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    first_name: int = 0

    def number(self, text: str) -> int:
        upper = text.upper()
        if upper in self.names:
            return self.names.index(upper) + self.first_name
        if not text.isdigit():
            raise ValueError(f"{self.name}: {text!r} is not a number")
        value = int(text)
        if not self.low <= value <= self.high:
            raise ValueError(f"{self.name}: {value} outside {self.low}-{self.high}")
        return value

    def term(self, text: str) -> set[int]:
        """Values of one comma-separated term (Vixie's get_range, plus ``a/s``)."""
        body, slash, step_text = text.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{self.name}: bad step in {text!r}")
            step = int(step_text)
        if body == "*":
            first, last = self.low, self.high
        elif "-" in body:
            a, b = body.split("-", 1)
            first, last = self.number(a), self.number(b)
            if first > last:
                raise ValueError(f"{self.name}: backwards range {text!r}")
        else:
            first = self.number(body)
            last = self.high if slash else first
        return set(range(first, last + 1, step))


SECOND = Field("second", 0, 59)
MINUTE = Field("minute", 0, 59)
HOUR = Field("hour", 0, 23)
DOM = Field("day-of-month", 1, 31)
MONTH = Field("month", 1, 12, MONTH_NAMES, 1)
DOW = Field("day-of-week", 0, 7, DAY_NAMES, 0)


@dataclass(frozen=True)
class Spec:
    """A parsed expression: the values each field allows, and the flags cron keeps beside them."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # 0..6, Sunday 0 (7 folded in)
    dom_last: bool = False
    dom_last_weekday: bool = False
    dow_last: frozenset[int] = frozenset()
    dow_nth: frozenset[tuple[int, int]] = frozenset()
    dom_star: bool = False
    dow_star: bool = False
    wildcard: bool = False
    six_fields: bool = False
    _days: dict[date, bool] = field(default_factory=dict, compare=False, repr=False)

    def day_matches(self, day: date) -> bool:
        """Vixie's day rule: AND when either day field starts with ``*``, else OR."""
        cached = self._days.get(day)
        if cached is None:
            cached = day.month in self.months and self._day_rule(day)
            self._days[day] = cached
        return cached

    def _day_rule(self, day: date) -> bool:
        dom_ok = self._dom_ok(day)
        dow_ok = self._dow_ok(day)
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def _dom_ok(self, day: date) -> bool:
        if day.day in self.doms:
            return True
        last = calendar.monthrange(day.year, day.month)[1]
        if self.dom_last and day.day == last:
            return True
        if self.dom_last_weekday:
            weekday_last = last
            while date(day.year, day.month, weekday_last).weekday() >= 5:
                weekday_last -= 1
            return day.day == weekday_last
        return False

    def _dow_ok(self, day: date) -> bool:
        dow = (day.weekday() + 1) % 7  # Sunday 0
        if dow in self.dows:
            return True
        last = calendar.monthrange(day.year, day.month)[1]
        if dow in self.dow_last and day.day + 7 > last:
            return True
        return (dow, (day.day - 1) // 7 + 1) in self.dow_nth

    @cached_property
    def minutes_of_day(self) -> list[int]:
        """Every minute of a day (0..1439) the hour and minute fields allow, in order."""
        return sorted(h * 60 + m for h in self.hours for m in self.minutes)

    @cached_property
    def seconds_of_day(self) -> list[int]:
        """Every second of a day the sub-day fields allow, in order."""
        return sorted(t * 60 + s for t in self.minutes_of_day for s in self.seconds)

    def matches_minute(self, local_minute: int) -> bool:
        """True when the local wall-clock minute (minutes since 1970-01-01 00:00) matches."""
        day, minute = divmod(local_minute, 1440)
        hour, minute = divmod(minute, 60)
        return (
            minute in self.minutes
            and hour in self.hours
            and self.day_matches(EPOCH + timedelta(days=day))
        )

    def utc_slots(self, after_s: int, count: int, horizon_days: int) -> list[int]:
        """The first ``count`` slots (epoch seconds) after ``after_s`` read in UTC."""
        out: list[int] = []
        first_day = after_s // 86400
        for day_index in range(first_day, first_day + horizon_days + 1):
            if not self.day_matches(EPOCH + timedelta(days=day_index)):
                continue
            base = day_index * 86400
            for second in self.seconds_of_day:
                slot = base + second
                if slot > after_s:
                    out.append(slot)
                    if len(out) == count:
                        return out
        return out


def parse(expression: str) -> Spec:
    """Parse a 5- or 6-field expression or a macro; ValueError when cron would refuse it."""
    text = expression.strip()
    if text.startswith("@"):
        text = MACROS[text.lower()]
    parts = text.split()
    if len(parts) not in (5, 6):
        raise ValueError(f"{len(parts)} fields")
    six = len(parts) == 6
    if not six:
        parts.insert(0, "0")
    sec, minute, hour, dom, month, dow = parts
    doms: set[int] = set()
    dom_last = dom_last_weekday = False
    for term in _terms(dom):
        if term.upper() == "L":
            dom_last = True
        elif term.upper() == "LW":
            dom_last_weekday = True
        else:
            doms |= DOM.term(term)
    dows: set[int] = set()
    dow_last: set[int] = set()
    dow_nth: set[tuple[int, int]] = set()
    for term in _terms(dow):
        if term.upper().endswith("L"):
            dow_last.add(_weekday(term[:-1]))
        elif "#" in term:
            day_text, nth_text = term.split("#", 1)
            if not nth_text.isdigit() or not 1 <= int(nth_text) <= 5:
                raise ValueError(f"bad nth in {term!r}")
            dow_nth.add((_weekday(day_text), int(nth_text)))
        else:
            dows |= {v % 7 for v in DOW.term(term)}
    return Spec(
        seconds=frozenset(_field(SECOND, sec)),
        minutes=frozenset(_field(MINUTE, minute)),
        hours=frozenset(_field(HOUR, hour)),
        doms=frozenset(doms),
        months=frozenset(_field(MONTH, month)),
        dows=frozenset(dows),
        dom_last=dom_last,
        dom_last_weekday=dom_last_weekday,
        dow_last=frozenset(dow_last),
        dow_nth=frozenset(dow_nth),
        dom_star=dom.startswith("*"),
        dow_star=dow.startswith("*"),
        wildcard=any(f.startswith("*") for f in (sec if six else "", minute, hour)),
        six_fields=six,
    )


def _terms(text: str) -> Iterator[str]:
    for term in text.split(","):
        if not term:
            raise ValueError(f"empty term in {text!r}")
        yield term


def _field(spec: Field, text: str) -> set[int]:
    values: set[int] = set()
    for term in _terms(text):
        values |= spec.term(term)
    return values


def _weekday(text: str) -> int:
    return DOW.number(text) % 7
