-- What operators need (schema 14): queue pause and resume (a row of
-- <table>_pauses pauses its queue; every claim passes a paused queue by,
-- see claim.sql, locked.sql, ring.sql), and the running subscribers'
-- presence records (<table>_subscribers).

-- name: PauseQueue :one
-- Pauses @queue with @reason, unless it is paused already (then its
-- pause is kept as it was), and returns the queue's pause.
WITH added AS (
    INSERT INTO /*outbox:table*/outbox_pauses (queue, reason)
    VALUES (@queue::text, @reason::text)
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue, paused_at, paused_by, reason
)
SELECT a.queue, a.paused_at, a.paused_by, a.reason FROM added AS a
UNION ALL
SELECT p.queue, p.paused_at, p.paused_by, p.reason FROM /*outbox:table*/outbox_pauses AS p
WHERE p.queue = @queue::text AND NOT EXISTS (SELECT FROM added);

-- name: ResumeQueue :execrows
-- Resumes @queue (0 rows: it was not paused), and wakes its sleeping
-- subscribers, which claim it at once.
WITH resumed AS (
    DELETE FROM /*outbox:table*/outbox_pauses AS p WHERE p.queue = @queue::text RETURNING p.queue
)
SELECT pg_notify(/*outbox:channel*/'outbox_outbox', r.queue) FROM resumed AS r;

-- name: PausedQueues :many
-- Every paused queue, in name order.
SELECT p.queue, p.paused_at, p.paused_by, p.reason FROM /*outbox:table*/outbox_pauses AS p ORDER BY p.queue;

-- name: Present :exec
-- Writes the presence record of running subscriber @id, and deletes the
-- records of subscribers gone for an hour (stopped without deleting
-- theirs). The table holds a row per subscriber: read whole.
WITH pruned AS (
    DELETE FROM /*outbox:table*/outbox_subscribers AS g
    WHERE g.seen_at < now() - interval '1 hour' AND g.id <> @id::uuid
)
INSERT INTO /*outbox:table*/outbox_subscribers AS s
    (id, name, host, pid, queues, workers, busy, in_flight, claim_path, state, state_since, last_claim_at, every_seconds)
VALUES (@id::uuid, @name::text, @host::text, @pid::integer, @queues::text[], @workers::integer, @busy::integer,
        @in_flight::integer, @claim_path::text, @state::text, @state_since::timestamptz,
        sqlc.narg(last_claim_at)::timestamptz, @every_seconds::float8)
ON CONFLICT (id) DO UPDATE
SET busy = excluded.busy, in_flight = excluded.in_flight, state = excluded.state, state_since = excluded.state_since,
    last_claim_at = excluded.last_claim_at, seen_at = now();

-- name: Absent :exec
-- Deletes the presence record of subscriber @id, which stopped.
DELETE FROM /*outbox:table*/outbox_subscribers AS s WHERE s.id = @id::uuid;

-- name: Subscribers :many
-- Every subscriber's presence record, by name, host and pid, and whether
-- it is gone: not written for three of its intervals.
SELECT s.id, s.name, s.host, s.pid, s.queues, s.workers, s.busy, s.in_flight, s.claim_path, s.state, s.state_since,
       s.last_claim_at, s.started_at, s.seen_at,
       (s.seen_at < now() - make_interval(secs => 3 * s.every_seconds))::boolean AS gone,
       extract(epoch FROM now() - s.seen_at)::float8 AS seen_seconds_ago
FROM /*outbox:table*/outbox_subscribers AS s
ORDER BY s.name, s.host, s.pid, s.started_at;
