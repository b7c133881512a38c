-- name: FetchUnprocessed :many
-- A lease-free peek at the rows of a queue, oldest first. It takes no locks
-- and changes nothing. next_attempt_at is read within the years 1 to 9999,
-- as Claim reads created_at.
SELECT o.id, o.queue, o.payload, o.headers, o.deliveries_count,
       least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
       o.acquired_token
FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text
ORDER BY o.id
LIMIT @max_rows::integer;

-- name: QueueStats :many
-- Per queue: rows ready now, scheduled for later, blocked behind their
-- key's head, leased, leased past their expiry, the age of the oldest row
-- in seconds, the dead-lettered count, and the keys whose head holds rows
-- back while it waits for its retry or its scheduled time, with the key
-- that has held its rows back longest, and the keys whose hand-over to
-- their next row is recorded and not yet completed. Ages are measured
-- with epochs, which are infinite for infinite timestamps (where
-- subtracting the timestamps fails), and a row created in the future has
-- age 0.
WITH live AS (
    SELECT o.queue,
           count(*) FILTER (WHERE o.acquired_token IS NULL AND NOT o.blocked AND o.next_attempt_at <= now()) AS ready,
           count(*) FILTER (WHERE o.acquired_token IS NULL AND NOT o.blocked AND o.next_attempt_at > now()) AS scheduled,
           count(*) FILTER (WHERE o.blocked) AS blocked,
           count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at >= now()) AS leased,
           count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at < now()) AS expired,
           min(o.created_at) AS oldest_created_at
    FROM /*outbox:table*/outbox AS o
    GROUP BY o.queue
), waiting_heads AS (
    SELECT h.queue, h.ordering_key, h.attempts_count > 0 AS retrying, w.created_at AS waiting_since
    FROM /*outbox:table*/outbox AS h
    CROSS JOIN LATERAL (
        SELECT b.created_at
        FROM /*outbox:table*/outbox AS b
        WHERE b.queue = h.queue AND b.ordering_key = h.ordering_key AND b.blocked
        ORDER BY b.id
        LIMIT 1
    ) AS w
    WHERE h.ordering_key IS NOT NULL AND NOT h.blocked
      AND h.acquired_token IS NULL AND h.next_attempt_at > now()
), held AS (
    SELECT wh.queue,
           count(*) FILTER (WHERE wh.retrying) AS keys_retrying,
           count(*) FILTER (WHERE NOT wh.retrying) AS keys_scheduled,
           (array_agg(wh.ordering_key ORDER BY wh.waiting_since, wh.ordering_key))[1] AS oldest_key,
           min(wh.waiting_since) AS oldest_since
    FROM waiting_heads AS wh
    GROUP BY wh.queue
), handing AS (
    SELECT h.queue, count(DISTINCT h.ordering_key) AS hand_offs
    FROM /*outbox:table*/outbox_handoff AS h
    GROUP BY h.queue
), dead AS (
    SELECT x.queue, count(*) AS dead_lettered
    FROM /*outbox:table*/outbox_dlq AS x
    GROUP BY x.queue
)
SELECT coalesce(l.queue, d.queue)::text AS queue,
       coalesce(l.ready, 0)::bigint AS ready,
       coalesce(l.scheduled, 0)::bigint AS scheduled,
       coalesce(l.blocked, 0)::bigint AS blocked,
       coalesce(l.leased, 0)::bigint AS leased,
       coalesce(l.expired, 0)::bigint AS expired,
       coalesce(greatest(extract(epoch FROM now()) - extract(epoch FROM l.oldest_created_at), 0), 0)::float8 AS oldest_age_seconds,
       coalesce(d.dead_lettered, 0)::bigint AS dead_lettered,
       coalesce(k.keys_retrying, 0)::bigint AS held_keys_retrying,
       coalesce(k.keys_scheduled, 0)::bigint AS held_keys_scheduled,
       coalesce(k.oldest_key, '')::text AS oldest_held_key,
       coalesce(greatest(extract(epoch FROM now()) - extract(epoch FROM k.oldest_since), 0), 0)::float8 AS oldest_held_age_seconds,
       coalesce(ho.hand_offs, 0)::bigint AS hand_offs
