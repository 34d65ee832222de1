"""Cron schedules: parsing, validation and slot computation, with Debian cron's DST rule.

A slot is an integer number of milliseconds since the Unix epoch (UTC). Every instance computes
the same slots from the same expression and zone, so ``<job>:<slot>`` names one run everywhere.

Each field is validated and rewritten here before cronsim sees it, so a range with a step means
what it means in Vixie and Debian cron whatever cronsim's version: ``a-b/s`` is ``a``, ``a+s``, ...
up to ``b`` (cronsim 2.8 read ``4-4/3`` as ``4-7/3``), ``a/s`` is ``a`` to the field's maximum.

cronsim only walks the *wall clock* (naive local times); this module maps wall-clock times to
instants with Debian cron's daylight saving rule, for 5- and 6-field expressions alike and for a
shift or an offset of any size (Lord Howe's 30 minutes, Chatham's +12:45, Troll's 2 hours):

* a *wildcard* job (a sub-day field, second, minute or hour, starts with ``*``) fires at every
  instant whose local wall-clock time matches, in real time: in a repeated stretch it fires in both
  passes, and the times inside a gap do not happen;
* a *fixed-time* job (no sub-day field starts with ``*``) fires once per matching wall-clock time:
  a time inside a gap fires right after it (the wall clock moved on by whole minutes, so a 6-field
  time keeps its second), several times in one gap fire once, and a time that occurs twice fires
  at its first pass.

``tests/unit/test_dst_oracle.py`` checks this against a simulation of Debian cron's main loop
around every 2027 change of every IANA zone.
"""

from __future__ import annotations

import functools
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Final, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import InvalidOption, InvalidSchedule, InvalidTimezone

__all__ = ["CronSchedule", "load_timezone", "shared_schedule"]

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Names that zoneinfo loads from a host's zone files but that are no IANA zone (by their
# casefold: a case-insensitive file system answers 'LocalTime' too), and why each is refused.
_HOST_ZONES: Final = {
    "localtime": "the host's own zone setting (/etc/localtime), which differs between hosts",
    "posixrules": "the host's rules for POSIX TZ strings, which differ between systems",
}
_HOST_TREES: Final = {
    "posix/": "are copies that only some systems install",
    "right/": "count leap seconds, so their slots are off by them, and only some systems have them",
}
# Beyond this distance a cached iterator is rebuilt rather than walked forward.
_REBUILD_AFTER_MS: Final = 36 * 3600 * 1000
_EPOCH: Final = datetime(1970, 1, 1)
_UTC_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_NEVER: Final = 2**63  # a floor above every slot: no span covered
_ONE_SECOND: Final = timedelta(seconds=1)
_ONE_MINUTE: Final = timedelta(minutes=1)
_NO_SHIFT: Final = timedelta(0)
_MONTH_DAYS: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MONTH_NAMES: Final = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV",
                       "DEC")  # fmt: skip
_DAY_NAMES: Final = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


class _Field(NamedTuple):
    name: str
    low: int
    high: int
    rule: str  # what a value may be, for messages
    names: tuple[str, ...] = ()
    first_named: int = 0  # the value of names[0]


_SECOND: Final = _Field("second", 0, 59, "a number 0-59")
_MINUTE: Final = _Field("minute", 0, 59, "a number 0-59")
_HOUR: Final = _Field("hour", 0, 23, "a number 0-23")
_DOM: Final = _Field("day-of-month", 1, 31, "a number 1-31, 'L' (last day) or 'LW' (last weekday)")
_MONTH: Final = _Field("month", 1, 12, "a number 1-12 or a name JAN-DEC", _MONTH_NAMES, 1)
_DOW: Final = _Field(
    "day-of-week",
    0,
    7,
    "a number 0-7 (0 and 7 are Sunday), a name SUN-SAT, '5L' (the last Friday) "
    "or '5#2' (the second Friday)",
    _DAY_NAMES,
)
_FIVE: Final = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)
_SIX: Final = (_SECOND, *_FIVE)


