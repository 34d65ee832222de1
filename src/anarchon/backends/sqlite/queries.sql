-- Every statement the SQLite backend runs. Times are epoch milliseconds of the backend's clock:
-- the host's wall clock, whose steps are found against the anchor of this boot (anarchon_clock)
-- and taken with every stored deadline moved by the step (see the package docstring).

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

-- name: migration_4
-- The anchor of the backend's clock for the host's current boot: clock = wall_ms + (the boot
-- clock now - boot_ms). One row, rewritten when the host has booted again.
CREATE TABLE IF NOT EXISTS anarchon_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot_id TEXT NOT NULL,
    wall_ms INTEGER NOT NULL,
    boot_ms INTEGER NOT NULL
);

-- name: migration_5
-- Steering (anarchon.control): who asked for each attempt (a manual run, a retry), the pauses
-- (one per job name, or '*' for every job, read by the claim in its own transaction) and
-- the run requests (manual triggers and retries, listed by job and due time).
ALTER TABLE anarchon_runs ADD COLUMN requested_by TEXT;
CREATE TABLE IF NOT EXISTS anarchon_pauses (
    job TEXT PRIMARY KEY,
    paused_by TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    until_ms INTEGER
);
CREATE TABLE IF NOT EXISTS anarchon_requests (
    id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    trigger TEXT NOT NULL,
    slot_key TEXT NOT NULL,
    slot INTEGER,
    due_ms INTEGER NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at_ms INTEGER NOT NULL,
    retry INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS anarchon_requests_due ON anarchon_requests (job, due_ms);

-- name: migration_6
-- Claim notices (Backend.subscribe_claims): each won claim, written in the same transaction as
-- the claim and polled by the other processes while they wait their rank delay.
CREATE TABLE IF NOT EXISTS anarchon_claimed (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    slot_key TEXT NOT NULL,
    instance TEXT NOT NULL,
    lease_expires_at INTEGER,
    at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS anarchon_claimed_at ON anarchon_claimed (at);

-- name: migration_7
-- The typed skip cause (anarchon.SkipCause) of each record made instead of a run: NULL for a
-- run, and for skip records written before (or by an older anarchon), which are read by their
-- reason's words (anarchon.backend.legacy_skip_cause). Additive (recorded in
-- anarchon_schema_additions): older anarchons name their columns and ignore this one.
ALTER TABLE anarchon_runs ADD COLUMN skip_cause TEXT;

-- name: clock_anchor
SELECT boot_id, wall_ms, boot_ms FROM anarchon_clock WHERE id = 1;

-- name: set_clock_anchor
INSERT INTO anarchon_clock (id, boot_id, wall_ms, boot_ms) VALUES (1, :boot_id, :wall_ms, :boot_ms)
ON CONFLICT (id) DO UPDATE
SET boot_id = excluded.boot_id, wall_ms = excluded.wall_ms, boot_ms = excluded.boot_ms;

-- A step of the host's wall clock, taken in the write transaction that sees it first
-- (_clock.shift_deadlines): every stored time that measures a duration moves by the step.

-- name: shift_leases
UPDATE anarchon_runs INDEXED BY anarchon_runs_running SET lease_expires_at = lease_expires_at + :d
WHERE status = 'running' AND lease_expires_at IS NOT NULL;

-- name: shift_requests
-- Run requests are due a delay after they were made (a retry's backoff, a trigger's now).
UPDATE anarchon_requests SET due_ms = due_ms + :d;

-- name: shift_events
UPDATE anarchon_events SET at = at + :d;

-- name: registry_tables
SELECT name FROM sqlite_master
WHERE type = 'table' AND name IN ('anarchon_registry', 'anarchon_definitions');

-- name: shift_heartbeats
-- The heartbeat moves by the step; the start only back (min): an instance is seen live
-- through the time a step back makes the clock live again, never for time jumped over.
UPDATE anarchon_registry
SET heartbeat_ms = heartbeat_ms + :d,
    record = json_set(record,
                      '$.heartbeat_ms', json_extract(record, '$.heartbeat_ms') + :d,
                      '$.started_ms', json_extract(record, '$.started_ms') + min(0, :d))
WHERE json_valid(record);

-- name: shift_definitions
UPDATE anarchon_definitions SET saved_ms = saved_ms + :d;

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS anarchon_schema (version INTEGER NOT NULL);

-- name: schema_version
SELECT max(version) FROM anarchon_schema;

-- name: set_schema_version
INSERT INTO anarchon_schema (version) VALUES (?);

-- The versions of additive migrations (kit.migrations.Additions): anarchons before schema 7
-- read anarchon_schema alone, so they still open a file that only gained additions.

-- name: create_additions_table
CREATE TABLE IF NOT EXISTS anarchon_schema_additions (version INTEGER NOT NULL);

-- name: schema_additions
SELECT max(version) FROM anarchon_schema_additions;

-- name: set_schema_addition
INSERT INTO anarchon_schema_additions (version) VALUES (?);

-- name: current
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason, requested_by, skip_cause
FROM anarchon_runs WHERE job = ? AND slot_key = ? ORDER BY attempt DESC LIMIT 1;

-- name: live_holder
-- The first recorded attempt of the job that runs under a live lease (the one an overlap
-- reason names, on every backend).
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason, requested_by, skip_cause
FROM anarchon_runs
WHERE job = ? AND status = 'running' AND released = 0 AND lease_expires_at > ?
ORDER BY rowid
LIMIT 1;

-- name: insert
INSERT INTO anarchon_runs (job, slot_key, slot, attempt, run_id, token, instance, trigger, status,
                           fence, started_at, finished_at, lease_expires_at, released, error,
                           reason, requested_by, skip_cause)
VALUES (:job, :slot_key, :slot, :attempt, :run_id, :token, :instance, :trigger, :status, :fence,
        :started_at, :finished_at, :lease_expires_at, :released, :error, :reason, :requested_by,
        :skip_cause);

-- name: update
UPDATE anarchon_runs
SET status = :status, finished_at = :finished_at, lease_expires_at = :lease_expires_at,
    released = :released, error = :error, reason = :reason
WHERE job = :job AND slot_key = :slot_key AND attempt = :attempt;

-- name: next_fence
-- Above the last fence and at least the backend's clock in ms: fences rise even in a file that
-- was recreated.
INSERT INTO anarchon_jobs (job, fence) VALUES (:job, max(1, :now))
ON CONFLICT (job) DO UPDATE SET fence = max(fence + 1, :now)
RETURNING fence;

-- name: pruned_through
SELECT pruned_through FROM anarchon_jobs WHERE job = ?;

-- name: history
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason, requested_by, skip_cause
FROM anarchon_runs WHERE job = ? ORDER BY started_at DESC, rowid DESC LIMIT ?;

-- name: open_runs
-- The attempts of some jobs still running that started since a time (LeaseBackend.open_runs),
-- through the partial index on running attempts (anarchon_runs_running).
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason, requested_by, skip_cause
FROM anarchon_runs INDEXED BY anarchon_runs_running
WHERE job IN (?jobs) AND status = 'running' AND started_at >= ?;

-- name: slot_records
-- Every attempt of a slot, its retries' too, oldest first, through the partial index on
-- (job, slot). Named: without statistics (the backend never runs ANALYZE) SQLite would rather
-- read the job's runs in anarchon_runs_by_start's order to skip the sort, every one of them
-- (260 ms for a job with 1 000 000 runs, against 0.1 ms).
SELECT job, slot_key, slot, attempt, run_id, token, instance, trigger, status, fence, started_at,
       finished_at, lease_expires_at, released, error, reason, requested_by, skip_cause
FROM anarchon_runs INDEXED BY anarchon_runs_slot
WHERE job = ? AND slot = ? ORDER BY started_at, rowid;

-- name: oldest_record
-- The earliest recorded slot or start of the job: two index lookups (the partial index on
-- (job, slot), then anarchon_runs_by_start), NULL when the job has no records.
SELECT min(coalesce(s, b), coalesce(b, s)) FROM (
    SELECT (SELECT min(slot) FROM anarchon_runs WHERE job = :job AND slot IS NOT NULL) AS s,
           (SELECT min(started_at) FROM anarchon_runs WHERE job = :job) AS b
);

-- name: last_slot
-- The newest recorded slot, or the newest pruned one if that is newer: pruning never makes a
-- job look as if it had not run.
SELECT max(s) FROM (
    SELECT max(slot) AS s FROM anarchon_runs WHERE job = :job AND slot IS NOT NULL
    UNION ALL
    SELECT pruned_through FROM anarchon_jobs WHERE job = :job
);

-- name: last_slots
SELECT job, max(s) FROM (
    SELECT job, max(slot) AS s FROM anarchon_runs
    WHERE job IN (?jobs) AND slot IS NOT NULL
    GROUP BY job
    UNION ALL
    SELECT job, pruned_through FROM anarchon_jobs WHERE job IN (?jobs)
)
GROUP BY job;

-- name: add_event
INSERT INTO anarchon_events (job, slot_key, released, at) VALUES (?, ?, ?, ?);

-- name: last_event
SELECT coalesce(max(seq), 0) FROM anarchon_events;

-- name: data_version
-- Moves when another connection (of any process) commits to the file: the poller reads the
-- events and the runs only when it or the connection's own total_changes moved.
PRAGMA data_version;

-- name: events_since
SELECT seq, job, slot_key, released FROM anarchon_events WHERE seq > ? ORDER BY seq LIMIT 5000;

-- name: prune_events
DELETE FROM anarchon_events WHERE at < ?;

-- Claim notices (Backend.subscribe_claims) are the won first attempts recorded in
-- anarchon_runs, read by rowid: a new row's rowid is above every row committed before it,
-- unless the newest rows were deleted (a pruned skipped slot, a VACUUM) and their rowids are
-- given again; the poller then misses a notice, which costs one losing claim, never a run.
-- anarchon_claimed (schema 6) is no longer written or read.

-- name: last_run_rowid
SELECT coalesce(max(rowid), 0) FROM anarchon_runs;

-- name: runs_since
-- Every row added after the last one seen, so the cursor moves past the ones that are no
-- notice (skipped slots, later attempts); the poller keeps won first attempts.
SELECT rowid, job, slot_key, instance, lease_expires_at, attempt, status FROM anarchon_runs
WHERE rowid > ? ORDER BY rowid LIMIT 5000;

-- Pruning (see anarchon.kit.lease): whole slots, never the slot being finished,
-- never one whose latest attempt runs; a slot is represented by its attempt 1.

-- name: slot_count
-- The job's slots, counted up to a bound (history_size + the prune batch: what pruning needs to
-- know), so a job with a million records is not counted in full at every result.
SELECT count(*) FROM (SELECT 1 FROM anarchon_runs WHERE job = ? AND attempt = 1 LIMIT ?);

