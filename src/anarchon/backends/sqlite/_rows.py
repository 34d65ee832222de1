"""The lease rules' :class:`~anarchon.kit.lease.RowStore` over one open SQLite transaction."""

from __future__ import annotations

import sqlite3
from dataclasses import fields
from typing import Any, Final

from ...control import ALL_JOBS, Pause, RunRequest
from ...kit import Run
from ...kit.lease import PRUNE_BATCH, RunRow
from ._queries import Q

__all__ = ["SQLiteRows", "newest_runs", "pause_of", "request_of", "row_of"]

# The columns of anarchon_pauses and anarchon_requests, in the order the queries select them.
_PAUSE_FIELDS: Final = tuple(f.name for f in fields(Pause))
_REQUEST_FIELDS: Final = tuple(f.name for f in fields(RunRequest))
# A transaction reads every pause once when there are at most this many (usually there is
# none), instead of one lookup per claim of a batch.
PAUSES_READ_AT_ONCE: Final = 64


class SQLiteRows:
    """The :class:`~anarchon.kit.lease.RowStore` over one open transaction."""

    def __init__(self, conn: sqlite3.Connection, history_size: int) -> None:
        self.conn = conn
        self.history_size = history_size
        self._pauses: list[Pause] | None = None
        self._many_pauses = False

    def current(self, job: str, slot_key: str) -> RunRow | None:
        """See :meth:`~anarchon.kit.lease.RowStore.current`."""
        return row_of(self.conn.execute(Q["current"], (job, slot_key)).fetchone())

    def live_holder(self, job: str, now: int) -> RunRow | None:
        """See :meth:`~anarchon.kit.lease.RowStore.live_holder`."""
        return row_of(self.conn.execute(Q["live_holder"], (job, now)).fetchone())

    def insert(self, row: RunRow) -> None:
        """See :meth:`~anarchon.kit.lease.RowStore.insert`."""
        self.conn.execute(Q["insert"], _params(row))

    def update(self, row: RunRow) -> None:
        """See :meth:`~anarchon.kit.lease.RowStore.update`."""
        self.conn.execute(Q["update"], _params(row))

    def next_fence(self, job: str, now: int) -> int:
        """See :meth:`~anarchon.kit.lease.RowStore.next_fence`."""
        return int(self.conn.execute(Q["next_fence"], {"job": job, "now": now}).fetchone()[0])

    def pruned_through(self, job: str) -> int | None:
        """See :meth:`~anarchon.kit.lease.RowStore.pruned_through`."""
        found = self.conn.execute(Q["pruned_through"], (job,)).fetchone()
        return None if found is None or found[0] is None else int(found[0])

    def pauses(self, job: str) -> list[Pause]:
        """See :meth:`~anarchon.kit.lease.RowStore.pauses`, in the claim's own transaction: all
        of them read once per transaction when there are at most :data:`PAUSES_READ_AT_ONCE`
        (nothing writes pauses inside a claim's transaction), else one lookup by primary key
        per claim."""
        if self._pauses is None and not self._many_pauses:
            found = self.conn.execute(Q["some_pauses"], (PAUSES_READ_AT_ONCE + 1,)).fetchall()
            if len(found) <= PAUSES_READ_AT_ONCE:
                self._pauses = [pause_of(values) for values in found]
            else:
                self._many_pauses = True
        if self._pauses is not None:
            return [p for p in self._pauses if p.job in (job, ALL_JOBS)]
        return [pause_of(values) for values in self.conn.execute(Q["job_pauses"], (job,))]

    def add_request(self, request: RunRequest) -> None:
        """See :meth:`~anarchon.kit.lease.RowStore.add_request`: the control store's own
        statement, in this transaction."""
        self.conn.execute(Q["add_request"], request.to_dict()).fetchall()

    def prune(self, job: str, keep_key: str, cutoff: int | None) -> None:
        """See :meth:`~anarchon.kit.lease.RowStore.prune`."""
        conn = self.conn
        bound = self.history_size + PRUNE_BATCH
        total = int(conn.execute(Q["slot_count"], (job, bound)).fetchone()[0])
        victims: list[str] = []
        if cutoff is not None:
            aged = {"job": job, "keep_key": keep_key, "cutoff": cutoff, "limit": PRUNE_BATCH}
            victims += [key for (key,) in conn.execute(Q["prune_aged"], aged)]
        slots = [s for key in victims for (s,) in conn.execute(Q["drop_slot"], (job, key))]
        room = min(PRUNE_BATCH, total - self.history_size) - len(victims)
        if room > 0:
            oldest = {"job": job, "keep_key": keep_key, "limit": room}
            for (key,) in conn.execute(Q["prune_oldest"], oldest).fetchall():
                slots += [s for (s,) in conn.execute(Q["drop_slot"], (job, key))]
        slots = [s for s in slots if s is not None]
        if slots:
            conn.execute(Q["raise_pruned_through"], {"job": job, "slot": max(slots)})

    def add_event(self, job: str, slot_key: str, released: bool, now: int) -> None:
        """Record a release or a result for the other processes' pollers."""
        self.conn.execute(Q["add_event"], (job, slot_key, int(released), now))


