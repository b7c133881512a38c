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

-- name: RetryRowNow :one
-- An operator's "retry now": makes row @id due now when no subscriber
-- holds it, it is not behind its key's head, and it is due later
-- (delayed, or waiting for its retry); wakes its queue's sleeping
-- subscribers. Returns whether it changed the row.
WITH due AS (
    UPDATE /*outbox:table*/outbox AS o
    SET next_attempt_at = now()
    WHERE o.id = @id::bigint AND o.acquired_token IS NULL AND NOT o.blocked AND o.next_attempt_at > now()
    RETURNING o.queue
)
SELECT count(pg_notify(/*outbox:channel*/'outbox_outbox', d.queue)) > 0 AS retried FROM due AS d;

-- name: CancelRow :one
-- An operator's "cancel": deletes row @id when no subscriber holds it; a
-- keyed row's key hands on to its next row as a handled row's does (the
-- key triggers). Returns whether it deleted the row, and its queue.
WITH gone AS (
    DELETE FROM /*outbox:table*/outbox AS o
    WHERE o.id = @id::bigint AND o.acquired_token IS NULL
    RETURNING o.queue
)
SELECT (count(*) > 0)::boolean AS cancelled, coalesce(max(g.queue), '')::text AS queue FROM gone AS g;

-- name: DeadLetterRow :one
-- An operator's "move to the dead letters": moves row @id, when no
-- subscriber holds it, into the dead-letter table in one statement, with
-- reason rejected and @note as its last error (the last handler error
-- kept after it), as DeadLetterWithLease moves a row whose handler
-- rejected it. Returns whether it moved the row.
WITH d AS (
    DELETE FROM /*outbox:table*/outbox AS o
    WHERE o.id = @id::bigint AND o.acquired_token IS NULL
    RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
              o.deliveries_count, o.attempts_count, o.created_at, o.last_error
), moved AS (
    INSERT INTO /*outbox:table*/outbox_dlq AS x (
        id, queue, payload, headers, ordering_key, timer_id,
        deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error
    )
    SELECT d.id, d.queue, d.payload, d.headers, d.ordering_key, d.timer_id, d.deliveries_count, d.attempts_count, d.created_at,
           now(), 'rejected', left(concat_ws('; last handler error: ', @note::text, d.last_error), 2048)
    FROM d
    RETURNING 1
)
SELECT (count(*) > 0)::boolean AS moved FROM moved;

