-- name: DeadLetterWithLease :execrows
-- Moves a leased row to the dead-letter table in one statement: the row
-- leaves the outbox only if the dead-letter insert succeeds. @attempted says
-- whether the handler ran (and so counts as an attempt); @last_error is cut
-- to 2048 characters.
WITH d AS (
    DELETE FROM /*outbox:table*/outbox AS o
    WHERE o.id = @id AND o.acquired_token = @token::uuid
    RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
              o.deliveries_count, o.attempts_count, o.created_at
)
INSERT INTO /*outbox:table*/outbox_dlq AS x (
    id, queue, payload, headers, ordering_key, timer_id,
    deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error
)
SELECT d.id, d.queue, d.payload, d.headers, d.ordering_key, d.timer_id,
       d.deliveries_count, d.attempts_count + (@attempted::boolean)::integer, d.created_at,
       now(), @reason::text, left(sqlc.narg(last_error)::text, 2048)
FROM d;