def load_timezone(name: str) -> ZoneInfo:
    """Return the IANA zone ``name``, or raise :class:`InvalidTimezone` naming it (also for a
    name that depends on the host: :func:`_refuse_host_zone`)."""
    if not isinstance(name, str) or not name:
        raise InvalidTimezone(
            f"time zone {name!r} is not an IANA zone name such as 'Europe/Athens' "
            "(or a zoneinfo.ZoneInfo)"
        )
    _refuse_host_zone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidTimezone(
            f"time zone {name!r} is not a known IANA zone name (such as 'UTC' or 'Europe/Athens')"
        ) from None


def _refuse_host_zone(name: str) -> None:
    """Raise :class:`InvalidTimezone` for a name the system's zone files answer but which is no
    IANA zone: each depends on the host, so hosts configured differently would compute
    different slots for one job (or refuse it)."""
    key = name.casefold()
    if key in _HOST_ZONES:
        raise InvalidTimezone(
            f"time zone {name!r} is not an IANA zone name but {_HOST_ZONES[key]}: hosts set up "
            "differently would compute different slots for the job; pass the IANA name of the "
            "zone meant, such as 'Europe/Athens' or 'UTC'"
        )
    for prefix, what in _HOST_TREES.items():
        if key.startswith(prefix):
            raise InvalidTimezone(
                f"time zone {name!r} is not an IANA zone name: {prefix!r} zones {what}; pass "
                f"{name[len(prefix) :]!r}"
            )


def _zone(timezone: str | ZoneInfo) -> tuple[ZoneInfo, str]:
    if isinstance(timezone, ZoneInfo):
        if timezone.key is None:
            raise InvalidTimezone(
                f"time zone {timezone!r} was read from a file and has no IANA name; pass "
                "ZoneInfo('Area/City') or the name itself, so every instance reads the same zone"
            )
        _refuse_host_zone(timezone.key)
        return timezone, timezone.key
    return load_timezone(timezone), timezone


class CronSchedule:
    """A validated cron expression in a time zone that yields slots (epoch milliseconds, UTC).

    Accepts 5 fields (minute first), 6 fields (seconds first: ``"* * * * * *"`` is every
    second) and the macros ``@yearly``, ``@monthly``, ``@weekly``, ``@daily``, ``@hourly``.
    The zone is an IANA name or a :class:`zoneinfo.ZoneInfo`; ``timezone`` keeps its name.
    """

    __slots__ = (
        "__weakref__",
        "_floor",
        "_iter",
        "_last",
        "_six",
        "_walker",
        "_wildcard",
        "expression",
        "timezone",
        "zone",
    )

    def __init__(self, expression: str, timezone: str | ZoneInfo = "UTC") -> None:
        self.expression = expression
        self.zone, self.timezone = _zone(timezone)
        fields = _normalise(expression)
        self._six = len(fields) == 6
        self._wildcard = any(field.startswith("*") for field in fields[: len(fields) - 3])
        self._walker = _Walker(expression, " ".join(fields))
        self._iter: Iterator[int] | None = None
        self._last = 0
        self._floor = _NEVER  # the last answer, _last, is the next slot after any time from here
        # Parse now and ask for one slot, so every error surfaces when the job is added.
        try:
            self.next_slot(_now_ms())
        except StopIteration:
            written = expression.split()
            dom, month, dow = (written if len(written) in (5, 6) else fields)[-3:]
            raise InvalidSchedule(
                f"cron expression {expression!r} never fires: no date in 50 years matches its "
                f"day-of-month field {dom!r}, month field {month!r} and day-of-week field "
                f"{dow!r} together"
            ) from None

    @property
    def seconds_field(self) -> bool:
        """True when the expression has a seconds field (6 fields)."""
        return self._six

    def next_slot(self, after_ms: int) -> int:
        """Return the first slot strictly after ``after_ms`` (epoch milliseconds)."""
        if self._floor <= after_ms < self._last:
            # Asked again inside the span the last answer covers: jobs sharing this schedule
            # (shared_schedule) all ask for the slot after one "now" on start.
            return self._last
        self._floor = _NEVER  # until this call has its answer (a walk may end: StopIteration)
        if self._iter is None or after_ms < self._last or after_ms - self._last > _REBUILD_AFTER_MS:
            self._iter = self._walk(after_ms)
            self._last = next(self._iter) * 1000
        while self._last <= after_ms:
            self._last = next(self._iter) * 1000
        self._floor = after_ms
        return self._last

    def slots(self, after_ms: int, until_ms: int) -> list[int]:
        """Return every slot in ``(after_ms, until_ms]``, oldest first (those before the end of
        the calendar, year 9999, when ``until_ms`` is later)."""
        found: list[int] = []
        try:
            for second in self._walk(after_ms):
                slot = second * 1000
                if slot > until_ms:
                    break
                found.append(slot)
        except OverflowError:  # the walk ran past year 9999: no later slot exists
            pass
        return found

    def next_times(self, after: datetime, count: int) -> list[datetime]:
        """Return the next ``count`` (1 to 10 000) fire times after ``after``, an aware datetime,
        as aware datetimes in the zone; fewer when the times anarchon handles end first
        (9998-12-31T23:59:59.999Z). A naive ``after`` raises
        :class:`~anarchon.errors.InvalidOption`: it would be read in this host's time zone."""
        from ._options import NEXT_TIMES, check_int
        from ._times import LATEST_MS

        rule = (
            f"after={after!r} for CronSchedule.next_times must be an aware datetime (with a "
            f"time zone, e.g. datetime.now(ZoneInfo({self.timezone!r})))"
        )
        if not isinstance(after, datetime):
            raise InvalidOption(f"{rule}, not a {type(after).__name__}")
        if after.utcoffset() is None:
            raise InvalidOption(f"{rule}: a naive one would be read in this host's time zone")
        check_int("count", count, NEXT_TIMES, "CronSchedule.next_times")
        out: list[datetime] = []
        slot = int(after.timestamp() * 1000)
        for _ in range(count if slot < LATEST_MS else 0):
            try:
                slot = self.next_slot(slot)
            except (OverflowError, StopIteration):  # the walk ran past the end of the calendar
                break
            if slot > LATEST_MS:
                break
            out.append(datetime.fromtimestamp(slot / 1000, self.zone))
        return out

    def _walk(self, after_ms: int) -> Iterator[int]:
        # Slots are whole seconds, so "after after_ms" is "after its whole second".
        after_s = after_ms // 1000
        if self._wildcard:
            return _real_time(self._walker, self.zone, after_s)
        return _wall_clock(self._walker, self.zone, after_s)

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, timezone={self.timezone!r})"


