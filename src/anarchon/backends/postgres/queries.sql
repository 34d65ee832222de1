-- Every statement the PostgreSQL backend runs.
--
-- {schema}, {versions}, {additions}, {jobs}, {pruned}, {runs}, {pauses}, {requests}, {registry},
-- {definitions} and index names are identifiers, substituted with
-- psycopg.sql.Identifier after the schema and table prefix were validated; every value is a
-- %(name)s parameter. (So a literal percent sign is written %%, as registry_exists does; the
-- others need none: mod(). claim_function, sent without parameters, writes RAISE's % as it is.)
-- Parts: run_columns, current_attempt, held_by_ticket, kept_notices, claim_notices and
-- claim_columns are not statements but pieces of the statements below, substituted where those
-- write {run_columns} ... (see _queries.py).
-- Times are epoch milliseconds of the database clock, {now_ms} (clock_timestamp(), plus a
-- test-only offset, the session setting anarchon.test_clock_offset_ms, which production never
-- sets), read once per statement in the "clock" CTE: never the instance's clock.
--
-- Isolation. Every transaction that writes is BEGIN ISOLATION LEVEL READ COMMITTED (begin), or
-- sets it first (read_committed): a server whose default is REPEATABLE READ would otherwise take
-- one snapshot for the whole transaction, and a statement sent after a lock could not see what
-- the lock waited for.
--
-- Locking. Claims, takeovers and results first lock the rows of their jobs in {jobs} (lock_jobs
-- for a batch of claims, in one fixed order; lock_job for one job), then decide in a statement
-- of their own, whose snapshot is taken after the lock: it sees everything an earlier holder of
-- the lock committed. So a backup that lost a takeover race sees the winner's new attempt
-- (HELD), pruning counts exactly, and two results of one job never prune in two orders. Renew
-- and release touch their own run row only and wait for nothing else; a claim never waits for a
-- run row (it inserts only keys its snapshot shows absent). Every transaction locks at most its
-- jobs' rows, in that fixed order, then run rows of those jobs: no cycle.

-- name: run_columns
-- The columns of a run record, in RunRow's order (rows.py decodes them by name).
x.job, x.slot_key, x.slot, x.attempt, x.run_id, x.token, x.instance, x.trigger, x.status,
x.fence, x.started_at, x.finished_at, x.lease_expires_at, x.released, x.error, x.reason,
x.requested_by, x.skip_cause

-- name: current_attempt
-- The highest attempt of %(job)s's %(slot_key)s, found by the primary key.
SELECT {run_columns}
FROM {runs} x
WHERE x.job = %(job)s AND x.slot_key = %(slot_key)s
ORDER BY x.attempt DESC LIMIT 1

-- name: held_by_ticket
-- In a statement with a "clock": the current attempt of the ticket's slot, as renew and release
-- answer with it, and whether the ticket (%(token)s, %(fence)s) holds it.
SELECT clock.now, cur.attempt, cur.status, cur.released,
       cur.token = %(token)s AND cur.fence = %(fence)s::bigint AS ours
FROM clock
LEFT JOIN LATERAL ({current_attempt}) cur ON true

-- name: slot_recorded
-- In claim_decide and claim_plain, per request r: whether r's slot has a record (found true, else
-- no row). ORDER BY attempt makes it a lookup by the primary key (see claim_alone), never
-- by runs_recorded.
SELECT true AS found FROM {runs} x
WHERE x.job = r.job AND x.slot_key = r.slot_key
ORDER BY x.attempt DESC LIMIT 1

-- name: kept_notices
-- The notifications a statement of this session's transaction kept for send_notices.
coalesce(nullif(current_setting('anarchon.notices', true), ''), '[]')::jsonb

-- name: claim_notices
-- The last CTEs of claim_decide and claim_plain, after their "winners" (job, slot_key,
-- instance, lease_expires_at of each won claim): the claim notices (Backend.subscribe_claims),
-- the won claims as JSON lists [job, slot_key, instance, lease expiry], several to a
-- notification, each notification under 8000 bytes (NOTIFY's limit). %(later)s: kept for
-- send_notices, which the backend runs right after COMMIT (see there); NULL (a claim of one
-- request, claim_one): neither, the backend sends notify_claim itself; else sent at commit by
-- this transaction. (CASE: only the branch taken is evaluated; NULL takes neither.)
notices AS MATERIALIZED (
    SELECT json_agg(w.notice ORDER BY w.pos)::text AS payload
    FROM (
        SELECT v.notice, v.pos,
               sum(octet_length(v.notice::text) + 1) OVER (ORDER BY v.pos) / 7000 AS chunk
        FROM (
            SELECT json_build_array(w.job, w.slot_key, w.instance, w.lease_expires_at)
                       AS notice,
                   row_number() OVER (ORDER BY w.job, w.slot_key) AS pos
            FROM winners w
        ) v
    ) w
    GROUP BY w.chunk
),
notified AS MATERIALIZED (
    SELECT count(CASE WHEN NOT %(later)s::boolean THEN pg_notify(%(channel)s::text, n.payload)
                 END) AS sent,
           CASE WHEN %(later)s::boolean THEN
               set_config('anarchon.notices', coalesce(jsonb_agg(n.payload), '[]')::text, false)
           END AS kept
    FROM notices n
)

-- name: claim_columns
-- What claim and claim_one answer: claim_function's columns, named as claim_decide names them.
o_ord AS ord, o_verdict AS verdict, o_now AS now, o_job AS job, o_slot_key AS slot_key,
o_slot AS slot, o_attempt AS attempt, o_run_id AS run_id, o_token AS token,
o_instance AS instance, o_trigger AS trigger, o_status AS status, o_fence AS fence,
o_started_at AS started_at, o_finished_at AS finished_at,
o_lease_expires_at AS lease_expires_at, o_released AS released, o_error AS error,
o_reason AS reason, o_requested_by AS requested_by, o_skip_cause AS skip_cause

-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: schema_exists
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s);

-- name: version_table_exists
-- For a reader, which creates nothing: are there tables here at all?
SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = %(schema)s AND tablename = %(table)s);

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_version_table
CREATE TABLE IF NOT EXISTS {versions} (
    version integer PRIMARY KEY,
    applied_at bigint NOT NULL
);

-- name: schema_version
SELECT coalesce(max(version), 0) FROM {versions};

-- name: set_schema_version
INSERT INTO {versions} (version, applied_at)
VALUES (%(version)s, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint);

-- The versions of additive migrations (_migrations.ADDITIVE) are kept apart, in {additions}:
-- instances before schema version 5 check {versions} alone, so they still start on tables that
-- only gained additions. {additions} has the same columns, and its statements are the three
-- above on it (create_additions_table, schema_additions, set_schema_addition: _queries.py).

-- name: migration_1
CREATE TABLE {jobs} (
    job text PRIMARY KEY,
    fence bigint NOT NULL DEFAULT 0
);
CREATE TABLE {pruned} (
    job text PRIMARY KEY,
    through bigint NOT NULL
);
CREATE TABLE {runs} (
    job text NOT NULL,
    slot_key text NOT NULL,
    attempt integer NOT NULL,
    slot bigint,
    run_id text NOT NULL,
    token text NOT NULL,
    instance text NOT NULL,
    trigger text NOT NULL,
    status text NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'skipped')),
    fence bigint NOT NULL,
    started_at bigint NOT NULL,
    finished_at bigint,
    lease_expires_at bigint,
    released boolean NOT NULL DEFAULT false,
    error text,
    reason text,
    PRIMARY KEY (job, slot_key, attempt)
);
CREATE INDEX {runs_newest} ON {runs} (job, started_at DESC, attempt DESC);
CREATE INDEX {runs_running} ON {runs} (job) WHERE status = 'running';
CREATE INDEX {runs_slot} ON {runs} (job, slot) WHERE slot IS NOT NULL;

