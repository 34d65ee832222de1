"""SQLite: the embedded default, for several processes on one host sharing one file.

The file is opened in WAL mode with a busy timeout; every decision is one short
``BEGIN IMMEDIATE`` transaction, so exactly one process wins each slot. SQLite cannot notify
other processes, so each release and result is also written to an events table that every
process polls once every 200 ms (``EVENTS_POLL_MS``; one small read, however many runs it
watches) to wake its backups; the same poll reads the claims won since (claim notices), every
50 ms while a backup waits its rank delay.

The backend's clock (lease expiry, fences, the times in history, :meth:`server_time_ms`) is the
host's wall clock, the one clock every process of the host shares, so the processes' offset from
it is 0 and slots are decided on the same time they fire by. Its steps (NTP, a VM resume) are
found against an anchor stored in the file and keyed by ``/proc/sys/kernel/random/boot_id``:
``anchor_wall + (boot clock now - anchor_boot)``, the boot clock (``CLOCK_BOOTTIME``) one clock
for every process of the host that never steps and counts suspended time. The first write
transaction that finds the wall clock more than :data:`~._clock.STEP_FROM_MS` from it takes the
step for every process: in that transaction every stored time that measures a duration moves
by the step (running attempts' lease expiry, the registry's heartbeats, run requests' due
times, the events' times), so no lease expires or stretches because of it; history times,
slots and pauses are instants and stay. A read that depends on the step
(:meth:`server_time_ms`, a takeover's peek, the registry's records) takes it first. Without a
boot id (not Linux) steps are not found and leases move with the wall clock.

Where things are: the contract's methods in ``_backend.py`` (the claim path is
:meth:`SQLiteBackend.claim` there, deciding with :func:`anarchon.kit.lease.claim`); the
connection, its thread and transactions in ``_connection.py``; the clock and its steps in
``_clock.py``; the rows the lease rules read and write in ``_rows.py``; pauses and run requests
(:meth:`SQLiteBackend.control`) in ``_control.py``; error translation in
``_errors.py``; options and URLs in ``_options.py``; every SQL statement in ``queries.sql``.
"""

from __future__ import annotations

from ._backend import SQLiteBackend
from ._control import SQLiteControl
from ._registry import SQLiteRegistry

__all__ = ["SQLiteBackend", "SQLiteControl", "SQLiteRegistry"]
