"""The SQLite backend's clock: the host's wall clock anchored once per boot (see the package
docstring), read and moved inside every write transaction so every process decides with it."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Final

from ._queries import Q

__all__ = ["AnchoredClock"]

logger = logging.getLogger("anarchon.backends.sqlite")

# The backend clock follows the wall clock by at most SLEW_MS per SLEW_EVERY_MS (1 %): a lease
# of 15 s stretches or shrinks by at most 0.15 s while it catches up after a step. Differences
# under SLEW_FROM_MS are left alone; over STEP_OVER_MS they are taken at once.
SLEW_MS: Final = 10
SLEW_EVERY_MS: Final = 1_000
SLEW_FROM_MS: Final = 100
STEP_OVER_MS: Final = 3_600_000
BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _boot_ms() -> int | None:
    """The host's boot clock (CLOCK_BOOTTIME: never steps, counts suspend), or None."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return time.clock_gettime_ns(clock) // 1_000_000


def _boot_id() -> str | None:
    """This boot of the host, or None where the kernel does not tell (not Linux)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


class AnchoredClock:
    """The backend clock of one process: the shared anchor of this boot, kept in the file.

    :meth:`tick` runs inside every write transaction and reads (and if needed moves) the anchor
    there, so every process decides with the same clock; :meth:`now` between transactions uses
    the anchor last read.
    """

    def __init__(self) -> None:
        self.boot = _boot_id() if _boot_ms() is not None else None
        self.anchor: tuple[int, int] | None = None
        #: Test-only: added to the clock, so tests can move the backend's time (never set in
        #: production; see tests/conformance/test_differential.py).
        self.offset_ms = 0

    def now(self) -> int:
        """The clock now, from the anchor last read."""
        boot = _boot_ms()
        if self.anchor is None or boot is None:
            return _wall_ms() + self.offset_ms
        wall, at = self.anchor
        return wall + (boot - at) + self.offset_ms

    def tick(self, conn: sqlite3.Connection) -> int:
        """The clock now, read inside a write transaction; anchors it for a new boot and slews
        it toward the wall clock (see the package docstring)."""
        boot = _boot_ms()
        if self.boot is None or boot is None:
            return _wall_ms() + self.offset_ms
        wall = _wall_ms()
        found = conn.execute(Q["clock_anchor"]).fetchone()
        if found is None or found[0] != self.boot:
            anchor = (wall, boot)
        else:
            anchor = (int(found[1]), int(found[2]))
            now = anchor[0] + boot - anchor[1]
            drift = wall - now
            if abs(drift) > STEP_OVER_MS:
                logger.warning(
                    "the host clock is %d ms from the SQLite backend's clock; taking it at once",
                    drift,
                    extra={"action": "clock_stepped"},
                )
                anchor = (wall, boot)
            elif abs(drift) > SLEW_FROM_MS and boot - anchor[1] >= SLEW_EVERY_MS:
                anchor = (now + max(-SLEW_MS, min(SLEW_MS, drift)), boot)
        if found is None or (found[0], found[1], found[2]) != (self.boot, *anchor):
            conn.execute(
                Q["set_clock_anchor"],
                {"boot_id": self.boot, "wall_ms": anchor[0], "boot_ms": anchor[1]},
            )
        self.anchor = anchor
        return anchor[0] + boot - anchor[1] + self.offset_ms
