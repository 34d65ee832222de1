"""The one checker of numeric and boolean options, for jobs and backend constructors alike.

Every option a user sets gets a type and a range, checked where it is given, with a message that
names the value, the option, whose option it is and the rule::

    lease_ms=10000000000000000000 for job 'sync' is out of range: it must be an integer from
    300 to 86400000 (300 ms to 1 day)

Ranges are inclusive. They keep every sum the core and the backends make (a slot plus a lease,
a TTL or a window) far inside a 64-bit millisecond timestamp.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from .errors import InvalidOption

__all__ = [
    "HISTORY_LIMIT",
    "HISTORY_SIZE",
    "NEXT_TIMES",
    "Bound",
    "check_bool",
    "check_int",
    "check_keywords",
    "check_label",
    "ms_text",
]

_UNITS: Final = (
    (365 * 24 * 3600 * 1000, "year"),
    (24 * 3600 * 1000, "day"),
    (3600 * 1000, "hour"),
    (60 * 1000, "minute"),
    (1000, "s"),
)


def ms_text(ms: int) -> str:
    """A duration in milliseconds as people say it: ``300 ms``, ``1 day``, ``10 years``."""
    for size, unit in _UNITS:
        if ms >= size and ms % size == 0:
            count = ms // size
            if unit == "s":
                return f"{count} s"
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{ms} ms"


@dataclass(frozen=True, slots=True)
class Bound:
    """An inclusive integer range; ``ms`` marks a duration in milliseconds (for messages)."""

    low: int
    """The smallest value allowed."""
    high: int
    """The largest value allowed."""
    ms: bool = False
    """Whether the value is a duration in milliseconds: messages then give the range in readable
    units too."""

    def __str__(self) -> str:
        text = f"an integer from {self.low} to {self.high}"
        if self.ms:
            text += f" ({ms_text(self.low)} to {ms_text(self.high)})"
        return text


HISTORY_SIZE: Final = Bound(1, 1_000_000)
"""The range of ``history_size`` (slots kept per job) on every lease backend: memory, SQLite,
PostgreSQL and Redis."""


HISTORY_LIMIT: Final = Bound(0, 100_000)
"""The range of how many runs one read of a job's history returns: ``limit`` of
:meth:`Scheduler.history <anarchon.Scheduler.history>`; the upper end also bounds
``anarchon history -n`` and the dashboard's ``runs``. Far more than a page of history, and
inside every backend's integer (SQLite's and PostgreSQL's 64 bits, a Redis count)."""


NEXT_TIMES: Final = Bound(1, 10_000)
"""How many fire times one call lists: ``count`` of :meth:`CronSchedule.next_times
<anarchon.CronSchedule.next_times>` and ``anarchon next -n``."""


def check_int(option: str, value: object, bound: Bound, owner: str) -> int:
    """Return ``value`` if it is an int (not a bool) inside ``bound``; else raise InvalidOption.

    ``owner`` says whose option it is in the message: ``"job 'sync'"``, ``"SQLiteBackend"``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(
            f"{option}={value!r} for {owner} must be {bound}, not a {type(value).__name__}"
        )
    if not bound.low <= value <= bound.high:
        raise InvalidOption(f"{option}={value!r} for {owner} is out of range: it must be {bound}")
    return value


def check_bool(option: str, value: object, owner: str) -> bool:
    """Return ``value`` if it is True or False; else raise InvalidOption (``"no"`` is not False)."""
    if not isinstance(value, bool):
        raise InvalidOption(
            f"{option}={value!r} for {owner} must be True or False, not a {type(value).__name__}"
        )
    return value


def check_label(option: str, value: object, limit: int) -> str:
    """Return ``value`` if it is a non-empty, printable string of at most ``limit`` characters
    (a name written into logs and history: an ``instance_id``, who paused or asked); else raise
    InvalidOption naming it and the rule."""
    if not isinstance(value, str) or not value or len(value) > limit:
        shown = (
            repr(value)
            if not isinstance(value, str) or len(value) <= 80
            else (f"{value[:40]!r}... ({len(value)} characters)")
        )
        raise InvalidOption(
            f"{option}={shown} must be a non-empty string of at most {limit} characters"
        )
    if not value.isprintable():
        raise InvalidOption(
            f"{option}={value!r} must be printable: no newline, tab or other control "
            "character (it is written into logs and history)"
        )
    return value


def check_keywords(caller: str, options: Mapping[str, object], known: Collection[str]) -> None:
    """Raise the TypeError a call to ``caller`` with a misspelt keyword argument raises, naming
    the first of ``options`` that is not ``known`` (for ``**options: Unpack[SomeKwargs]``)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