_SHARED: weakref.WeakValueDictionary[tuple[str, str | ZoneInfo], CronSchedule] = (
    weakref.WeakValueDictionary()
)


def shared_schedule(expression: str, timezone: str | ZoneInfo = "UTC") -> CronSchedule:
    """``CronSchedule(expression, timezone)``, one object per expression and zone while any
    holder keeps it: 100 000 jobs on a few hundred schedules parse each once and keep one walk
    each. Only for holders on one thread (:meth:`CronSchedule.next_slot` keeps its walk)."""
    key = (expression, timezone)
    try:
        found = _SHARED.get(key)
    except TypeError:  # an unhashable argument: CronSchedule names what is wrong with it
        return CronSchedule(expression, timezone)
    if found is None:
        found = _SHARED[key] = CronSchedule(expression, timezone)
    return found


class _Walker:
    """Makes cronsim walks of one expression, parsed once: a walk starts as a copy of a template.

    Parsing is most of what a new CronSim costs, and a scheduler that starts 10 000 jobs, or a
    job whose next slot is days away, starts a walk often. The copy sets the template's attributes
    one by one, in order, so the walk keeps CPython's fast attribute access (copying ``__dict__``
    wholesale made every step of the walk a quarter slower). A cronsim whose objects cannot be
    copied that way gets a fresh CronSim per walk instead.
    """

    __slots__ = ("_expr", "_template")

    def __init__(self, expression: str, expr: str) -> None:
        self._expr = expr
        try:
            template = CronSim(expr, _EPOCH)
        except CronSimError as exc:  # the fields were checked: this is cronsim disagreeing
            raise InvalidSchedule(f"cron expression {expression!r} is invalid: {exc}") from None
        state = getattr(template, "__dict__", {})
        self._template = tuple(state.items()) if "dt" in state and "parts" in state else None

    def walk(self, start: datetime) -> CronSim:
        """A walk over the wall-clock times (naive) after ``start``, a whole second."""
        if self._template is None:
            return CronSim(self._expr, start)
        walk = CronSim.__new__(CronSim)
        for name, value in self._template:
            setattr(walk, name, value)
        walk.dt = start
        return walk