-- name: migration_2
-- History is newest first by start and, among runs that started in the same millisecond, by
-- the order they were recorded in: seq, which only rises.
ALTER TABLE {runs} ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
DROP INDEX {schema}.{runs_newest};
CREATE INDEX {runs_recorded} ON {runs} (job, started_at DESC, seq DESC);

-- name: migration_3
-- Steering (anarchon.control): who asked for a run, slots recorded 'missed', pauses and run
-- requests. The status check of migration 1 has the name PostgreSQL gave it,
-- <prefix>runs_status_check (never truncated: the prefix is at most 40 characters). It is
-- replaced by one of the same name that also allows 'missed'. The trigger column has no check.
-- (Migrations are split into statements at each semicolon: none in their comments.)
ALTER TABLE {runs} ADD COLUMN requested_by text;
ALTER TABLE {runs} DROP CONSTRAINT {runs_status_check};
ALTER TABLE {runs} ADD CONSTRAINT {runs_status_check}
    CHECK (status IN ('running', 'succeeded', 'failed', 'skipped', 'missed'));
-- One pause per job name, '*' for every job. A claim looks both up by the primary key.
CREATE TABLE {pauses} (
    job text PRIMARY KEY,
    paused_by text NOT NULL,
    at_ms bigint NOT NULL,
    until_ms bigint
);
CREATE TABLE {requests} (
    id text PRIMARY KEY,
    job text NOT NULL,
    trigger text NOT NULL,
    slot_key text NOT NULL,
    slot bigint,
    due_ms bigint NOT NULL,
    requested_by text NOT NULL,
    requested_at_ms bigint NOT NULL,
    retry integer NOT NULL DEFAULT 0
);
CREATE INDEX {requests_due} ON {requests} (job, due_ms, requested_at_ms, id);

-- name: migration_4
-- The claim as one function call (claim_function below): it answers a batch whose slots are
-- all recorded without locking anything, and queues the others on advisory locks of their jobs
-- before it locks their rows, so an instance that lost the race to a slot answers from the
-- winner's record without a write of its own. Instances of schema version 3 still running
-- beside it lock the same rows and run the same statement: they stay correct. (Until schema
-- version 5 this step also made the function, with the arguments of that version: now
-- migration_5 makes it, which always follows.)
CREATE TYPE {claim_answer} AS (
    o_ord bigint, o_verdict text, o_now bigint, o_job text, o_slot_key text, o_slot bigint,
    o_attempt integer, o_run_id text, o_token text, o_instance text, o_trigger text,
    o_status text, o_fence bigint, o_started_at bigint, o_finished_at bigint,
    o_lease_expires_at bigint, o_released boolean, o_error text, o_reason text,
    o_requested_by text
);

-- name: migration_5
-- The typed skip cause (anarchon.SkipCause) of each record made instead of a run, written by
-- the claim function: NULL for a run, and for skip records written before or by an instance of
-- an older anarchon, which are read by their reason's words (anarchon.backend.legacy_skip_cause).
-- Additive (recorded in {additions}, see _migrations.py): older instances name the columns they
-- read and write, and call the claim function with its first fifteen arguments: the new one
-- takes the causes as a sixteenth, which defaults to none, and answers them in a last attribute
-- of {claim_answer}, which their statements do not select.
ALTER TABLE {runs} ADD COLUMN skip_cause text;
DROP FUNCTION IF EXISTS {claim_fn}(
    text[], text[], bigint[], text[], text[], text[], text[], bigint[], boolean[], text[],
    text[], boolean[], text[], text, boolean
);
ALTER TYPE {claim_answer} ADD ATTRIBUTE o_skip_cause text;
{claim_function};

-- name: now
SELECT {now_ms} AS now;

-- name: begin
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: read_committed
-- The first statement of a transaction psycopg opened (on a connection the caller passed in).
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

-- name: warm_up_limit
-- In the warm-up of a new connection of the pool (PostgresBackend._warm), for its transaction
-- only: a lock it would wait for (a migration under way) fails it after WARM_UP_LIMIT_MS (at most
-- half of timeout_ms) rather than holding up the pool's new connection.
SELECT set_config('statement_timeout', %(ms)s, true);

-- name: set_clock_offset
-- Test-only: move this session's database clock (see {now_ms}).
SELECT set_config('anarchon.test_clock_offset_ms', %(offset)s, false);

-- name: lock_job
-- Lock one job's row: every claim, takeover and result of the job waits here for the others.
SELECT 1 FROM {jobs} WHERE job = %(job)s FOR UPDATE;

-- name: commit
COMMIT;

-- name: rollback
ROLLBACK;

-- name: deallocate_all
DEALLOCATE ALL;

-- name: lock_jobs
-- Lock (creating them if new) the rows of these jobs, in one fixed order for every instance.
-- DO UPDATE ... WHERE false locks an existing row without writing a new version of it.
INSERT INTO {jobs} AS j (job)
SELECT DISTINCT name COLLATE "C" FROM unnest(%(jobs)s::text[]) AS u (name) ORDER BY 1
ON CONFLICT (job) DO UPDATE SET fence = j.fence WHERE false;

