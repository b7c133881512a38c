-- Every statement here ends or reschedules a delivery, so every one is
-- filtered by the lease token: a handler whose lease was reclaimed by a newer
-- claim matches nothing and learns that from the row count or RETURNING.

-- name: DeleteWithLease :execrows
DELETE FROM /*outbox:table*/outbox AS o
WHERE o.id = @id AND o.acquired_token = @token::uuid;

-- name: DeleteBatchWithLease :many
-- Returns the ids it deleted; an id missing from the result lost its lease.
DELETE FROM /*outbox:table*/outbox AS o
USING (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token) AS l
WHERE o.id = l.id AND o.acquired_token = l.token
RETURNING o.id;

-- name: MarkPendingWithLease :execrows
-- Records a handled attempt and makes the row claimable again after
-- @delay_seconds, measured on the server clock.
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    next_attempt_at  = now() + make_interval(secs => @delay_seconds::float8),
    attempts_count   = o.attempts_count + 1,
    first_attempt_at = coalesce(o.first_attempt_at, now()),
    last_attempt_at  = now()
WHERE o.id = @id AND o.acquired_token = @token::uuid;

-- name: MarkPendingBatchWithLease :many
-- The batch form of MarkPendingWithLease: one delay per row. Returns the ids
-- it updated; an id missing from the result lost its lease.
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    next_attempt_at  = now() + make_interval(secs => l.delay_seconds),
    attempts_count   = o.attempts_count + 1,
    first_attempt_at = coalesce(o.first_attempt_at, now()),
    last_attempt_at  = now()
FROM (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token,
           unnest(@delay_seconds::float8[]) AS delay_seconds
) AS l
WHERE o.id = l.id AND o.acquired_token = l.token
RETURNING o.id;

-- name: ExtendLeases :many
-- Heartbeat: restarts the lease of every row still held with its token.
-- Returns the ids it extended; an id missing from the result lost its lease.
UPDATE /*outbox:table*/outbox AS o
SET acquired_at = now()
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token) AS l
WHERE o.id = l.id AND o.acquired_token = l.token
RETURNING o.id;

-- name: ReleaseBatchWithLease :many
-- Hands back rows that were claimed but never given to a handler (the
-- subscriber is stopping): clears their lease and takes back the delivery
-- the claim counted, so other subscribers take them at once instead of
-- after the lease expires. Returns the ids it released.
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    deliveries_count = greatest(o.deliveries_count - 1, 0)
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token) AS l
WHERE o.id = l.id AND o.acquired_token = l.token
RETURNING o.id;