def _real_time(walker: _Walker, zone: ZoneInfo, after_s: int) -> Iterator[int]:
    """Epoch seconds after ``after_s`` at which the local wall clock matches the expression.

    A wall-clock time that occurs twice gives two instants, its first pass in order with the
    others and its second pass an offset change later: the second passes wait in a queue and are
    merged in, so the slots still rise. A time inside a gap gives none.
    """
    utcoffset = _offsets(zone)
    local = datetime.fromtimestamp(after_s, zone)
    start = local.replace(tzinfo=None)
    if not local.fold:
        # In the first pass of a repeated stretch, the second passes of the wall-clock times
        # already behind us are still to come: walk from as far back as the stretch repeats.
        repeat = utcoffset(start) - utcoffset(start.replace(fold=1))
        if repeat > _NO_SHIFT:
            start -= repeat
    second_passes: deque[int] = deque()
    for wall in walker.walk(start):
        offset = utcoffset(wall)
        later = utcoffset(wall.replace(fold=1))
        if later > offset:
            continue  # inside a gap: this wall-clock time does not happen
        slot = (wall - offset - _EPOCH) // _ONE_SECOND
        while second_passes and second_passes[0] <= slot:
            pending = second_passes.popleft()
            if after_s < pending < slot:
                yield pending
        if slot > after_s:
            yield slot
        if later != offset:
            second_passes.append((wall - later - _EPOCH) // _ONE_SECOND)
    for pending in second_passes:
        if pending > after_s:
            yield pending


def _wall_clock(walker: _Walker, zone: ZoneInfo, after_s: int) -> Iterator[int]:
    """Epoch seconds after ``after_s`` of each matching wall-clock time, Debian's fixed-time way.

    A time inside a gap moves on by whole minutes to the first that exists; a time that occurs
    twice is taken at its first pass; times that land on one instant give one slot.
    """
    utcoffset = _offsets(zone)
    start = datetime.fromtimestamp(after_s, zone).replace(tzinfo=None, fold=0)
    last = after_s
    for wall in walker.walk(start):
        offset = utcoffset(wall)
        if utcoffset(wall.replace(fold=1)) > offset:
            while utcoffset(wall.replace(fold=1)) > utcoffset(wall):
                wall += _ONE_MINUTE
            offset = utcoffset(wall)
        slot = (wall - offset - _EPOCH) // _ONE_SECOND
        if slot > last:
            last = slot
            yield slot


def _offsets(zone: ZoneInfo) -> Callable[[datetime], timedelta]:
    """``zone.utcoffset`` of a naive wall-clock time (its ``fold`` picks the pass): never None."""
    return zone.utcoffset  # type: ignore[return-value]


def _normalise(expression: str) -> list[str]:
    """Validate ``expression`` and return its fields as cronsim should read them."""
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
        text = MACROS[lowered]
    fields = text.split()
    count = len(fields)
    if count not in (5, 6):
        raise InvalidSchedule(
            f"cron expression {expression!r} has {count} field{'' if count == 1 else 's'}; it "
            "needs 5 (minute hour day-of-month month day-of-week) or 6 (a seconds field first)"
        )
    specs = _SIX if count == 6 else _FIVE
    parsed = [
        _Parser(expression, spec, field).parse() for spec, field in zip(specs, fields, strict=True)
    ]
    _check_day_fields(expression, fields[-3:], parsed[-3:])
    return [text for text, _, _ in parsed]


class _Parser:
    """One field: checks every comma-separated item and rewrites ranges with steps as lists."""

    def __init__(self, expression: str, spec: _Field, field: str) -> None:
        self.expression = expression
        self.spec = spec
        self.field = field

    def parse(self) -> tuple[str, set[int], bool]:
        """Return cronsim's text for the field, its plain values, and whether it has L/LW/#."""
        items: list[str] = []
        values: set[int] = set()
        special = False
        for item in self.field.upper().split(","):
            if not item:
                raise self.error("has an empty item (two commas in a row, or one at an end)")
            text = self.special(item)
            if text is not None:
                special = True
            else:
                text, picked = self.item(item)
                values.update(picked)
            items.append(text)
        return ",".join(items), values, special

    def special(self, item: str) -> str | None:
        """``L``/``LW`` in the day of month, ``5L`` and ``5#2`` in the day of week."""
        if self.spec is _DOM and item in ("L", "LW"):
            return item
        if self.spec is _DOW and item.endswith("L") and "/" not in item:
            if item == "L":
                raise self.error("uses 'L' without a day: write '5L' for the last Friday")
            return f"{self.number(item[:-1]) % 7}L"
        if self.spec is _DOW and "#" in item:
            day, _, nth = item.partition("#")
            if not (nth.isascii() and nth.isdigit() and 1 <= int(nth) <= 5):
                raise self.error(f"has {item!r}: after '#' comes which week, 1-5")
            return f"{self.number(day) % 7}#{int(nth)}"
        return None

    def item(self, item: str) -> tuple[str, range]:
        spec = self.spec
        body, slash, step_text = item.partition("/")
        step = self.step(step_text) if slash else 1
        if body == "*":
            return item if slash else "*", range(spec.low, spec.high + 1, step)
        if "-" in body:
            first_text, _, last_text = body.partition("-")
            first, last = self.number(first_text), self.number(last_text)
            if first > last:
                hint = (
                    "; Sunday is 0 or 7, so write it 7 here" if spec is _DOW and last == 0 else ""
                )
                raise self.error(
                    f"has the range {body!r}, which runs backwards: the first value must not be "
                    f"larger than the last{hint}"
                )
        else:
            first = self.number(body)
            last = spec.high if slash else first
        picked = range(first, last + 1, step)
        if not slash:
            return (str(first) if first == last else f"{first}-{last}"), picked
        # A step is written out as the values it picks, so cronsim cannot read it otherwise.
        return ",".join(map(str, picked)), picked

    def number(self, text: str) -> int:
        spec = self.spec
        if text in spec.names:
            return spec.names.index(text) + spec.first_named
        if text == "?":
            raise self.error("uses '?', which anarchon does not know: write '*'")
        if not (text.isascii() and text.isdigit()):
            raise self.error(f"has {text!r} where a value goes: each value is {spec.rule}")
        value = int(text)
        if not spec.low <= value <= spec.high:
            raise self.error(f"has {value}, out of range: each value is {spec.rule}")
        return value

    def step(self, text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) == 0:
            raise self.error(f"has the step {text!r}: a step is a whole number, 1 or more")
        return int(text)

    def error(self, problem: str) -> InvalidSchedule:
        return InvalidSchedule(
            f"cron expression {self.expression!r} is invalid: the {self.spec.name} field "
            f"{self.field!r} {problem}"
        )


def _check_day_fields(
    expression: str, fields: list[str], parsed: list[tuple[str, set[int], bool]]
) -> None:
    """Refuse a day of month that no allowed month has, when it must hold on its own."""
    dom, month, dow = fields
    (_, days, dom_special), (_, months, _), _ = parsed
    # Vixie's rule: the day fields are OR-ed only when neither starts with '*'.
    if dom_special or not (dom.startswith("*") or dow.startswith("*")):
        return
    longest = max(_MONTH_DAYS[m] for m in months)
    if min(days) > longest:
        raise InvalidSchedule(
            f"cron expression {expression!r} never fires: the day-of-month field {dom!r} asks "
            f"for day {min(days)} or later, and the month field {month!r} allows only months "
            f"of at most {longest} days; each field is valid alone, but no date matches both"
        )


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


@functools.lru_cache(maxsize=1024)
def slot_to_datetime(slot_ms: int) -> datetime:
    """Return the aware UTC datetime of a slot."""
    # Positional milliseconds: the keyword form costs three times as much, and this runs
    # several times per slot (the run context, each Run record). Cached (datetimes are
    # immutable): a burst asks for the same slot, and the same few start times, thousands of
    # times; a hit costs a seventh of a computation.
    return _UTC_EPOCH + timedelta(0, 0, 0, slot_ms)
