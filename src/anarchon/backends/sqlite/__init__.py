"""SQLite: the embedded default, for several processes on one host sharing one file.

The file is opened in WAL mode with a busy timeout; every decision is one short
``BEGIN IMMEDIATE`` transaction, so exactly one process wins each slot. SQLite cannot notify
other processes, so each release and result is also written to an events table that every
process polls once every 200 ms (``EVENTS_POLL_MS``; one small read, however many runs it
watches) to wake its backups; the same poll reads the claims won since (claim notices), every
50 ms while a backup waits its rank delay.

The backend's clock (lease expiry, fences, the times in history, :meth:`server_time_ms`) is the
host's wall clock *anchored* once per boot: ``anchor_wall + (boot clock now - anchor_boot)``,
the anchor stored in the file and keyed by ``/proc/sys/kernel/random/boot_id``. The boot clock
(``CLOCK_BOOTTIME``) is one clock for every process of the host; it counts suspended time and
never steps, so an NTP step or a VM resume cannot expire every lease at once. The backend clock
then follows the wall clock by slewing, at most :data:`SLEW_MS` per :data:`SLEW_EVERY_MS`
(1 %), and takes a difference of more than :data:`STEP_OVER_MS` at once (a clock that was wrong
at boot). Without a boot id (not Linux) it is the wall clock.

Where things are: the contract's methods in ``_backend.py`` (the claim path is
:meth:`SQLiteBackend.claim` there, deciding with :func:`anarchon.kit.lease.claim`); the
connection, its thread and transactions in ``_connection.py``; the anchored clock in
``_clock.py``; the rows the lease rules read and write in ``_rows.py``; pauses and run requests
(:meth:`SQLiteBackend.control`) in ``_control.py``; error translation in
``_errors.py``; options and URLs in ``_options.py``; every SQL statement in ``queries.sql``.
"""

from __future__ import annotations

from ._backend import SQLiteBackend

__all__ = ["SQLiteBackend"]
