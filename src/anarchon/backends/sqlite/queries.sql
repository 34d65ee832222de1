-- Every statement the SQLite backend runs. Times are epoch milliseconds of the host clock.

-- name: migration_1
CREATE TABLE IF NOT EXISTS anarchon_jobs (
    job TEXT PRIMARY KEY,
    fence INTEGER NOT NULL DEFAULT 0,
    pruned_through INTEGER
);
CREATE TABLE IF NOT EXISTS anarchon_runs (
    job TEXT NOT NULL,
    slot_key TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    slot INTEGER,
    run_id TEXT NOT NULL,
    token TEXT NOT NULL,
    instance TEXT NOT NULL,
    trigger TEXT NOT NULL,
    status TEXT NOT NULL,
    fence INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    lease_expires_at INTEGER,
    released INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    reason TEXT,
    PRIMARY KEY (job, slot_key, attempt)
);
CREATE INDEX IF NOT EXISTS anarchon_runs_newest ON anarchon_runs (job, started_at DESC, attempt DESC);
CREATE INDEX IF NOT EXISTS anarchon_runs_running ON anarchon_runs (job) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS anarchon_runs_slot ON anarchon_runs (job, slot) WHERE slot IS NOT NULL;

-- name: migration_2
-- Releases and results, polled by other processes to wake their backups (SQLite cannot notify).
CREATE TABLE IF NOT EXISTS anarchon_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    slot_key TEXT NOT NULL,
    released INTEGER NOT NULL,
    at INTEGER NOT NULL
);

-- name: migration_3
-- History is newest first by start and, among runs that started in the same millisecond, by
-- the order they were recorded in: the rowid, which the index carries as its last column.
DROP INDEX IF EXISTS anarchon_runs_newest;
CREATE INDEX IF NOT EXISTS anarchon_runs_by_start ON anarchon_runs (job, started_at);

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS anarchon_schema (version INTEGER NOT NULL);

-- name: schema_version
SELECT max(version) FROM anarchon_schema;

-- name: set_schema_version
INSERT INTO anarchon_schema (version) VALUES (?);

-- name: current
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason
FROM anarchon_runs WHERE job = ? AND slot_key = ? ORDER BY attempt DESC LIMIT 1;

-- name: live_holder
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason
FROM anarchon_runs
WHERE job = ? AND status = 'running' AND released = 0 AND lease_expires_at > ?
LIMIT 1;

-- name: insert
INSERT INTO anarchon_runs (job, slot_key, slot, attempt, run_id, token, instance, trigger, status,
                           fence, started_at, finished_at, lease_expires_at, released, error,
                           reason)
VALUES (:job, :slot_key, :slot, :attempt, :run_id, :token, :instance, :trigger, :status, :fence,
        :started_at, :finished_at, :lease_expires_at, :released, :error, :reason);

-- name: update
UPDATE anarchon_runs
SET status = :status, finished_at = :finished_at, lease_expires_at = :lease_expires_at,
    released = :released, error = :error, reason = :reason
WHERE job = :job AND slot_key = :slot_key AND attempt = :attempt;

-- name: next_fence
INSERT INTO anarchon_jobs (job, fence) VALUES (?, 1)
ON CONFLICT (job) DO UPDATE SET fence = fence + 1
RETURNING fence;

-- name: pruned_through
SELECT pruned_through FROM anarchon_jobs WHERE job = ?;

-- name: history
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason
FROM anarchon_runs WHERE job = ? ORDER BY started_at DESC, rowid DESC LIMIT ?;

-- name: last_slot
SELECT max(slot) FROM anarchon_runs WHERE job = ? AND slot IS NOT NULL;

-- name: last_slots
SELECT job, max(slot) FROM anarchon_runs
WHERE job IN (?jobs) AND slot IS NOT NULL
GROUP BY job;

-- name: add_event
INSERT INTO anarchon_events (job, slot_key, released, at) VALUES (?, ?, ?, ?);

-- name: last_event
SELECT coalesce(max(seq), 0) FROM anarchon_events;

-- name: events_since
SELECT seq, job, slot_key, released FROM anarchon_events WHERE seq > ? ORDER BY seq LIMIT 5000;

-- name: prune_events
DELETE FROM anarchon_events WHERE at < ?;

-- name: prune_by_age
DELETE FROM anarchon_runs
WHERE job = ? AND started_at < ? AND status != 'running'
RETURNING slot;

-- name: prune_by_count
DELETE FROM anarchon_runs
WHERE rowid IN (
    SELECT rowid FROM anarchon_runs WHERE job = ?
    ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?
) AND status != 'running'
RETURNING slot;

-- name: raise_pruned_through
INSERT INTO anarchon_jobs (job, fence, pruned_through) VALUES (:job, 0, :slot)
ON CONFLICT (job) DO UPDATE
SET pruned_through = max(coalesce(pruned_through, :slot), :slot);
