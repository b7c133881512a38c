-- Every statement here ends or reschedules a delivery, so every one is
-- filtered by the lease token: a handler whose lease was reclaimed by a newer
-- claim matches nothing and learns that from the row count or RETURNING.
-- Batch forms return the ids and tokens they matched: the rows of one
-- claim share its token, and one row can be delivered twice to one
-- subscriber (a reclaim after its lease expired), so only the pair tells
-- deliveries apart.
--
-- The token is matched with IS NOT DISTINCT FROM and a token that is not
-- NULL: the same rows as "=", but a form from which the planner cannot
-- prove the lease index's predicate (acquired_token IS NOT NULL), so it
-- reads the rows by id. A held vacuum horizon keeps an entry in that index
-- for every lease written since it began, and statistics taken with a few
-- leases live make the index look a few pages long: joined against it, a
-- batch of ten ids read thousands of blocks.

-- name: DeleteWithLease :execrows
DELETE FROM /*outbox:table*/outbox AS o
WHERE o.id = @id
  AND o.acquired_token IS NOT DISTINCT FROM @token::uuid AND @token::uuid IS NOT NULL;

-- name: DeleteBatchWithLease :many
-- Returns the leases it deleted; one missing from the result was lost.
DELETE FROM /*outbox:table*/outbox AS o
USING (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token) AS l
WHERE o.id = l.id
  AND o.acquired_token IS NOT DISTINCT FROM l.token AND l.token IS NOT NULL
RETURNING o.id, o.acquired_token AS token;

-- name: MarkPendingWithLease :execrows
-- Records a handled attempt and its error, and makes the row claimable
-- again after @delay_seconds, measured on the server clock. The attempt
-- count saturates at the integer maximum, and a negative one (written by
-- another client) starts again from zero.
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    lease_expires_at = NULL,
    next_attempt_at  = now() + make_interval(secs => @delay_seconds::float8),
    attempts_count   = least(greatest(o.attempts_count, 0)::bigint + 1, 2147483647)::integer,
    first_attempt_at = coalesce(o.first_attempt_at, now()),
    last_attempt_at  = now(),
    last_error       = sqlc.narg(last_error)::text
WHERE o.id = @id
  AND o.acquired_token IS NOT DISTINCT FROM @token::uuid AND @token::uuid IS NOT NULL;

-- name: MarkPendingBatchWithLease :many
-- The batch form of MarkPendingWithLease: one delay and error per row.
-- Returns the leases it ended; one missing from the result was lost.
WITH l AS (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token,
           unnest(@delay_seconds::float8[]) AS delay_seconds,
           unnest(@last_errors::text[]) AS last_error
)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    lease_expires_at = NULL,
    next_attempt_at  = now() + make_interval(secs => l.delay_seconds),
    attempts_count   = least(greatest(o.attempts_count, 0)::bigint + 1, 2147483647)::integer,
    first_attempt_at = coalesce(o.first_attempt_at, now()),
    last_attempt_at  = now(),
    last_error       = l.last_error
FROM l
WHERE o.id = l.id
  AND o.acquired_token IS NOT DISTINCT FROM l.token AND l.token IS NOT NULL
RETURNING l.id::bigint AS id, l.token::uuid AS token;

-- name: ExtendLeases :many
-- Heartbeat: moves the expiry of every row still held with its token to
-- @lease_ttl_seconds from now. Returns the leases it extended; one missing
-- from the result was lost.
UPDATE /*outbox:table*/outbox AS o
SET lease_expires_at = now() + make_interval(secs => @lease_ttl_seconds::float8)
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token) AS l
WHERE o.id = l.id
  AND o.acquired_token IS NOT DISTINCT FROM l.token AND l.token IS NOT NULL
RETURNING o.id, o.acquired_token AS token;

-- name: ReleaseBatchWithLease :many
-- Hands back rows that were claimed but never given to a handler (the
-- subscriber is stopping, or a record of a claim by lock names them: see
-- RecordedAmong): clears their lease and takes back the delivery the
-- claim counted, so other claims take them as soon as nothing holds
-- them, instead of after the lease expires. Returns the leases it
-- released.
WITH l AS (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::uuid[]) AS token)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = NULL,
    acquired_at      = NULL,
    lease_expires_at = NULL,
    deliveries_count = greatest(o.deliveries_count - 1, 0)
FROM l
WHERE o.id = l.id
  AND o.acquired_token IS NOT DISTINCT FROM l.token AND l.token IS NOT NULL
RETURNING l.id::bigint AS id, l.token::uuid AS token;

-- name: IdleInTransactionTimeout :one
-- The session's idle_in_transaction_session_timeout in milliseconds (0:
-- none), as its role's and database's settings give it.
SELECT setting::bigint AS timeout_ms
FROM pg_catalog.pg_settings
WHERE name = 'idle_in_transaction_session_timeout';

-- name: LiftIdleInTransactionTimeout :exec
-- Sets this transaction's idle_in_transaction_session_timeout to
-- @timeout_ms: a transactional handler's transaction, which the
-- subscriber ends within its lease, may idle while its handler works.
SELECT set_config('idle_in_transaction_session_timeout', (@timeout_ms::bigint)::text, true);