FROM live AS l
FULL JOIN dead AS d ON d.queue = l.queue
LEFT JOIN held AS k ON k.queue = l.queue
LEFT JOIN handing AS ho ON ho.queue = l.queue
ORDER BY 1;

-- name: NextDueIn :one
-- Seconds, on the server's clock, until the earliest next_attempt_at among
-- unleased rows of the given queues that came due less than
-- @since_claim_seconds ago or are still to come (negative when one came
-- due since); no row when there is none. @since_claim_seconds is the time
-- since the caller sent its last claim: rows due before that claim and not
-- taken by it are left out, since another transaction holds their locks
-- and waking for them would only spin, while a row that came due after it
-- (a retry landing as the caller falls asleep) is claimed at once. Rows
-- due at infinity are never due. One index probe per queue: the bound is
-- on now(), the statement's start, since a volatile clock_timestamp()
-- there would make it a filter, and the probe would read every entry
-- from the queue's start (under a snapshot held open anywhere in the
-- cluster, every row deleted since it was taken). Paused queues are left
-- out: no claim takes their rows.
SELECT extract(epoch FROM n.next_attempt_at - clock_timestamp())::float8 AS due_in_seconds
FROM unnest(@queues::text[]) AS q(name)
CROSS JOIN LATERAL (
    SELECT o.next_attempt_at
    FROM /*outbox:table*/outbox AS o
    WHERE o.queue = q.name AND o.acquired_token IS NULL AND NOT o.blocked
      AND o.next_attempt_at > now() - make_interval(secs => @since_claim_seconds::float8)
      AND o.next_attempt_at < 'infinity'
    ORDER BY o.next_attempt_at
    LIMIT 1
) AS n
WHERE NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = q.name)
ORDER BY n.next_attempt_at
LIMIT 1;

-- name: RetryBacklog :one
-- Over the given queues: rows that were handled at least once and are not
-- finished (waiting for their retry, due for it, or leased again), and
-- seconds on the server's clock until the earliest of them is due: a leased
-- one counts as due now (0), an overdue one is negative, and 0 when there is
-- none. Infinite next_attempt_at gives an infinite answer.
SELECT count(*)::bigint AS retrying,
       coalesce(extract(epoch FROM min(CASE WHEN o.acquired_token IS NULL THEN o.next_attempt_at
                                            ELSE statement_timestamp() END))
                - extract(epoch FROM statement_timestamp()), 0)::float8 AS next_due_in_seconds
FROM /*outbox:table*/outbox AS o
WHERE o.queue = ANY(@queues::text[]) AND o.attempts_count > 0;

-- name: ListOutboxes :many
-- Every table in the database that has an outbox's shape (columns every
-- schema version has and no other table of an outbox has), by schema and
-- name: what an operator who named the wrong outbox may have meant. Each
-- column is one probe of pg_attribute's (attrelid, attname) index.
SELECT n.nspname::text AS schema_name, c.relname::text AS table_name
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'acquired_token' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'next_attempt_at' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'deliveries_count' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'queue' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'payload' AND NOT a.attisdropped)
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'headers' AND NOT a.attisdropped)
ORDER BY 1, 2;

-- name: DisableJIT :exec
-- Turns JIT compilation off for the calling transaction: the catalog's
-- cost estimates in a database of many tables pass jit_above_cost, and
-- compiling ListOutboxes takes longer (a second and more) than running it.
SELECT set_config('jit', 'off', true);

-- name: CountRows :one
-- How many rows the outbox holds, in every state.
SELECT count(*)::bigint AS total FROM /*outbox:table*/outbox AS o;
