"""The SQLite backend's one translation of sqlite3's errors, and its transient test."""

from __future__ import annotations

import sqlite3
from typing import Final

from ...errors import BackendError, BackendUnavailable

__all__ = ["DATA_ERRORS", "is_busy", "is_transient", "translate"]

# What a value the file cannot hold raises while it is bound or computed: decided per item.
DATA_ERRORS: Final = (
    OverflowError,
    ValueError,
    sqlite3.DataError,
    sqlite3.InterfaceError,
    sqlite3.IntegrityError,
)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth another try: "database is locked" past the busy timeout, I/O
    errors (sqlite3's OperationalError), and what they were translated to."""
    return isinstance(exc, sqlite3.OperationalError | BackendUnavailable)


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """True if SQLite answered "database is locked" or "busy" (another process holds the lock)."""
    return "locked" in str(exc) or "busy" in str(exc)


def translate(exc: BaseException, where: str) -> BackendError | None:
    """The anarchon error for a sqlite3 error (None: not sqlite3's). ``where`` names the file."""
    if isinstance(exc, sqlite3.OperationalError):
        return BackendUnavailable(f"SQLite {where}: {exc}")
    if isinstance(exc, sqlite3.DatabaseError):
        return BackendError(f"SQLite {where}: {exc}")
    return None