-- name: prune_aged
-- Slots whose every attempt ended before the cutoff, oldest first.
SELECT f.slot_key FROM anarchon_runs f
WHERE f.job = :job AND f.attempt = 1 AND f.started_at < :cutoff AND f.slot_key != :keep_key
  AND NOT EXISTS (
      SELECT 1 FROM anarchon_runs y
      WHERE y.job = f.job AND y.slot_key = f.slot_key
        AND (y.status = 'running' OR y.finished_at IS NULL OR y.finished_at >= :cutoff)
  )
ORDER BY f.started_at, f.rowid
LIMIT :limit;

-- name: prune_oldest
-- The oldest ended slots.
SELECT f.slot_key FROM anarchon_runs f
WHERE f.job = :job AND f.attempt = 1 AND f.slot_key != :keep_key
  AND NOT EXISTS (
      SELECT 1 FROM anarchon_runs y
      WHERE y.job = f.job AND y.slot_key = f.slot_key AND y.status = 'running'
  )
ORDER BY f.started_at, f.rowid
LIMIT :limit;

-- name: drop_slot
DELETE FROM anarchon_runs WHERE job = ? AND slot_key = ? RETURNING slot;

-- name: raise_pruned_through
INSERT INTO anarchon_jobs (job, fence, pruned_through) VALUES (:job, 0, :slot)
ON CONFLICT (job) DO UPDATE
SET pruned_through = max(coalesce(pruned_through, :slot), :slot);

