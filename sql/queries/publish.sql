-- name: Publish :one
-- Inserts one row through the caller's connection or transaction. The row is
-- due at the later of now() + @delay_seconds and @not_before (both on the
-- server clock when @not_before is null).
INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, timer_id, next_attempt_at)
VALUES (
    @queue::text, @payload::bytea, sqlc.narg(headers)::jsonb, sqlc.narg(ordering_key)::text, sqlc.narg(timer_id)::text,
    greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
)
RETURNING o.id;

-- name: PublishBatch :many
-- Inserts many rows in one statement and returns their ids in input order.
INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, next_attempt_at)
SELECT b.queue, b.payload, b.headers, b.ordering_key,
       greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
FROM (
    SELECT unnest(@queues::text[]) AS queue, unnest(@payloads::bytea[]) AS payload,
           unnest(@headers::jsonb[]) AS headers, unnest(@ordering_keys::text[]) AS ordering_key,
           generate_subscripts(@queues::text[], 1) AS n
) AS b
ORDER BY b.n
RETURNING o.id;

-- name: PublishCopy :copyfrom
-- Streams rows with COPY; due now, ids not returned.
INSERT INTO outbox (queue, payload, headers, ordering_key)
VALUES (@queue, @payload, @headers, @ordering_key);

-- name: CancelTimer :execrows
-- Deletes a scheduled row by its timer id unless a subscriber holds it.
DELETE FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text AND o.timer_id = @timer_id::text AND o.acquired_token IS NULL;
