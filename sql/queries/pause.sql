-- Queue pause and resume (schema 14): a row of <table>_pauses pauses its
-- queue; every claim passes a paused queue by (claim.sql, locked.sql,
-- ring.sql).

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
