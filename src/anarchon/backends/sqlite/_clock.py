"""The SQLite backend's clock: the host's wall clock, with a step detector (see the package
docstring). Inside the write transaction that first sees a step, every stored deadline whose
meaning is a duration moves by the step, so no lease expires or stretches because of it."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Final

from ...kit import Action, log_fields
from ._queries import Q

__all__ = ["STEP_FROM_MS", "AnchoredClock"]

logger = logging.getLogger("anarchon.backends.sqlite")

# A difference between the wall clock and the anchor (wall + boot clock since) over STEP_FROM_MS
# is a step: taken at once, stored deadlines shifted by it. A smaller one is taken without
# shifting (it moves a deadline by less than that) once it reaches REANCHOR_MS.
STEP_FROM_MS: Final = 100
REANCHOR_MS: Final = 5
# The wall and boot clocks are read together: between two readings of the boot clock at most
# PAIR_SPREAD_MS apart (a thread preempted between them would fake a step), PAIR_TRIES times.
PAIR_SPREAD_MS: Final = 2
PAIR_TRIES: Final = 5
BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")
REGISTRY: Final = "anarchon_registry"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _boot_ms() -> int | None:
    """The host's boot clock (CLOCK_BOOTTIME: never steps, counts suspend), or None."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return time.clock_gettime_ns(clock) // 1_000_000


def _pair() -> tuple[int, int] | None:
    """(wall clock, boot clock) read together, or None without a boot clock."""
    best: tuple[int, int, int] | None = None
    for _ in range(PAIR_TRIES):
        before = _boot_ms()
        wall = _wall_ms()
        after = _boot_ms()
        if before is None or after is None:
            return None
        if best is None or after - before < best[0]:
            best = (after - before, wall, (before + after) // 2)
        if after - before <= PAIR_SPREAD_MS:
            break
    assert best is not None
    return best[1], best[2]


def _boot_id() -> str | None:
    """This boot of the host, or None where the kernel does not tell (not Linux)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def shift_deadlines(conn: sqlite3.Connection, delta_ms: int) -> None:
    """Move every stored time that measures a duration by ``delta_ms``, the wall clock's step:
    the expiry of running attempts' leases, the events' times (kept for a while), the registry's
    heartbeats and definitions' saved times, the start of instances when the clock went back
    (so they are seen live through the time lived again), and when run requests are due (a
    retry's backoff, a trigger's now). Never the history's times, slots or pauses: instants on
    the wall clock (a pause's ``until`` is a time someone gave)."""
    params = {"d": delta_ms}
    conn.execute(Q["shift_leases"], params)
    conn.execute(Q["shift_requests"], params)
    conn.execute(Q["shift_events"], params)
    tables = {row[0] for row in conn.execute(Q["registry_tables"])}
    if REGISTRY in tables:
        conn.execute(Q["shift_heartbeats"], params)
    if "anarchon_definitions" in tables:
        conn.execute(Q["shift_definitions"], params)


class AnchoredClock:
    """The backend clock of one process: the wall clock, checked against the anchor of this
    boot (kept in the file) in every write transaction, where a step is taken for every
    process at once."""

    def __init__(self) -> None:
        self.boot = _boot_id() if _boot_ms() is not None else None
        #: Test-only: added to the clock, so tests can move the backend's time (never set in
        #: production; see tests/conformance/test_differential.py).
        self.offset_ms = 0

    def now(self) -> int:
        """The clock now: the wall clock (stored deadlines follow it; see :meth:`tick`)."""
        return _wall_ms() + self.offset_ms

    def pending(self, conn: sqlite3.Connection) -> bool:
        """Whether the wall clock stepped since the last write transaction took a step (a
        read: the caller then writes, whose :meth:`tick` takes it)."""
        pair = _pair()
        if self.boot is None or pair is None:
            return False
        found = conn.execute(Q["clock_anchor"]).fetchone()
        if found is None or found[0] != self.boot:
            return False
        wall, boot = pair
        return abs(wall - (int(found[1]) + boot - int(found[2]))) > STEP_FROM_MS

    def tick(self, conn: sqlite3.Connection) -> int:
        """The clock now, read inside a write transaction: anchors it for a new boot, and takes
        a step of the wall clock, shifting the stored deadlines by it (see the package
        docstring)."""
        pair = _pair()
        if self.boot is None or pair is None:
            return _wall_ms() + self.offset_ms
        wall, boot = pair
        found = conn.execute(Q["clock_anchor"]).fetchone()
        if found is None or found[0] != self.boot:
            moved = True
        else:
            step = wall - (int(found[1]) + boot - int(found[2]))
            moved = abs(step) >= REANCHOR_MS
            if abs(step) > STEP_FROM_MS:
                logger.warning(
                    "the host clock stepped %+d ms; the SQLite backend takes the step and moves "
                    "every live lease by it",
                    step,
                    extra=log_fields(Action.CLOCK_STEPPED, step_ms=step),
                )
                shift_deadlines(conn, step)
        if moved:
            conn.execute(
                Q["set_clock_anchor"], {"boot_id": self.boot, "wall_ms": wall, "boot_ms": boot}
            )
        return wall + self.offset_ms