-- Steering (anarchon.control), for _control.py and the claim.

-- name: job_pauses
-- The pauses a claim of the job obeys: its own and the whole cluster's ('*').
SELECT job, paused_by, at_ms, until_ms FROM anarchon_pauses WHERE job IN (?, '*');

-- name: all_pauses
SELECT job, paused_by, at_ms, until_ms FROM anarchon_pauses;

-- name: some_pauses
-- A claim transaction's pauses, read once when there are few (see SQLiteRows.pauses).
SELECT job, paused_by, at_ms, until_ms FROM anarchon_pauses LIMIT ?;

-- name: set_pause
INSERT INTO anarchon_pauses (job, paused_by, at_ms, until_ms)
VALUES (:job, :by, :at_ms, :until_ms)
ON CONFLICT (job) DO UPDATE
SET paused_by = excluded.paused_by, at_ms = excluded.at_ms, until_ms = excluded.until_ms;

-- name: drop_pause
DELETE FROM anarchon_pauses WHERE job = ? RETURNING job, paused_by, at_ms, until_ms;

-- name: add_request
INSERT INTO anarchon_requests (id, job, trigger, slot_key, slot, due_ms, requested_by,
                               requested_at_ms, retry)
VALUES (:id, :job, :trigger, :key, :slot, :due_ms, :requested_by, :requested_at_ms, :retry)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: all_requests
SELECT id, job, trigger, slot_key, slot, due_ms, requested_by, requested_at_ms, retry
FROM anarchon_requests ORDER BY due_ms, requested_at_ms, id;

-- name: job_requests
SELECT id, job, trigger, slot_key, slot, due_ms, requested_by, requested_at_ms, retry
FROM anarchon_requests WHERE job IN (?jobs) ORDER BY due_ms, requested_at_ms, id;

-- name: drop_request
DELETE FROM anarchon_requests WHERE id = ?;

-- name: control_tables
SELECT count(*) FROM sqlite_master
WHERE type = 'table' AND name IN ('anarchon_pauses', 'anarchon_requests');
