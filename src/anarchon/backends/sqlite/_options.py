"""The SQLite backend's options: the file, the limits, and :func:`from_url`'s reading of a URL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ...errors import InvalidOption
from ...kit import HISTORY_SIZE, Bound, check_int
from ...kit.urls import int_option, ms_option, redact_url, split_url

__all__ = [
    "BUSY_TIMEOUT",
    "BUSY_WAIT_FIRST_S",
    "BUSY_WAIT_MAX_S",
    "CLAIMED_POLL_MS",
    "DEFAULT_PATH",
    "ENV_PATH",
    "EVENTS_KEEP_MS",
    "EVENTS_POLL_MS",
    "EVENTS_PRUNE_EVERY_MS",
    "Options",
    "lock_waits",
    "parse_url",
]

ENV_PATH: Final = "ANARCHON_DB"
DEFAULT_PATH: Final = "anarchon.db"
BUSY_TIMEOUT: Final = Bound(0, 3_600_000, ms=True)
# A write transaction that finds another process's under way tries again after these waits
# (doubling; see lock_waits): a claim's transaction holds the lock for about a millisecond, and
# SQLite's own busy handler would sleep 1, 2, 5, 10 ... ms (see Connection._begin). Shorter
# steps (0.1 ms, then at most 0.25 ms for 20 ms) were tried: a waiter took the freed lock
# sooner (0.15-0.3 ms after it was freed against 0.6 ms, median), but three instances claiming
# at one instant did not start their slots sooner (bench fire, SQLite, three alternated rounds,
# load 2-5; the likely cause, not measured: on two cores the waiters' extra tries take CPU from
# the lock's holder).
BUSY_WAIT_FIRST_S: Final = 0.000_25
BUSY_WAIT_MAX_S: Final = 0.002
# How often each process reads the events table; a hand-over is noticed within this.
EVENTS_POLL_MS: Final = 200
# Events are kept this long: far longer than a poll interval, so none is missed; the table is
# trimmed at most this often.
EVENTS_KEEP_MS: Final = 60_000
EVENTS_PRUNE_EVERY_MS: Final = 10_000
# How often a process reads the claim notices (the won first attempts in anarchon_runs) while
# it waits on one (SQLiteBackend.expect_claims: a backup's rank delay): a notice must beat the
# next rank's delay, so this is far shorter than EVENTS_POLL_MS. Outside those windows the
# notices are read with the events: 20 reads a second cost an idle process ~1 % of a core.
CLAIMED_POLL_MS: Final = 50
_OWNER: Final = "SQLiteBackend"


def lock_waits() -> Iterator[float]:
    """The waits (seconds) between tries of a ``BEGIN IMMEDIATE`` that finds the write lock
    taken: :data:`BUSY_WAIT_FIRST_S` doubling to :data:`BUSY_WAIT_MAX_S`. The caller stops at
    its busy timeout."""
    delay = BUSY_WAIT_FIRST_S
    while True:
        yield delay
        delay = min(2 * delay, BUSY_WAIT_MAX_S)


@dataclass(frozen=True, slots=True)
class Options:
    """The checked options of one SQLite backend."""

    path: Path
    """Absolute: the working directory may change before start(), and every message must say
    which file this is (two folders would otherwise mean two files)."""
    default_path: bool
    """True when neither a path nor ``$ANARCHON_DB`` was given (the start log says so)."""
    history_size: int
    busy_timeout_ms: int

    @classmethod
    def check(
        cls, path: str | os.PathLike[str] | None, history_size: object, busy_timeout_ms: object
    ) -> Options:
        """Check the constructor's arguments; raise InvalidOption naming the value and rule."""
        size = check_int("history_size", history_size, HISTORY_SIZE, _OWNER)
        busy = check_int("busy_timeout_ms", busy_timeout_ms, BUSY_TIMEOUT, _OWNER)
        env = os.environ.get(ENV_PATH)
        chosen = path if path is not None else env or DEFAULT_PATH
        return cls(
            path=Path(os.path.abspath(chosen)),
            default_path=path is None and not env,
            history_size=size,
            busy_timeout_ms=busy,
        )


URL_OPTIONS: Final = {
    "history_size": int_option(HISTORY_SIZE),
    "busy_timeout_ms": ms_option(BUSY_TIMEOUT),
}


def parse_url(url: str) -> tuple[str, dict[str, int]]:
    """The file and the options of ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db``
    (as SQLAlchemy spells them), with ``?history_size=`` and ``?busy_timeout_ms=``."""
    split = split_url(url, URL_OPTIONS, backend="SQLite")
    path = split.url[len("sqlite:///") :] if split.url.lower().startswith("sqlite:///") else ""
    if not path:
        raise InvalidOption(
            f"backend URL {redact_url(url)!r} names no file; write sqlite:///relative.db or "
            "sqlite:////absolute/path.db"
        )
    return path, split.options
