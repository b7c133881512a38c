-- name: GetRow :one
-- One outbox row by id, in whatever state: what an operator looks up.
-- Timestamps are read within the years 1 to 9999, as Claim reads
-- created_at; a missing one reads as the year 1 (greatest ignores NULL),
-- which is Go's zero time.
SELECT o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
       o.attempts_count, o.deliveries_count, o.blocked, o.last_error,
       (o.acquired_token IS NOT NULL)::boolean AS leased,
       least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
       least(greatest(o.first_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS first_attempt_at,
       least(greatest(o.last_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS last_attempt_at,
       least(greatest(o.acquired_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS acquired_at,
       least(greatest(o.lease_expires_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS lease_expires_at,
       now()::timestamptz AS read_at
FROM /*outbox:table*/outbox AS o
WHERE o.id = @id::bigint;

-- name: GetRowIDByTimer :one
-- The id of the live row of @queue published with @timer_id, through the
-- timer index.
SELECT o.id
FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text AND o.timer_id = @timer_id::text;