-- name: claim_decide
-- Decides a batch of claims under the job locks (see the rules in anarchon/backend.py).
-- The batch holds no two requests for one (job, slot_key): the backend splits such a batch.
-- Requests of one job are decided as if one after the other, in order: a later request with
-- overlap = 'skip' sees an earlier winner of the batch as the job's live holder.
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
req AS (
    SELECT *
    FROM unnest(
        %(job)s::text[], %(slot_key)s::text[], %(slot)s::bigint[], %(run_id)s::text[],
        %(token)s::text[], %(instance)s::text[], %(trigger)s::text[], %(lease_ms)s::bigint[],
        %(overlap_skip)s::boolean[], %(skip_reason)s::text[], %(skip_status)s::text[],
        %(pausable)s::boolean[], %(requested_by)s::text[], %(skip_cause)s::text[]
    ) WITH ORDINALITY AS r (job, slot_key, slot, run_id, token, instance, trigger, lease_ms,
                            overlap_skip, skip_reason, skip_status, pausable, requested_by,
                            skip_cause, ord)
),
looked AS (
    SELECT r.*, clock.now, j.fence AS job_fence, h.run_id AS holder_run_id,
           h.slot AS holder_slot, pz.job AS pause_job, pz.paused_by AS pause_by,
           pz.until_ms AS pause_until,
           CASE
               WHEN rec.found THEN 'existing'
               WHEN r.slot IS NOT NULL AND r.slot <= p.through THEN 'pruned'
               WHEN r.skip_reason IS NOT NULL THEN 'skip'
               WHEN pz.job IS NOT NULL THEN 'paused'
               WHEN h.run_id IS NOT NULL THEN 'overlap'
               ELSE 'candidate'
           END AS kind
    FROM req r
    CROSS JOIN clock
    -- Each lookup is one per request (LATERAL ... LIMIT 1), by the primary key: a generic plan
    -- made while the tables were small hash-joined the jobs and pruned tables and hashed the
    -- whole runs table for the records' check, and went on doing so as they grew (240 ms a
    -- claim after 100 000 runs were added, against 8 ms for a new session's plan).
    CROSS JOIN LATERAL (SELECT j.fence FROM {jobs} j WHERE j.job = r.job LIMIT 1) j
    LEFT JOIN LATERAL (SELECT p.through FROM {pruned} p WHERE p.job = r.job LIMIT 1) p ON true
    LEFT JOIN LATERAL ({slot_recorded}) rec ON true
    LEFT JOIN LATERAL (
        -- The pause that holds the request (anarchon.control.active_pause): the job's own, else
        -- the whole cluster's ('*'); two lookups by the primary key, on the statement's clock.
        SELECT z.job, z.paused_by, z.until_ms FROM {pauses} z
        WHERE r.pausable AND z.job IN (r.job, '*')
          AND (z.until_ms IS NULL OR clock.now < z.until_ms)
        ORDER BY z.job = '*'
        LIMIT 1
    ) pz ON true
    LEFT JOIN LATERAL (
        -- The first recorded live holder: the one every backend names.
        SELECT x.run_id, x.slot FROM {runs} x
        WHERE r.overlap_skip AND x.job = r.job AND x.status = 'running' AND NOT x.released
          AND x.lease_expires_at > clock.now
        ORDER BY x.seq
        LIMIT 1
    ) h ON true
),
firsts AS (
    SELECT l.*,
           min(l.ord) FILTER (WHERE l.kind = 'candidate') OVER (PARTITION BY l.job) AS first_ord
    FROM looked l
),
decided AS (
    -- The first candidate of a job always wins; a later one wins unless it skips on overlap,
    -- and then the first candidate is the live holder it names.
    SELECT f.*,
           CASE
               WHEN f.kind <> 'candidate' THEN f.kind
               WHEN NOT f.overlap_skip OR f.ord = f.first_ord THEN 'won'
               ELSE 'overlap_batch'
           END AS verdict,
           CASE WHEN f.kind = 'overlap' THEN f.holder_run_id ELSE first.run_id END AS named_run_id,
           CASE WHEN f.kind = 'overlap' THEN f.holder_slot ELSE first.slot END AS named_slot,
           CASE WHEN f.kind = 'paused' THEN f.pause_until
                WHEN f.kind = 'overlap' THEN f.holder_slot
                ELSE first.slot
           END AS named_ms
    FROM firsts f
    LEFT JOIN req first ON first.ord = f.first_ord
),
numbered AS (
    -- Fences: the first winner of a job gets max(last fence + 1, now), the next ones follow.
    -- (In claim_function the job's fence was raised once already when its row was locked,
    -- take_fences: its winners' fences start above that one, which nobody holds.)
    SELECT d.*,
           CASE WHEN d.verdict = 'won' THEN
               greatest(d.job_fence, d.now - 1) + count(*) FILTER (WHERE d.verdict = 'won')
                   OVER (PARTITION BY d.job ORDER BY d.ord ROWS UNBOUNDED PRECEDING)
           END AS new_fence,
           CASE
               WHEN d.verdict = 'skip' THEN d.skip_reason
               -- anarchon.control.paused_reason(pause), character for character.
               WHEN d.verdict = 'paused' THEN 'paused by ' || d.pause_by
                   || CASE WHEN d.pause_job = '*' THEN ' (all jobs)' ELSE '' END
                   || coalesce(' until ' || d.named_iso, '')
               WHEN d.verdict IN ('overlap', 'overlap_batch') THEN 'overlap: run '
                   || d.named_run_id || ' ('
                   || CASE WHEN d.named_slot IS NULL THEN 'manual' ELSE 'slot ' || d.named_iso END
                   || ') still holds its lease'
           END AS new_reason
    FROM (
        -- The time the reason names (a slot, a pause's end) as Python's datetime.isoformat()
        -- writes it.
        SELECT d.*,
               CASE WHEN d.verdict IN ('paused', 'overlap', 'overlap_batch') THEN
                   to_char(to_timestamp(d.named_ms / 1000) AT TIME ZONE 'UTC',
                           'YYYY-MM-DD"T"HH24:MI:SS')
                   || CASE WHEN mod(d.named_ms, 1000) = 0 THEN ''
                           ELSE '.' || lpad((mod(d.named_ms, 1000) * 1000)::text, 6, '0')
                      END || '+00:00'
               END AS named_iso
        FROM decided d
    ) d
),
inserted AS (
    INSERT INTO {runs} AS x (job, slot_key, attempt, slot, run_id, token, instance, trigger,
                             status, fence, started_at, finished_at, lease_expires_at, released,
                             error, reason, requested_by, skip_cause)
    SELECT n.job, n.slot_key, 1, n.slot, n.run_id, n.token, n.instance, n.trigger,
           CASE n.verdict WHEN 'won' THEN 'running' WHEN 'skip' THEN n.skip_status
                          ELSE 'skipped' END,
           coalesce(n.new_fence, 0), n.now,
           CASE WHEN n.verdict = 'won' THEN NULL ELSE n.now END,
           CASE WHEN n.verdict = 'won' THEN n.now + n.lease_ms END,
           false, NULL, n.new_reason, n.requested_by,
           -- The skip cause (SkipCause's values): the request's for a skip it asked for.
           CASE n.verdict WHEN 'won' THEN NULL WHEN 'skip' THEN n.skip_cause
                          WHEN 'paused' THEN 'paused' ELSE 'overlap' END
    FROM numbered n
    WHERE n.verdict IN ('won', 'skip', 'paused', 'overlap', 'overlap_batch')
    ORDER BY n.ord
    ON CONFLICT (job, slot_key, attempt) DO NOTHING
    RETURNING {run_columns}
),
bumped AS (
    UPDATE {jobs} j SET fence = greatest(j.fence, w.now - 1) + w.won
    FROM (
        SELECT job, min(now) AS now, count(*) AS won FROM numbered WHERE verdict = 'won'
        GROUP BY job
    ) w
    WHERE j.job = w.job
    RETURNING j.job
),
answers AS (
    SELECT n.ord, i.*
    FROM inserted i JOIN numbered n ON n.job = i.job AND n.slot_key = i.slot_key
    UNION ALL
    SELECT n.ord, x.*
    FROM numbered n
    CROSS JOIN LATERAL (
        SELECT {run_columns}
        FROM {runs} x WHERE x.job = n.job AND x.slot_key = n.slot_key
        ORDER BY x.attempt DESC LIMIT 1
    ) x
    WHERE n.verdict = 'existing'
),
winners AS (
    SELECT i.job, i.slot_key, i.instance, i.lease_expires_at
    FROM inserted i
    WHERE i.status = 'running'
),
{claim_notices}
SELECT n.ord, n.verdict, n.now, {run_columns}
FROM numbered n LEFT JOIN answers x ON x.ord = n.ord
CROSS JOIN notified
ORDER BY n.ord;

-- name: claim_recorded
-- In claim_function: the current attempt of every requested slot (verdict 'existing', as
-- claim_decide answers a recorded slot), or no row at all when one slot has no record.
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
found AS MATERIALIZED (
    SELECT r.ord, clock.now, cur.*
    FROM unnest(a_job, a_slot_key) WITH ORDINALITY AS r (job, slot_key, ord)
    CROSS JOIN clock
    LEFT JOIN LATERAL (
        SELECT {run_columns}
        FROM {runs} x WHERE x.job = r.job AND x.slot_key = r.slot_key
        ORDER BY x.attempt DESC LIMIT 1
    ) cur ON true
)
SELECT f.ord, 'existing'::text, f.now, f.job, f.slot_key, f.slot, f.attempt, f.run_id, f.token,
       f.instance, f.trigger, f.status, f.fence, f.started_at, f.finished_at,
       f.lease_expires_at, f.released, f.error, f.reason, f.requested_by, f.skip_cause
FROM found f
WHERE NOT EXISTS (SELECT 1 FROM found m WHERE m.job IS NULL)
ORDER BY f.ord;

-- name: claim_alone
-- In claim_function, for a batch of one request, after its job's row was locked and the job's
-- next fence taken (a_fence, claim_function): the request wins when claim_decide would say
-- 'won' (its slot has no record and is not pruned; no skip reason; no active pause holds it,
-- if pausable; no live holder, if it skips on overlap), and is then recorded with that fence
-- and its record read INTO the function's output columns (claim_function answers it and
-- keeps its claim notice). Otherwise no row, no write: claim_decide decides. The same
-- decision in plain index lookups, without claim_decide's batch machinery, costs the server
-- about a third of the CPU. No ON CONFLICT: under the job's lock a slot this statement's
-- snapshot shows without a record has none (a conflict would be a bug, and fails the claim).
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
won AS (
    SELECT clock.now
    FROM clock
    WHERE %(skip_reason)s[1] IS NULL
      -- The slot's record by the primary key. ORDER BY attempt makes it so: a generic plan
      -- made on an empty table took runs_recorded for a NOT EXISTS (the job's whole history,
      -- each row fetched to compare its slot_key, at every claim).
      AND (SELECT x.attempt FROM {runs} x
           WHERE x.job = %(job)s[1] AND x.slot_key = %(slot_key)s[1]
           ORDER BY x.attempt DESC LIMIT 1) IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM {pruned} p WHERE p.job = %(job)s[1] AND %(slot)s[1] <= p.through
      )
      AND NOT (%(pausable)s[1] AND EXISTS (
          SELECT 1 FROM {pauses} z
          WHERE z.job IN (%(job)s[1], '*') AND (z.until_ms IS NULL OR clock.now < z.until_ms)
      ))
      AND NOT (%(overlap_skip)s[1] AND EXISTS (
          SELECT 1 FROM {runs} x
          WHERE x.job = %(job)s[1] AND x.status = 'running' AND NOT x.released
            AND x.lease_expires_at > clock.now
      ))
)
INSERT INTO {runs} AS x (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                         fence, started_at, finished_at, lease_expires_at, released, error,
                         reason, requested_by)
SELECT %(job)s[1], %(slot_key)s[1], 1, %(slot)s[1], %(run_id)s[1], %(token)s[1],
       %(instance)s[1], %(trigger)s[1], 'running', %(fence)s, w.now, NULL,
       w.now + %(lease_ms)s[1], false, NULL, NULL, %(requested_by)s[1]
FROM won w
RETURNING 1::bigint, 'won'::text, x.started_at, {run_columns}
INTO a_out;

-- name: claim_recorded_one
-- In claim_function, for a batch of one request: claim_recorded's answer, by one lookup of the
-- primary key.
SELECT 1::bigint, 'existing'::text, {now_ms}, {run_columns}
FROM {runs} x
WHERE x.job = %(job)s[1] AND x.slot_key = %(slot_key)s[1]
ORDER BY x.attempt DESC LIMIT 1;

-- name: take_fence
-- In claim_function, for a batch of one request: lock the job's row and take its next fence,
-- max(last fence + 1, now), INTO a_fence, in one write (the row's lock and its new fence, one
-- log record). A claim that then does not win leaves the fence raised: fences only have to
-- rise, and the next winner's is max(last + 1, now) all the same.
UPDATE {jobs} j SET fence = greatest(j.fence, {now_ms} - 1) + 1
WHERE j.job = %(job)s[1]
RETURNING j.fence INTO a_fence;

-- name: take_fences
-- In claim_function, for a batch of requests: lock the rows of their jobs (creating them if
-- new) in lock_jobs' fixed order and take each job's next fence, max(last fence + 1, now), in
-- the same write (ON CONFLICT DO UPDATE locks the row and writes its new fence; a new job's
-- row is made with now). claim_plain gives each winner its job's fence as taken here;
-- claim_decide numbers its winners from it. A job whose request then does not win keeps the
-- raised fence: fences only have to rise.
INSERT INTO {jobs} AS j (job, fence)
SELECT u.name, c.now
FROM (SELECT DISTINCT name COLLATE "C" AS name FROM unnest(%(jobs)s::text[]) AS n (name)) u
CROSS JOIN (SELECT {now_ms} AS now) c
ORDER BY 1
ON CONFLICT (job) DO UPDATE SET fence = greatest(j.fence, EXCLUDED.fence - 1) + 1;

-- name: claim_plain
-- In claim_function, for a batch of requests of distinct jobs, under their jobs' locks and at
-- the clock %(now)s read after them: when every request wins as claim_alone decides one, they
-- are all recorded and answered as claim_decide records and answers winners (each with the
-- fence take_fences gave its job; the function then keeps their claim notices, plain_notices);
-- otherwise no row, no write: claim_decide decides. Each lookup is one per request by the
-- primary key (LATERAL ... LIMIT 1, as in claim_decide).
WITH clock AS MATERIALIZED (
    SELECT %(now)s::bigint AS now
),
cluster AS MATERIALIZED (
    SELECT true AS paused FROM {pauses} z CROSS JOIN clock
    WHERE z.job = '*' AND (z.until_ms IS NULL OR clock.now < z.until_ms)
),
won AS MATERIALIZED (
    SELECT r.*, clock.now, j.fence
    FROM unnest(
        %(job)s::text[], %(slot_key)s::text[], %(slot)s::bigint[], %(run_id)s::text[],
        %(token)s::text[], %(instance)s::text[], %(trigger)s::text[], %(lease_ms)s::bigint[],
        %(overlap_skip)s::boolean[], %(skip_reason)s::text[], %(pausable)s::boolean[],
        %(requested_by)s::text[]
    ) WITH ORDINALITY AS r (job, slot_key, slot, run_id, token, instance, trigger, lease_ms,
                            overlap_skip, skip_reason, pausable, requested_by, ord)
    CROSS JOIN clock
    CROSS JOIN LATERAL (SELECT j.fence FROM {jobs} j WHERE j.job = r.job LIMIT 1) j
    LEFT JOIN LATERAL ({slot_recorded}) rec ON true
    LEFT JOIN LATERAL (
        SELECT true AS found FROM {pruned} p WHERE p.job = r.job AND r.slot <= p.through LIMIT 1
    ) p ON true
    LEFT JOIN LATERAL (
        -- The job's own pause; the whole cluster's ('*') is looked up once, in "cluster".
        SELECT true AS found FROM {pauses} z
        WHERE r.pausable AND z.job = r.job AND (z.until_ms IS NULL OR clock.now < z.until_ms)
        LIMIT 1
    ) pz ON true
    LEFT JOIN LATERAL (
        SELECT true AS found FROM {runs} x
        WHERE r.overlap_skip AND x.job = r.job AND x.status = 'running' AND NOT x.released
          AND x.lease_expires_at > clock.now
        LIMIT 1
    ) h ON true
    WHERE r.skip_reason IS NULL AND rec.found IS NULL AND p.found IS NULL AND pz.found IS NULL
      AND h.found IS NULL AND NOT (r.pausable AND EXISTS (SELECT 1 FROM cluster))
),
every AS MATERIALIZED (
    SELECT count(*) = cardinality(%(job)s::text[])
           AND count(DISTINCT job) = cardinality(%(job)s::text[]) AS yes
    FROM won
),
inserted AS (
    -- No ON CONFLICT: under the jobs' locks a slot this statement's snapshot shows without a
    -- record has none (a conflict would be a bug, and fails the claim).
    INSERT INTO {runs} (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                        fence, started_at, finished_at, lease_expires_at, released, error,
                        reason, requested_by)
    SELECT w.job, w.slot_key, 1, w.slot, w.run_id, w.token, w.instance, w.trigger, 'running',
           w.fence, w.now, NULL, w.now + w.lease_ms, false, NULL, NULL, w.requested_by
    FROM won w CROSS JOIN every
    WHERE every.yes
    ORDER BY w.ord
)
-- The winners' records as inserted (run_columns' order), in the order of the requests.
SELECT w.ord, 'won'::text, w.now, w.job, w.slot_key, w.slot, 1, w.run_id, w.token, w.instance,
       w.trigger, 'running'::text, w.fence, w.now, NULL::bigint, w.now + w.lease_ms, false,
       NULL::text, NULL::text, w.requested_by, NULL::text