-- name: Rows :many
-- A page of the outbox table's rows for Outbox.Rows, after the cursor
-- (@after_at, @after_id), or before it when @newest:
--   - @mode 'pending': @queue's rows no subscriber holds and not behind
--     their key's head, due now (@due) or later, in due order, through the
--     pending index (rows due at -infinity or infinity are left out: a
--     page's cursor holds a finite time);
--   - 'leased': @queue's rows a subscriber holds, with a live lease or
--     (@expired) one past its expiry, in lease-expiry order, through the
--     lease-expiry index;
--   - 'key': the rows of ordering key @key of @queue in every state, in
--     the key's order (id), through the ordering index.
-- Each branch is one index range that stops after @scan_rows entries; the
-- others' one-time filters keep them from running. Of the entries it
-- read (with the heap's message type and creation time), those matching
-- the filters (message-type header @message_type;
-- created at least @older_than_seconds ago, or within
-- @newer_than_seconds; each unset when empty or 0; with @retrying, only
-- rows an attempt of which failed) are the page, at most
-- @max_rows, in the order read; the last entry read follows them as the
-- edge, from which a page the filters left short goes on. The rows are
-- then read by id.
WITH scanned AS (
    (SELECT o.id, o.next_attempt_at AS k, row_number() OVER (ORDER BY o.next_attempt_at, o.id) AS pos,
            o.headers ->> 'message-type' AS message_type, o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'pending' AND NOT @newest::boolean AND o.queue = @queue::text AND o.acquired_token IS NULL AND NOT o.blocked
       AND o.next_attempt_at < CASE WHEN @due::boolean THEN now() + interval '1 microsecond' ELSE 'infinity'::timestamptz END
       AND o.next_attempt_at > CASE WHEN @due::boolean THEN '-infinity'::timestamptz ELSE now() END
       AND (o.next_attempt_at, o.id) > (@after_at::timestamptz, @after_id::bigint)
     ORDER BY o.next_attempt_at, o.id
     LIMIT @scan_rows::integer)
    UNION ALL
    (SELECT o.id, o.next_attempt_at, row_number() OVER (ORDER BY o.next_attempt_at DESC, o.id DESC),
            o.headers ->> 'message-type', o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'pending' AND @newest::boolean AND o.queue = @queue::text AND o.acquired_token IS NULL AND NOT o.blocked
       AND o.next_attempt_at < CASE WHEN @due::boolean THEN now() + interval '1 microsecond' ELSE 'infinity'::timestamptz END
       AND o.next_attempt_at > CASE WHEN @due::boolean THEN '-infinity'::timestamptz ELSE now() END
       AND (o.next_attempt_at, o.id) < (@after_at::timestamptz, @after_id::bigint)
     ORDER BY o.next_attempt_at DESC, o.id DESC
     LIMIT @scan_rows::integer)
    UNION ALL
    (SELECT o.id, o.lease_expires_at, row_number() OVER (ORDER BY o.lease_expires_at, o.id),
            o.headers ->> 'message-type', o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'leased' AND NOT @newest::boolean AND o.queue = @queue::text AND o.acquired_token IS NOT NULL
       AND o.lease_expires_at < CASE WHEN @expired::boolean THEN now() ELSE 'infinity'::timestamptz END
       AND o.lease_expires_at >= CASE WHEN @expired::boolean THEN '-infinity'::timestamptz ELSE now() END
       AND (o.lease_expires_at, o.id) > (@after_at::timestamptz, @after_id::bigint)
     ORDER BY o.lease_expires_at, o.id
     LIMIT @scan_rows::integer)
    UNION ALL
    (SELECT o.id, o.lease_expires_at, row_number() OVER (ORDER BY o.lease_expires_at DESC, o.id DESC),
            o.headers ->> 'message-type', o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'leased' AND @newest::boolean AND o.queue = @queue::text AND o.acquired_token IS NOT NULL
       AND o.lease_expires_at < CASE WHEN @expired::boolean THEN now() ELSE 'infinity'::timestamptz END
       AND o.lease_expires_at >= CASE WHEN @expired::boolean THEN '-infinity'::timestamptz ELSE now() END
       AND (o.lease_expires_at, o.id) < (@after_at::timestamptz, @after_id::bigint)
     ORDER BY o.lease_expires_at DESC, o.id DESC
     LIMIT @scan_rows::integer)
    UNION ALL
    (SELECT o.id, '-infinity'::timestamptz, row_number() OVER (ORDER BY o.ordering_key, o.id),
            o.headers ->> 'message-type', o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'key' AND NOT @newest::boolean AND o.queue = @queue::text AND o.ordering_key = @key::text
       AND o.id > @after_id::bigint
     ORDER BY o.ordering_key, o.id
     LIMIT @scan_rows::integer)
    UNION ALL
    (SELECT o.id, '-infinity'::timestamptz, row_number() OVER (ORDER BY o.ordering_key DESC, o.id DESC),
            o.headers ->> 'message-type', o.created_at, o.attempts_count
     FROM /*outbox:table*/outbox AS o
     WHERE @mode::text = 'key' AND @newest::boolean AND o.queue = @queue::text AND o.ordering_key = @key::text
       AND o.id < @after_id::bigint
     ORDER BY o.ordering_key DESC, o.id DESC
     LIMIT @scan_rows::integer)
), page AS (
    (SELECT s.id, s.pos, false AS edge FROM scanned AS s
     WHERE (@message_type::text = '' OR s.message_type = @message_type::text)
       AND (@older_than_seconds::float8 = 0 OR s.created_at <= now() - make_interval(secs => @older_than_seconds::float8))
       AND (@newer_than_seconds::float8 = 0 OR s.created_at > now() - make_interval(secs => @newer_than_seconds::float8))
       AND (NOT @retrying::boolean OR s.attempts_count > 0)
     ORDER BY s.pos
     LIMIT @max_rows::integer)
    UNION ALL
    (SELECT s.id, s.pos, true FROM scanned AS s ORDER BY s.pos DESC LIMIT 1)
)
SELECT o.id, o.queue, o.ordering_key, o.timer_id, o.attempts_count, o.deliveries_count, o.blocked,
       (o.acquired_token IS NOT NULL)::boolean AS leased,
       least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
       least(greatest(o.lease_expires_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS lease_expires_at,
       coalesce(left(o.last_error, 200), '')::text AS last_error,
       coalesce(o.headers ->> 'message-type', '')::text AS message_type, now()::timestamptz AS read_at,
       p.edge::boolean AS edge, p.pos::bigint AS pos
FROM page AS p
JOIN /*outbox:table*/outbox AS o ON o.id = p.id
ORDER BY p.edge, p.pos;
