-- name: Publish :one
-- Inserts one row through the caller's connection or transaction. The row is
-- due at the later of now() + @delay_seconds and @not_before (on the server
-- clock; a past or null @not_before means now).
INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, timer_id, next_attempt_at)
VALUES (
    @queue::text, @payload::bytea, convert_from(sqlc.narg(headers)::bytea, 'UTF8')::jsonb, sqlc.narg(ordering_key)::text, sqlc.narg(timer_id)::text,
    greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
)
RETURNING o.id;

-- name: PublishBatch :many
-- Inserts one row per payload into @queue in one statement and returns
-- their ids in input order. Headers, ordering key and schedule are shared by
-- every row: the headers are sent and parsed once per batch, not per row.
-- A function scan of unnest yields the array in order and, with no join or
-- sort in between, rows are inserted (and draw identity values) in that
-- order; the publisher's tests check it on 10,000 rows. With an ordering
-- key the rows arrive blocked: the key's insert trigger decides the first
-- and remembers the key, the rest skip it (schema 10), and the statement
-- trigger checks what they claimed (schema 11).
INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, next_attempt_at, blocked)
SELECT @queue::text, p.payload, convert_from(sqlc.narg(headers)::bytea, 'UTF8')::jsonb, sqlc.narg(ordering_key)::text,
       greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now())),
       sqlc.narg(ordering_key)::text IS NOT NULL
FROM unnest(@payloads::bytea[]) AS p(payload)
RETURNING o.id;

-- name: PublishCopy :copyfrom
-- Streams rows with COPY; due now, ids not returned.
INSERT INTO outbox (queue, payload, headers, ordering_key)
VALUES (@queue, @payload, @headers, @ordering_key);

-- name: CancelTimer :execrows
-- Deletes a scheduled row by its timer id unless a subscriber holds it.
DELETE FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text AND o.timer_id = @timer_id::text AND o.acquired_token IS NULL;

-- name: PublishTimer :one
-- Publish for a row with a timer id: while a row of the queue holds the same
-- timer id, it inserts nothing and returns no row, leaving the caller's
-- transaction usable (a unique violation would abort it).
INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, timer_id, next_attempt_at)
VALUES (
    @queue::text, @payload::bytea, convert_from(sqlc.narg(headers)::bytea, 'UTF8')::jsonb, sqlc.narg(ordering_key)::text, @timer_id::text,
    greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
)
ON CONFLICT (queue, timer_id) WHERE timer_id IS NOT NULL DO NOTHING
RETURNING o.id;

-- name: PublishRing :one
-- Publish into the log tier's ring (PublisherConfig.Tier = TierRing): the
-- ring's defaults fill txid, slot and lane, its key trigger draws a keyed
-- row's id under the key's lock, and its headers are json, checked by the
-- cast to the outbox table's jsonb that the ring's constraint makes.
INSERT INTO /*outbox:table*/outbox_ring AS r (queue, payload, headers, ordering_key, next_attempt_at)
VALUES (
    @queue::text, @payload::bytea, convert_from(sqlc.narg(headers)::bytea, 'UTF8')::json, sqlc.narg(ordering_key)::text,
    greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
)
RETURNING r.id;

-- name: PublishRingBatch :many
-- PublishBatch into the log tier's ring: one row per payload, in the
-- array's order (as PublishBatch), sharing headers, ordering key and
-- schedule.
INSERT INTO /*outbox:table*/outbox_ring AS r (queue, payload, headers, ordering_key, next_attempt_at)
SELECT @queue::text, p.payload, convert_from(sqlc.narg(headers)::bytea, 'UTF8')::json, sqlc.narg(ordering_key)::text,
       greatest(now() + make_interval(secs => @delay_seconds::float8), coalesce(sqlc.narg(not_before)::timestamptz, now()))
FROM unnest(@payloads::bytea[]) AS p(payload)
RETURNING r.id;
