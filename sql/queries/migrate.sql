-- name: BeginMigrationStep :one
-- Run first in the transaction of each migration step: bounds how long
-- any of the step's statements waits for a lock (@lock_timeout, in
-- milliseconds), for this transaction only, so that a step waiting for a
-- lock behind a long transaction gives up before the publishers and
-- claims queued behind its own request wait long. pid is the backend
-- running the step, read inside the transaction so that it is the
-- server's even through a pooler.
SELECT set_config('lock_timeout', @lock_timeout::text, true)::text AS lock_timeout,
       pg_backend_pid()::integer AS pid;

-- name: ClearActivitySnapshot :exec
-- Drops the transaction's cached copy of pg_stat_activity, so that
-- MigrationLockHolders, run again in one long transaction, reads the
-- sessions as they are now.
SELECT pg_stat_clear_snapshot();

-- name: MigrationLockHolders :many
-- The sessions a migration step (backend @pid) waits for, while it waits:
-- pg_blocking_pids, with what pg_stat_activity says of each, the longest
-- open transaction first, and the lock the step waits for. No rows when
-- the step is not waiting. The query and state of another role's session
-- show only to roles with its privileges or pg_read_all_stats.
WITH wanted AS (
    SELECT l.mode::text AS mode,
           coalesce(l.relation::regclass::text, l.locktype)::text AS object
    FROM pg_catalog.pg_locks AS l
    WHERE l.pid = @pid::integer AND NOT l.granted
    LIMIT 1
)
SELECT a.pid::integer AS pid,
       coalesce(a.application_name, '')::text AS application_name,
       coalesce(a.usename::text, '')::text AS usename,
       coalesce(a.state, '')::text AS state,
       coalesce(date_part('epoch', clock_timestamp() - a.xact_start), 0)::float8 AS xact_seconds,
       left(coalesce(a.query, ''), 200)::text AS query,
       w.mode::text AS wanted_mode,
       w.object::text AS wanted_object
FROM wanted AS w
CROSS JOIN pg_catalog.pg_stat_activity AS a
WHERE a.pid = ANY (pg_blocking_pids(@pid::integer))
ORDER BY a.xact_start NULLS LAST, a.pid
LIMIT 10;