# The columns the row queries answer, in this order: the lease rules' RunRow, field by field.
# A skip record stored without a cause (NULL: before schema 7, or by an older anarchon) reads
# the one its reason's words say (kit.lease.skip_cause_of, the compatibility path).
_COLUMNS: Final = tuple(field.name for field in fields(RunRow))


def pause_of(values: tuple[Any, ...]) -> Pause:
    """The pause a row of ``anarchon_pauses`` holds (job, paused_by, at_ms, until_ms: the
    fields of :class:`~anarchon.control.Pause` in order)."""
    return Pause.from_dict(dict(zip(_PAUSE_FIELDS, values, strict=True)))


def request_of(values: tuple[Any, ...]) -> RunRequest:
    """The request a row of ``anarchon_requests`` holds (the fields of
    :class:`~anarchon.control.RunRequest` in order)."""
    return RunRequest.from_dict(dict(zip(_REQUEST_FIELDS, values, strict=True)))


def newest_runs(conn: sqlite3.Connection, job: str, limit: int) -> list[Run]:
    """Up to ``limit`` runs of ``job``, newest first (the ``history`` statement)."""
    rows = conn.execute(Q["history"], (job, limit)).fetchall()
    return [r.to_run() for r in map(row_of, rows) if r is not None]


def row_of(values: tuple[Any, ...] | None) -> RunRow | None:
    """The row a query answered (columns in :data:`_COLUMNS` order), or None.

    Unpacked by name rather than through a dict of the columns (a few microseconds less per
    row; every claim and result reads one or two): the names must stay in :data:`_COLUMNS`
    order, which tests/sqlite/test_sqlite.py checks."""
    if values is None:
        return None
    (job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
     finished_at, lease_expires_at, released, error, reason, requested_by,
     skip_cause) = values  # fmt: skip
    return RunRow(
        job=job,
        slot_key=slot_key,
        slot=slot,
        attempt=attempt,
        run_id=run_id,
        token=token,
        instance=instance,
        trigger=trigger,
        status=status,
        fence=fence,
        started_at=started_at,
        finished_at=finished_at,
        lease_expires_at=lease_expires_at,
        released=bool(released),
        error=error,
        reason=reason,
        requested_by=requested_by,
        skip_cause=skip_cause,
    )


def _params(row: RunRow) -> dict[str, Any]:
    """The named parameters of the insert and update queries: every column of ``row``."""
    return {
        "job": row.job,
        "slot_key": row.slot_key,
        "slot": row.slot,
        "attempt": row.attempt,
        "run_id": row.run_id,
        "token": row.token,
        "instance": row.instance,
        "trigger": str(row.trigger),
        "status": str(row.status),
        "fence": row.fence,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "lease_expires_at": row.lease_expires_at,
        "released": int(row.released),
        "error": row.error,
        "reason": row.reason,
        "requested_by": row.requested_by,
        # Its text: a SkipCause as the lease rules decided it, or as read back.
        "skip_cause": None if row.skip_cause is None else str(row.skip_cause),
    }
