"""Schema version 7: the skip cause's column, an additive migration. A file of version 6 keeps
its records (a skip stored without a cause reads it from its words), a new skip keeps the cause
it was stored with, and the version an older anarchon checks stays 6, so it still opens the
file and writes the columns it knows."""

from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Final

from anarchon import RunStatus, SkipCause, SQLiteBackend
from anarchon.backend import TOO_LATE
from anarchon.backends.sqlite._queries import STEPS, Q
from anarchon.kit.migrations import migrate
from tests.records import claim_request

SLOT: Final = 1_800_000_000_000
MINUTE: Final = 60_000
# What an anarchon of schema version 6 checks on start (kit.migrations.migrate without the
# additions table) and the columns it writes.
VERSION_6: Final[dict[str, Any]] = {
    "create_table": Q["create_schema_table"],
    "read_version": Q["schema_version"],
    "write_version": Q["set_schema_version"],
    "where": "version 6",
}
OLD_INSERT: Final = (
    "INSERT INTO anarchon_runs (job, slot_key, attempt, slot, run_id, token, instance, trigger,"
    " status, fence, started_at, finished_at, reason) VALUES"
    " ('job', ?, 1, ?, ?, 't', 'i0', 'schedule', ?, 0, ?, ?, ?)"
)
TOO_LATE_WORDS: Final = f"{TOO_LATE}i0 reached the slot 70000 ms after it (max_late_ms=60000)"


def _old_record(conn: sqlite3.Connection, slot: int, status: str, reason: str | None) -> None:
    conn.execute(OLD_INSERT, (str(slot), slot, f"r{slot}", status, slot, slot + 5, reason))


async def test_a_version_6_file_gains_the_column_and_older_anarchons_still_use_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as conn:
        assert len(migrate(conn, STEPS[:6], **VERSION_6)) == 6
        _old_record(conn, SLOT, "succeeded", None)
        _old_record(conn, SLOT + MINUTE, "skipped", TOO_LATE_WORDS)
        _old_record(conn, SLOT + 2 * MINUTE, "skipped", "worded by hand")
        conn.commit()
    backend = SQLiteBackend(path)
    await backend.start()
    try:
        skip = dataclasses.replace(
            claim_request("job", SLOT + 3 * MINUTE, "i1"),
            skip_reason="worded too",
            skip_cause=SkipCause.BEHIND,
        )
        [answer] = await backend.claim([skip])
        assert answer.run.skip_cause is SkipCause.BEHIND
        with closing(sqlite3.connect(path)) as conn:
            # An anarchon of version 6 starting now: nothing to migrate, nothing refused; it
            # records a skip with the columns it knows (no cause: its words say it).
            assert migrate(conn, STEPS[:6], **VERSION_6) == []
            _old_record(conn, SLOT + 4 * MINUTE, "skipped", TOO_LATE_WORDS)
            conn.commit()
        history = {r.slot_ms: (r.status, r.skip_cause) for r in await backend.history("job")}
        found = await backend.slot_records("job", SLOT + 3 * MINUTE)
    finally:
        await backend.stop()
    assert history == {
        SLOT: (RunStatus.SUCCEEDED, None),
        SLOT + MINUTE: (RunStatus.SKIPPED, SkipCause.TOO_LATE),
        SLOT + 2 * MINUTE: (RunStatus.SKIPPED, None),
        SLOT + 3 * MINUTE: (RunStatus.SKIPPED, SkipCause.BEHIND),
        SLOT + 4 * MINUTE: (RunStatus.SKIPPED, SkipCause.TOO_LATE),
    }
    assert found is not None and [r.skip_cause for r in found.runs] == [SkipCause.BEHIND]
    with closing(sqlite3.connect(path)) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM anarchon_schema ORDER BY 1")]
        added = [v for (v,) in conn.execute("SELECT version FROM anarchon_schema_additions")]
        stored = dict(conn.execute("SELECT slot, skip_cause FROM anarchon_runs"))
    assert (versions, added) == ([1, 2, 3, 4, 5, 6], [7])
    assert stored == {
        SLOT: None,
        SLOT + MINUTE: None,
        SLOT + 2 * MINUTE: None,
        SLOT + 3 * MINUTE: "behind",
        SLOT + 4 * MINUTE: None,
    }
    again = SQLiteBackend(path)
    await again.start()  # nothing left to migrate
    await again.stop()