FROM won w
CROSS JOIN every
WHERE every.yes
ORDER BY w.ord;

-- name: plain_notices
-- In claim_function, after claim_plain recorded every request of the batch at the clock
-- %(now)s: the claim notices, all in one JSON list INTO a_notice (claim_notices' notice of each
-- won claim, in the order of the requests: a listener reads each notice alone). Made inside
-- claim_plain (claim_notices' numbering, chunking and sorts), they cost a won batch of 17 about
-- 0.35 M instructions more.
SELECT json_agg(json_build_array(u.job, u.slot_key, u.instance, %(now)s + u.lease_ms))::text
FROM unnest(%(job)s::text[], %(slot_key)s::text[], %(instance)s::text[], %(lease_ms)s::bigint[])
    AS u (job, slot_key, instance, lease_ms)
INTO a_notice;

-- name: plain_notices_chunked
-- plain_notices' list when it is over 7000 bytes: claim_notices' chunks (each notification
-- under NOTIFY's 8000 bytes), kept for send_notices or sent at commit.
WITH winners AS (
    SELECT u.job, u.slot_key, u.instance, %(now)s + u.lease_ms AS lease_expires_at
    FROM unnest(%(job)s::text[], %(slot_key)s::text[], %(instance)s::text[],
                %(lease_ms)s::bigint[]) AS u (job, slot_key, instance, lease_ms)
),
{claim_notices}
SELECT n.sent FROM notified n INTO discarded;

-- name: keep_notice
-- In claim_function, after a won claim's notification was made INTO a_notice (one request, or
-- plain_notices' list under 7000 bytes): kept for send_notices (%(later)s), or sent at commit.
-- PL/pgSQL, not a statement: plain expressions, evaluated without starting a query.
IF %(later)s THEN
    discarded := set_config('anarchon.notices', jsonb_build_array(a_notice)::text, false);
ELSE
    discarded := pg_notify(%(channel)s, a_notice)::text;
END IF;

-- name: claim_function
-- The claim (PostgresBackend.claim), made by migration_5 (by migration_4 before): one call
-- decides a batch (the arguments are claim_decide's parameters, an array per field, the
-- requests' skip causes last) and answers claim_decide's rows.
--  1. Plans: a batch of over 100 requests is planned for its size (plan_cache_mode =
--     force_custom_plan: a generic plan estimates unnest() of an array at 10 rows, and for
--     10 000 requests chose nested loops that took 11.4 s against 0.5 s) with JIT off (the
--     estimate for a large batch passes jit_above_cost, and compiling cost 1.5 s against 0.2 s
--     of running); a smaller one reuses the generic plan (planning was 1.1 ms of 2.3 ms).
--     Both for the rest of the transaction only.
--  2. Queue on an advisory lock per job (transaction-scoped, taken in the order of their keys),
--     then answer from the records if every slot is recorded: an instance that lost the race to
--     a slot waits here for the winner's commit, finds its record, and commits without having
--     locked a row or written anything, so its commit does not wait for a log flush. Only for
--     batches of up to 64 requests (max_locks_per_transaction's default): advisory locks live in
--     the server's shared lock table, which three instances claiming 10 000 jobs each at once
--     would overflow ("out of shared memory"). A larger batch is answered from the records
--     only if they are all there already, without waiting.
--  3. Otherwise lock the jobs' rows and decide. A batch of one request (claim_recorded_one
--     above, one lookup) locks its job's row by taking the job's next fence (take_fence: the
--     lock and the fence in one write of the row, where a lock and then an update wrote two),
--     then wins by claim_alone, which answers into the output columns so that the claim
--     notice is kept by plain expressions; a larger batch locks its rows and takes each
--     job's next fence in one write too (take_fences) and wins by claim_plain, whose winners
--     hold those fences (a lock of each row, then claim_plain's update of each, wrote the
--     rows twice: 17 new requests 5.69 M -> 5.23 M instructions per claim). Else claim_decide decides. The rows are the locks every claim, takeover
--     and result takes (schema version 3 instances too), so correctness never depends on the
--     advisory locks. Server cost of a won one-request claim (callgrind, instructions of the
--     session per claim, its send_notices included): 1.10 M with claim_recorded, lock_jobs
--     and a claim_alone that answered through CTEs, 0.77 M without them; about 0.75 M since the answer
--     is a composite type (<prefix>claim_answer, whose row description is cached where a
--     RETURNS TABLE rebuilt it from the catalogue at every call) and a one-request winner's
--     notice is sent by the client (notify_claim) instead of kept here for send_notices
--     (a_later NULL); the raw primitive's 0.06 M. Lost: 0.26 M. The runs table's status
--     CHECK costs 0.04 M of a won claim and stays: it guards the data against any writer.
--     Taking the fence in claim_alone's statement (the decision's snapshot guarded by the job
--     row's xmin) cost more than the statement it saved (0.86-0.92 M): not done.
--     Measured and not done either (2026-12-05, callgrind as above, 1000 won claims while the
--     job grows from 200 to 1400 runs: 0.752-0.765 M each as it is): runs_recorded ascending,
--     (job, started_at, seq), read backward by the history, 0.748 M (only the last job's newest
--     runs land on the index's rightmost page, where B-tree's fast path and 90/10 splits
--     apply); no runs_recorded at all 0.731 M; the jobs table at fillfactor 10 (the job row's
--     dead versions pruned sooner: take_fence walks a shorter HOT chain, whatever autovacuum
--     does) 0.733 M in three runs of three; claim_alone without the overlap check (a second
--     statement for requests that allow overlap) 0.723 M. Each needs a schema version, which
--     older instances refuse to start on, for 0.5 to 4 per cent of it. Server CPU of a won claim
--     (/proc/<pid>/schedstat, 3000 claims, three rounds) was 0.20-0.25 ms with runs_recorded
--     descending, ascending or absent alike. A lost claim (0.26 M; the primitive's 0.043 M)
--     answered without PL/pgSQL, its job's lock and then its record by the primary key in
--     one pipelined transaction, is 0.19 M; a winner would then pay both.
-- Every statement of a volatile function takes a new snapshot (READ COMMITTED), after the
-- locks before it. So the function refuses to run in any other isolation level (SQLSTATE
-- AN001): one claim is sent alone, as a transaction of its own (claim_one), on a connection
-- whose default may be another level; the backend then sends it inside BEGIN READ COMMITTED.
CREATE FUNCTION {claim_fn}(
    a_job text[], a_slot_key text[], a_slot bigint[], a_run_id text[], a_token text[],
    a_instance text[], a_trigger text[], a_lease_ms bigint[], a_overlap_skip boolean[],
    a_skip_reason text[], a_skip_status text[], a_pausable boolean[], a_requested_by text[],
    a_channel text, a_later boolean, a_skip_cause text[] DEFAULT NULL
) RETURNS SETOF {claim_answer} LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    a_out {claim_answer};
    a_jobs text[] := a_job;
    a_fence bigint;
    a_now bigint;
    a_notice text;
    discarded text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the claim function needs READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = 'AN001';
    END IF;
    -- Assignments of plain expressions, not PERFORM: PL/pgSQL evaluates them without starting
    -- a query (a query's executor start-up was a fifth of a won claim's server CPU).
    IF cardinality(a_job) > 100 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true),
                set_config('jit', 'off', true);
    ELSE
        discarded := set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    IF cardinality(a_job) = 1 THEN
        discarded := pg_advisory_xact_lock(hashtextextended({claim_lock} || a_job[1], 0))::text;
    ELSIF cardinality(a_job) <= 64 THEN
        PERFORM pg_advisory_xact_lock(k.key)
        FROM (
            SELECT DISTINCT hashtextextended({claim_lock} || u.name, 0) AS key
            FROM unnest(a_job) AS u (name)
            ORDER BY 1
        ) k;
    END IF;
    IF cardinality(a_job) = 1 THEN
        RETURN QUERY {fn_claim_recorded_one}
    ELSE
        RETURN QUERY {fn_claim_recorded}
    END IF;
    IF FOUND THEN
        RETURN;
    END IF;
    IF cardinality(a_job) = 1 THEN
        {fn_take_fence}
        IF NOT FOUND THEN
            -- A new job: its row made (and so locked), then its first fence taken.
            {fn_lock_jobs}
            {fn_take_fence}
        END IF;
        {fn_claim_alone}
        IF FOUND THEN
            -- claim_decide's notice of one won claim: kept for send_notices, or sent at
            -- commit; neither when a_later is NULL (claim_one: the backend sends it itself,
            -- notify_claim). Plain expressions, evaluated without starting a query.
            IF a_later IS NOT NULL THEN
                a_notice := json_build_array(json_build_array(
                    a_out.o_job, a_out.o_slot_key, a_out.o_instance, a_out.o_lease_expires_at
                ))::text;
                {fn_keep_notice}
            END IF;
            RETURN NEXT a_out;
            RETURN;
        END IF;
    ELSE
        {fn_take_fences}
        a_now := {now_ms};
        RETURN QUERY {fn_claim_plain}
        IF FOUND THEN
            {fn_plain_notices}
            IF octet_length(a_notice) > 7000 THEN
                {fn_plain_notices_chunked}
            ELSE
                {fn_keep_notice}
            END IF;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY {fn_claim_decide}
END
$fn$

-- name: claim
-- One call of claim_function, its columns named as claim_decide names them. The batch comes as
-- one JSON object, an array per argument of the function (_rows.claim_batch_params), read into
-- the function's arrays by one jsonb_to_record (thirteen array_agg(... ORDER BY) over the
-- elements of a JSON array of requests sorted the batch thirteen times).
SELECT {claim_columns}
FROM jsonb_to_record(%(batch)s::jsonb) AS a (
    job text[], slot_key text[], slot bigint[], run_id text[], token text[], instance text[],
    trigger text[], lease_ms bigint[], overlap_skip boolean[], skip_reason text[],
    skip_status text[], pausable boolean[], requested_by text[], skip_cause text[]
)
CROSS JOIN LATERAL {claim_fn}(
    a.job, a.slot_key, a.slot, a.run_id, a.token, a.instance, a.trigger, a.lease_ms,
    a.overlap_skip, a.skip_reason, a.skip_status, a.pausable, a.requested_by,
    %(channel)s::text, %(later)s::boolean, a.skip_cause
);

-- name: claim_one
-- The claim of one request, sent alone as a transaction of its own: its arrays are built here
-- from one value each, so the driver sends plain values (a one-element array took psycopg
-- longer to encode than the claim's whole round trip on the client). With notifications on,
-- "later" is NULL: the claim keeps no notice, the backend sends a winner's (notify_claim).
SELECT {claim_columns}
FROM {claim_fn}(
    ARRAY[%(job)s::text], ARRAY[%(slot_key)s::text], ARRAY[%(slot)s::bigint],
    ARRAY[%(run_id)s::text], ARRAY[%(token)s::text], ARRAY[%(instance)s::text],
    ARRAY[%(trigger)s::text], ARRAY[%(lease_ms)s::bigint], ARRAY[%(overlap_skip)s::boolean],
    ARRAY[%(skip_reason)s::text], ARRAY[%(skip_status)s::text], ARRAY[%(pausable)s::boolean],
    ARRAY[%(requested_by)s::text], %(channel)s::text, %(later)s::boolean,
    ARRAY[%(skip_cause)s::text]
);

-- name: send_notices
-- Right after the COMMIT of a claim or of results, in the same round trip and session: send the
-- notifications they kept (the session setting anarchon.notices, a JSON list of payloads, set
-- in their transaction, so kept only if it committed) and forget them. NOTIFY serialises the
-- commits of every transaction that notifies (a cluster-wide lock, held through the commit's
-- log flush); this transaction writes nothing else, so its commit waits for no flush and the
-- claims' and results' commits no longer queue behind each other. Only with notifications on:
-- LISTEN needs a session, so the pool's connections are sessions too (no PgBouncer in
-- transaction mode, where the next statement may run in another session).
SELECT count(pg_notify(%(channel)s::text, n.payload)) AS sent,
       set_config('anarchon.notices', '[]', false) AS cleared
FROM jsonb_array_elements_text({kept_notices}) AS n (payload);

-- name: notify_claim
-- Right after a one-request claim won (claim_one, "later" NULL, committed): its claim
-- notice, built by the client from the answer (kit.feed.encode_notice). As send_notices, a
-- transaction of its own that writes nothing, but without keeping the notice in the session
-- and reading it back (set_config in the claim, send_notices' JSON and aggregate): 0.09 M
-- instructions less per won claim (callgrind, 0.79 -> 0.70 M, both measured without the runs
-- status CHECK).
SELECT pg_notify(%(channel)s::text, %(payload)s::text) AS sent;

-- name: peek_takeover
-- The current attempt of a slot and the clock, without a lock: enough to answer ENDED, HELD or
-- an idempotent TAKEN. Only an expired or released lease goes on to take_over, under the lock.
SELECT clock.now, x.*
FROM (SELECT {now_ms} AS now) clock
LEFT JOIN LATERAL ({current_attempt}) x ON true;

-- name: take_over
-- One takeover, after lock_job in the same transaction (so this statement sees every attempt
-- an earlier holder of the job's lock committed): the current attempt is locked, judged, marked
-- failed and followed by attempt + 1 with the next fence of the job. A backup that lost the
-- race sees the winner's attempt and is told HELD.
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
cur AS (
    {current_attempt}
    FOR UPDATE
),
judged AS (
    SELECT c.*, clock.now,
           CASE
               WHEN c.status <> 'running' THEN 'ended'
               WHEN c.token = %(token)s AND NOT c.released THEN 'mine'
               WHEN NOT c.released AND c.lease_expires_at > clock.now THEN 'held'
               WHEN c.attempt >= %(max_attempts)s::integer THEN 'exhausted'
               ELSE 'taken'
           END AS verdict,
           CASE WHEN c.released THEN 'handed over' ELSE 'lease lost' END AS why
    FROM cur c CROSS JOIN clock
),
failed AS (
    UPDATE {runs} x
    SET status = 'failed', finished_at = v.now, reason = v.why,
        error = CASE
            WHEN v.verdict = 'exhausted' THEN v.why || ' on attempt ' || v.attempt
                || ' of max_attempts=' || %(max_attempts)s::integer || '; not retried'
            ELSE v.why || ': attempt ' || (v.attempt + 1) || ' taken over by '
                || %(instance)s::text
        END
    FROM judged v
    WHERE v.verdict IN ('exhausted', 'taken')
      AND x.job = v.job AND x.slot_key = v.slot_key AND x.attempt = v.attempt
    RETURNING {run_columns}
),
bumped AS (
    INSERT INTO {jobs} AS j (job, fence)
    SELECT v.job, greatest(1, v.now) FROM judged v WHERE v.verdict = 'taken'
    ON CONFLICT (job) DO UPDATE SET fence = greatest(j.fence + 1, EXCLUDED.fence)
    RETURNING j.fence
),
inserted AS (
    INSERT INTO {runs} AS x (job, slot_key, attempt, slot, run_id, token, instance, trigger,
                             status, fence, started_at, finished_at, lease_expires_at, released,
                             error, reason, requested_by)
    SELECT v.job, v.slot_key, v.attempt + 1, v.slot, %(run_id)s, %(token)s, %(instance)s,
           v.trigger, 'running', b.fence, v.now, NULL, v.now + %(lease_ms)s::bigint, false,
           NULL, NULL, v.requested_by
    FROM judged v CROSS JOIN bumped b
    RETURNING {run_columns}
)
SELECT v.verdict, clock.now, r.*,
       -- Exhausted ends the run: tell the watching backups, as a result does.
       (SELECT pg_notify(%(channel)s, v.job || ' ' || v.slot_key || ' finished')
        WHERE v.verdict = 'exhausted')::text AS notified
FROM clock
LEFT JOIN judged v ON true
LEFT JOIN LATERAL (
    SELECT * FROM inserted
    UNION ALL
    SELECT * FROM failed WHERE NOT EXISTS (SELECT 1 FROM inserted)
    UNION ALL
    SELECT {run_columns} FROM judged x WHERE x.verdict IN ('ended', 'held', 'mine')
) r ON true;

-- name: renew
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
renewed AS (
    UPDATE {runs} x SET lease_expires_at = clock.now + %(lease_ms)s::bigint
    FROM clock
    WHERE x.job = %(job)s AND x.slot_key = %(slot_key)s AND x.attempt = %(attempt)s::integer
      AND x.token = %(token)s AND x.fence = %(fence)s::bigint
      AND x.status = 'running' AND NOT x.released
    RETURNING x.lease_expires_at
)
SELECT held.*, (SELECT lease_expires_at FROM renewed) AS lease_expires_at
FROM ({held_by_ticket}) held;

-- name: release
-- Hand the attempt over: its lease ends now; backups are told at commit (NOTIFY).
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
released AS (
    UPDATE {runs} x SET released = true, lease_expires_at = clock.now
    FROM clock
    WHERE x.job = %(job)s AND x.slot_key = %(slot_key)s AND x.attempt = %(attempt)s::integer
      AND x.token = %(token)s AND x.fence = %(fence)s::bigint AND x.status = 'running'
    RETURNING x.job, x.slot_key
)
SELECT held.*,
       (SELECT count(pg_notify(%(channel)s, job || ' ' || slot_key || ' released')::text)
        FROM released) AS done
FROM ({held_by_ticket}) held;

-- name: finish
-- Record the result, prune the job's history and tell watching backups (NOTIFY, at commit), in
-- one statement, after lock_job in the same transaction. The result is accepted when the
-- attempt is still ours and running, or when it already holds this very result (a retry whose
-- answer was lost: same token, status and error, no reason from a backup). Only an accepted
-- result prunes, by the rules of anarchon.kit.lease: whole slots, never this slot
-- nor a running one; slots whose every attempt ended before now - ttl_ms (oldest first), then
-- the oldest ended slots while the job holds more than keep slots; at most batch slots. The
-- newest slot dropped is remembered in {pruned} in the same statement, so a late claim of a
-- dropped slot is refused instead of running it again. A failed result with retries left
-- stores its retry (%(retry_id)s not NULL: the run request's fields, as the request statement
-- takes them) in the same statement, only when this statement accepted it, once per id.
WITH clock AS MATERIALIZED (
    SELECT {now_ms} AS now
),
finished AS (
    UPDATE {runs} x
    SET status = %(status)s, error = %(error)s, finished_at = clock.now, lease_expires_at = NULL
    FROM clock
    WHERE x.job = %(job)s AND x.slot_key = %(slot_key)s AND x.attempt = %(attempt)s::integer
      AND x.token = %(token)s AND x.fence = %(fence)s::bigint AND x.status = 'running'
    RETURNING {run_columns}
),
retried AS (
    INSERT INTO {requests} (id, job, trigger, slot_key, slot, due_ms, requested_by,
                            requested_at_ms, retry)
    SELECT %(retry_id)s::text, %(retry_job)s::text, %(retry_trigger)s::text,
           %(retry_key)s::text, %(retry_slot)s::bigint, %(retry_due_ms)s::bigint,
           %(retry_requested_by)s::text, %(retry_requested_at_ms)s::bigint,
           %(retry_number)s::integer
    FROM finished
    WHERE %(retry_id)s::text IS NOT NULL
    ON CONFLICT (id) DO NOTHING
),
current AS (
    {current_attempt}
),
accepted AS (
    SELECT 1 AS yes FROM finished
    UNION ALL
    SELECT 1 FROM current c
    WHERE c.attempt = %(attempt)s::integer AND c.token = %(token)s
      AND c.fence = %(fence)s::bigint AND c.status = %(status)s
      AND c.error IS NOT DISTINCT FROM %(error)s::text AND c.reason IS NULL
),
aged AS MATERIALIZED (
    SELECT f.slot_key, f.slot
    FROM {runs} f CROSS JOIN clock
    WHERE EXISTS (SELECT 1 FROM accepted) AND %(ttl_ms)s::bigint IS NOT NULL
      AND f.job = %(job)s AND f.attempt = 1 AND f.slot_key <> %(slot_key)s
      AND f.started_at < clock.now - %(ttl_ms)s::bigint
      AND NOT EXISTS (
          SELECT 1 FROM {runs} y
          WHERE y.job = f.job AND y.slot_key = f.slot_key
            AND (y.status = 'running' OR y.finished_at IS NULL
                 OR y.finished_at >= clock.now - %(ttl_ms)s::bigint)
      )
    ORDER BY f.started_at, f.seq
    LIMIT %(batch)s::integer
),
held AS MATERIALIZED (
    -- Counted up to keep + batch (all that the limit below needs), so a job with a million
    -- records is not counted in full at every result.
    SELECT count(*) AS slots FROM (
        SELECT 1 FROM {runs} x
        WHERE EXISTS (SELECT 1 FROM accepted) AND x.job = %(job)s AND x.attempt = 1
        LIMIT %(keep)s::integer + %(batch)s::integer
    ) counted
),
oldest AS MATERIALIZED (
    SELECT f.slot_key, f.slot
    FROM {runs} f
    WHERE EXISTS (SELECT 1 FROM accepted)
      AND f.job = %(job)s AND f.attempt = 1 AND f.slot_key <> %(slot_key)s
      AND f.slot_key NOT IN (SELECT slot_key FROM aged)
      AND NOT EXISTS (
          SELECT 1 FROM {runs} y
          WHERE y.job = f.job AND y.slot_key = f.slot_key AND y.status = 'running'
      )
    ORDER BY f.started_at, f.seq
    LIMIT greatest(0, least(%(batch)s::integer, (SELECT slots FROM held) - %(keep)s::integer)
                      - (SELECT count(*) FROM aged))
),
victims AS (
    SELECT slot_key, slot FROM aged UNION ALL SELECT slot_key, slot FROM oldest
),
dropped AS (
    -- By the primary key: (job, slot_key) for each victim, every attempt of it.
    DELETE FROM {runs} x
    WHERE x.job = %(job)s AND x.slot_key = ANY (ARRAY(SELECT slot_key FROM victims))
    RETURNING x.slot
),
raised AS (
    INSERT INTO {pruned} AS p (job, through)
    SELECT %(job)s, max(v.slot) FROM victims v
    HAVING max(v.slot) IS NOT NULL
    ON CONFLICT (job) DO UPDATE SET through = greatest(p.through, EXCLUDED.through)
)
SELECT 'finished' AS outcome, f.*,
       -- Sent at commit, or (%(later)s) added to those send_notices sends after COMMIT.
       CASE WHEN %(later)s::boolean THEN
           set_config('anarchon.notices',
                      ({kept_notices} || to_jsonb(f.job || ' ' || f.slot_key || ' finished'))::text,
                      false)
       ELSE (SELECT pg_notify(%(channel)s, f.job || ' ' || f.slot_key || ' finished'))::text
       END AS notified,
       (SELECT count(*) FROM dropped) AS pruned
FROM finished f
UNION ALL
SELECT 'current', c.*, NULL, (SELECT count(*) FROM dropped)
FROM current c
WHERE NOT EXISTS (SELECT 1 FROM finished);

-- name: history
SELECT {run_columns}
FROM {runs} x
WHERE x.job = %(job)s
ORDER BY x.started_at DESC, x.seq DESC
LIMIT %(limit)s;

-- name: histories
-- history of each job of an array, in one statement (Backend.histories: anarchon jobs, the
-- dashboard): per job the same backward range of the index runs_recorded as history, LIMIT
-- rows, in a LATERAL subquery; jobs in the array's order, each newest first.
SELECT {run_columns}
FROM unnest(%(jobs)s::text[]) WITH ORDINALITY AS j(job, n)
CROSS JOIN LATERAL (
    SELECT * FROM {runs} r
    WHERE r.job = j.job
    ORDER BY r.started_at DESC, r.seq DESC
    LIMIT %(limit)s
) x
ORDER BY j.n, x.started_at DESC, x.seq DESC;

-- name: slot_records
-- Every attempt of one slot, its retries' too, oldest first (index runs_slot), with the earliest
-- recorded slot (runs_slot) and start (runs_recorded) of the job: index lookups only.
SELECT {run_columns},
       least((SELECT min(slot) FROM {runs} WHERE job = %(job)s AND slot IS NOT NULL),
             (SELECT min(started_at) FROM {runs} WHERE job = %(job)s)) AS oldest
FROM (SELECT 1) one
LEFT JOIN {runs} x ON x.job = %(job)s AND x.slot = %(slot)s::bigint
ORDER BY x.started_at, x.seq;

-- name: last_slot
-- The newest recorded slot, or the newest pruned one if that is newer.
SELECT greatest(
    (SELECT max(slot) FROM {runs} WHERE job = %(job)s AND slot IS NOT NULL),
    (SELECT through FROM {pruned} WHERE job = %(job)s)
) AS slot;

-- name: open_runs
-- The attempts of an array of jobs still running that started since a time
-- (LeaseBackend.open_runs), through the partial index on running attempts (runs_running).
SELECT {run_columns}
FROM {runs} x
WHERE x.job = ANY(%(jobs)s::text[]) AND x.status = 'running' AND x.started_at >= %(since)s;

-- name: last_slots
-- last_slot of each job of an array, in one statement (a scheduler starting with 100 000 jobs
-- asks for all of them).
SELECT j.job, greatest(
    (SELECT max(slot) FROM {runs} WHERE job = j.job AND slot IS NOT NULL),
    (SELECT through FROM {pruned} WHERE job = j.job)
) AS slot
FROM unnest(%(jobs)s::text[]) AS j(job);

-- Steering (anarchon.control, _control.py): pauses and run requests, each call one statement
-- in autocommit. Parameters and columns go by the names of Pause and RunRequest (to_dict). The tables are made by migration_3; a read of tables that are not there is
-- answered empty by the caller, which creates nothing.

-- name: pause
INSERT INTO {pauses} AS z (job, paused_by, at_ms, until_ms)
VALUES (%(job)s, %(by)s, %(at_ms)s, %(until_ms)s)
ON CONFLICT (job) DO UPDATE
SET paused_by = EXCLUDED.paused_by, at_ms = EXCLUDED.at_ms, until_ms = EXCLUDED.until_ms
RETURNING z.job;

-- name: resume
DELETE FROM {pauses} WHERE job = %(job)s
RETURNING job, paused_by AS "by", at_ms, until_ms;

-- name: pauses
SELECT job, paused_by AS "by", at_ms, until_ms FROM {pauses};

-- name: end_unbounded_pauses
-- On every start, after the migrations: an end past the last time anarchon handles (the
-- parameter latest, anarchon.control.MAX_UNTIL_MS), which earlier versions stored when given one
-- (epoch nanoseconds by mistake), becomes no end at all, as Pause reads it. The claim function
-- names a pause's end in its reason with to_timestamp(), which fails past the year 294276: such
-- an end made every claim of the job fail.
UPDATE {pauses} SET until_ms = NULL WHERE until_ms > %(latest)s;

-- name: request
-- Idempotent by id: answers a row only when the request was stored.
INSERT INTO {requests} (id, job, trigger, slot_key, slot, due_ms, requested_by,
                        requested_at_ms, retry)
VALUES (%(id)s, %(job)s, %(trigger)s, %(key)s, %(slot)s, %(due_ms)s, %(requested_by)s,
        %(requested_at_ms)s, %(retry)s)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: requests
-- Due first, then by request, then by id; %(jobs)s NULL for every job.
SELECT id, job, trigger, slot_key AS "key", slot, due_ms, requested_by, requested_at_ms, retry
FROM {requests}
WHERE %(jobs)s::text[] IS NULL OR job = ANY (%(jobs)s::text[])
ORDER BY due_ms, requested_at_ms, id;

-- name: request_done
DELETE FROM {requests} WHERE id = %(id)s
RETURNING id;

-- The registry (anarchon.registry, _registry.py): {registry} (one record per instance) and
-- {definitions} (one definitions set per digest), tables of their own made on the first write
-- (the create_ statements, under registry_lock), never by a read. Each statement is sent alone
-- in autocommit; writes answer a row (RETURNING) as every statement sent through the backend's
-- select and transaction does.

-- name: registry_lock
-- One lock per namespace: CREATE TABLE IF NOT EXISTS is not safe against itself.
SELECT pg_advisory_xact_lock(hashtextextended({registry_lock}, 0)) AS locked;

-- name: create_registry
CREATE TABLE IF NOT EXISTS {registry} (instance text PRIMARY KEY,
                                       heartbeat_ms bigint NOT NULL, record text NOT NULL);

-- name: registry_record
INSERT INTO {registry} (instance, heartbeat_ms, record)
VALUES (%(instance)s, %(heartbeat_ms)s, %(record)s)
ON CONFLICT (instance) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms,
                                     record = excluded.record
RETURNING instance;

-- name: registry_instances
SELECT record FROM {registry};

-- name: registry_exists
SELECT to_regclass(format('%%I.%%I', %(schema)s::text, %(table)s::text)) IS NOT NULL AS found;

-- name: registry_remove
DELETE FROM {registry} WHERE instance = %(instance)s RETURNING instance;

-- name: registry_remove_silent
DELETE FROM {registry} WHERE heartbeat_ms < %(cutoff_ms)s RETURNING instance;

-- name: create_definitions
CREATE TABLE IF NOT EXISTS {definitions} (digest text PRIMARY KEY,
                                          saved_ms bigint NOT NULL, data bytea NOT NULL);

-- name: save_definitions
INSERT INTO {definitions} AS t (digest, saved_ms, data)
VALUES (%(digest)s, %(saved_ms)s, %(data)s)
ON CONFLICT (digest) DO UPDATE SET saved_ms = greatest(t.saved_ms, excluded.saved_ms)
RETURNING digest;

-- name: definitions
SELECT data FROM {definitions} WHERE digest = %(digest)s;

-- name: has_definitions
SELECT 1 AS found FROM {definitions} WHERE digest = %(digest)s;

-- name: touch_definitions
UPDATE {definitions} SET saved_ms = greatest(saved_ms, %(saved_ms)s)
WHERE digest = %(digest)s
RETURNING digest;

-- name: prune_definitions
DELETE FROM {definitions} WHERE saved_ms < %(cutoff_ms)s AND NOT (digest = ANY(%(keep)s))
RETURNING digest;
