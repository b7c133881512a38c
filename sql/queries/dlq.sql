-- name: DeadLetterWithLease :execrows
-- Moves a leased row to the dead-letter table in one statement: the row
-- leaves the outbox only if the dead-letter insert succeeds. @attempted says
-- whether the handler ran (and so counts as an attempt); when it did not
-- (max_deliveries, decode_error), the last handler error the row recorded
-- is kept after @last_error. The text is cut to 2048 characters. The
-- attempt count saturates as MarkPendingWithLease's does.
WITH d AS (
    DELETE FROM /*outbox:table*/outbox AS o
    WHERE o.id = @id
      -- Matched as lease.sql's statements match it, by id only.
      AND o.acquired_token IS NOT DISTINCT FROM @token::uuid AND @token::uuid IS NOT NULL
    RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
              o.deliveries_count, o.attempts_count, o.created_at, o.last_error
)
INSERT INTO /*outbox:table*/outbox_dlq AS x (
    id, queue, payload, headers, ordering_key, timer_id,
    deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error
)
SELECT d.id, d.queue, d.payload, d.headers, d.ordering_key, d.timer_id,
       d.deliveries_count, least(greatest(d.attempts_count, 0)::bigint + (@attempted::boolean)::integer, 2147483647)::integer, d.created_at,
       now(), @reason::text,
       left(CASE WHEN @attempted::boolean OR d.last_error IS NULL THEN sqlc.narg(last_error)::text
                 ELSE concat_ws('; last handler error: ', sqlc.narg(last_error)::text, d.last_error) END,
            2048)
FROM d;

-- name: ListDeadLetters :many
-- Dead-lettered rows matching the optional filters (a queue, a reason, a
-- cause as DeadLetterCauses writes it, an age, a set of ids) with ids above
-- @after_id, in id order. An @older_than_seconds of 0 selects rows of
-- every age, also one whose failed_at another client wrote in the future;
-- the statements below filter the same way. Timestamps are read within
-- the years 1 to 9999, as Claim reads created_at (which is copied from
-- the outbox row, and any client may have written it). The cause is
-- tested in a scalar subquery, here and below: the planner then takes it
-- for a filter it knows nothing of (half the rows), not for an equality
-- it guesses rare, and walks the primary key in id order to the rows a
-- page or a batch needs, where it would read and sort every row of the
-- queue.
SELECT x.id, x.queue, x.payload, octet_length(x.payload)::bigint AS payload_size, x.headers, x.ordering_key, x.timer_id,
       x.deliveries_count, x.attempts_count,
       least(greatest(x.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       least(greatest(x.failed_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS failed_at,
       x.failure_reason, x.last_error
FROM /*outbox:table*/outbox_dlq AS x
WHERE (sqlc.narg(queue)::text IS NULL OR x.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(reason)::text IS NULL OR x.failure_reason = sqlc.narg(reason)::text)
  AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(x.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
  AND (sqlc.narg(ids)::bigint[] IS NULL OR x.id = ANY(sqlc.narg(ids)::bigint[]))
  AND (@older_than_seconds::float8 = 0 OR x.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
  AND x.id > @after_id::bigint
ORDER BY x.id
LIMIT @max_rows::integer;

-- name: ReplayDeadLetters :many
-- Moves up to @max_rows matching dead-lettered rows with ids in
-- (@after_id, @up_to_id] back into the outbox in one statement: a row is in
-- exactly one of the two tables whatever happens. Replayed rows get a new
-- id and start again from zero attempts, with their original payload,
-- headers, ordering key and timer id; headers that are an object (or
-- none) gain @header_replayed_from, the dead letter's id, and
-- @header_first_failed_at, its failed_at in RFC 3339 UTC, unless a header
-- of that name already carries an earlier replay's. A row whose timer id is live in the
-- outbox (or taken by a lower id of the same batch) conflicts: it stays in
-- the dead-letter table, or with @drop_timer_ids is replayed without its
-- timer id. A publisher that commits the same timer id while the statement
-- runs makes it fail with a unique violation, moving nothing; run again, it
-- sees that row as a conflict. Returns every row the batch looked at, in id
-- order, with whether it conflicted and whether it moved.
WITH locked AS MATERIALIZED (
    SELECT y.id, y.queue, y.timer_id
    FROM /*outbox:table*/outbox_dlq AS y
    WHERE (sqlc.narg(queue)::text IS NULL OR y.queue = sqlc.narg(queue)::text)
      AND (sqlc.narg(reason)::text IS NULL OR y.failure_reason = sqlc.narg(reason)::text)
      AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(y.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
      AND (sqlc.narg(ids)::bigint[] IS NULL OR y.id = ANY(sqlc.narg(ids)::bigint[]))
      AND (@older_than_seconds::float8 = 0 OR y.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
      AND y.id > @after_id::bigint
      AND y.id <= @up_to_id::bigint
    ORDER BY y.id
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
), picked AS MATERIALIZED (
    SELECT l.id, l.queue, l.timer_id,
           l.timer_id IS NOT NULL AND (
               row_number() OVER (PARTITION BY l.queue, l.timer_id ORDER BY l.id) > 1
               OR EXISTS (
                   SELECT FROM /*outbox:table*/outbox AS o
                   WHERE o.queue = l.queue AND o.timer_id = l.timer_id COLLATE "C"
               )
           ) AS conflict
    FROM locked AS l
), moved AS (
    DELETE FROM /*outbox:table*/outbox_dlq AS x
    USING picked AS p
    WHERE x.id = p.id AND (NOT p.conflict OR @drop_timer_ids::boolean)
    RETURNING x.id, x.queue, x.payload,
              CASE WHEN x.headers IS NULL OR jsonb_typeof(x.headers) = 'object' THEN
                  coalesce(x.headers, '{}'::jsonb) || jsonb_build_object(
                      @header_replayed_from::text, x.id::text,
                      @header_first_failed_at::text, coalesce(
                          x.headers ->> @header_first_failed_at::text,
                          to_char(x.failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
              ELSE x.headers END AS headers,
              x.ordering_key,
              CASE WHEN p.conflict THEN NULL ELSE x.timer_id END AS timer_id
), inserted AS (
    INSERT INTO /*outbox:table*/outbox AS o (queue, payload, headers, ordering_key, timer_id)
    SELECT m.queue, m.payload, m.headers, m.ordering_key, m.timer_id
    FROM moved AS m
    ORDER BY m.id
    RETURNING o.id
)
SELECT p.id, p.queue, p.timer_id, p.conflict::boolean AS conflict, (m.id IS NOT NULL)::boolean AS moved
FROM picked AS p
LEFT JOIN moved AS m ON m.id = p.id
ORDER BY p.id;

-- name: PurgeDeadLetters :one
-- Deletes for good up to @max_rows matching dead-lettered rows with ids in
-- (@after_id, @up_to_id], the lowest ids first: one batch of a purge,
-- committed on its own. Returns how many rows it looked at, how many it
-- deleted (fewer when another client deleted some first) and the highest
-- id it looked at (@after_id when none), from which the next batch starts.
WITH picked AS (
    SELECT y.id
    FROM /*outbox:table*/outbox_dlq AS y
    WHERE (sqlc.narg(queue)::text IS NULL OR y.queue = sqlc.narg(queue)::text)
      AND (sqlc.narg(reason)::text IS NULL OR y.failure_reason = sqlc.narg(reason)::text)
      AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(y.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
      AND (sqlc.narg(ids)::bigint[] IS NULL OR y.id = ANY(sqlc.narg(ids)::bigint[]))
      AND (@older_than_seconds::float8 = 0 OR y.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
      AND y.id > @after_id::bigint
      AND y.id <= @up_to_id::bigint
    ORDER BY y.id
    LIMIT @max_rows::integer
), deleted AS (
    DELETE FROM /*outbox:table*/outbox_dlq AS x
    USING picked AS p
    WHERE x.id = p.id
    RETURNING x.id
)
SELECT (SELECT count(*) FROM picked)::bigint AS looked,
       (SELECT count(*) FROM deleted)::bigint AS deleted,
       coalesce((SELECT max(p.id) FROM picked AS p), @after_id::bigint)::bigint AS last_id;

-- name: CountDeadLetters :one
-- How many dead-lettered rows with ids up to @up_to_id match the filters,
-- and the highest id among them (the lowest bigint when none, a bound
-- that selects nothing another client could have written but that one).
-- A read: it takes no row lock.
SELECT count(*)::bigint AS total, coalesce(max(x.id), -9223372036854775808)::bigint AS max_id
FROM /*outbox:table*/outbox_dlq AS x
WHERE (sqlc.narg(queue)::text IS NULL OR x.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(reason)::text IS NULL OR x.failure_reason = sqlc.narg(reason)::text)
  AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(x.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
  AND (sqlc.narg(ids)::bigint[] IS NULL OR x.id = ANY(sqlc.narg(ids)::bigint[]))
  AND (@older_than_seconds::float8 = 0 OR x.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
  AND x.id <= @up_to_id::bigint;

-- name: NoJIT :exec
-- Turns JIT compilation off for the rest of the transaction: a dry run's
-- reads are one pass each over many rows, which JIT compiles for longer
-- than they run (2 of 3 seconds at 100,000 dead letters).
SELECT set_config('jit', 'off', true);

-- name: ReplayTimerConflicts :many
-- What ReplayDeadLetters would meet, read only: the matching dead-lettered
-- rows with ids up to @up_to_id whose timer id a replay could not take
-- back, in id order. A row conflicts when a row of its queue in the
-- outbox holds its timer id, or when a lower id of the same set shares
-- its queue and timer id (the replay moves that one first, with it). It
-- reads the rows that have a timer id once and sorts them by queue and
-- timer id; it locks nothing and writes nothing.
WITH timed AS (
    SELECT y.id, y.queue, y.timer_id,
           row_number() OVER (PARTITION BY y.queue, y.timer_id COLLATE "C" ORDER BY y.id) AS nth
    FROM /*outbox:table*/outbox_dlq AS y
    WHERE (sqlc.narg(queue)::text IS NULL OR y.queue = sqlc.narg(queue)::text)
      AND (sqlc.narg(reason)::text IS NULL OR y.failure_reason = sqlc.narg(reason)::text)
      AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(y.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
      AND (sqlc.narg(ids)::bigint[] IS NULL OR y.id = ANY(sqlc.narg(ids)::bigint[]))
      AND (@older_than_seconds::float8 = 0 OR y.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
      AND y.id <= @up_to_id::bigint
      AND y.timer_id IS NOT NULL
)
SELECT t.id, t.queue, t.timer_id::text AS timer_id
FROM timed AS t
WHERE t.nth > 1
   OR EXISTS (
       SELECT FROM /*outbox:table*/outbox AS o
       WHERE o.queue = t.queue AND o.timer_id = t.timer_id COLLATE "C"
   )
ORDER BY t.id;

-- name: ListDeadLettersNewest :many
-- Dead-lettered rows matching the filters of ListDeadLetters with ids below
-- @before_id, newest (highest id) first: a page of what failed last. It
-- walks the primary key backwards, or, for one queue, the queue index
-- ordered by failure time, and stops at @max_rows. With @payload_bytes of
-- zero or more it reads only that many bytes of each payload (a slice of
-- a TOASTed value reads only the chunks it needs), and payload_size says
-- how long the payload is; below zero, the whole payload.
SELECT x.id, x.queue,
       CASE WHEN @payload_bytes::integer >= 0 THEN substring(x.payload FROM 1 FOR @payload_bytes::integer)
            ELSE x.payload END::bytea AS payload,
       octet_length(x.payload)::bigint AS payload_size, x.headers, x.ordering_key, x.timer_id,
       x.deliveries_count, x.attempts_count,
       least(greatest(x.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       least(greatest(x.failed_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS failed_at,
       x.failure_reason, x.last_error
FROM /*outbox:table*/outbox_dlq AS x
WHERE (sqlc.narg(queue)::text IS NULL OR x.queue = sqlc.narg(queue)::text)
  AND (sqlc.narg(reason)::text IS NULL OR x.failure_reason = sqlc.narg(reason)::text)
  AND (SELECT sqlc.narg(cause)::text IS NULL OR regexp_replace(regexp_replace(coalesce(x.last_error, ''), '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') = sqlc.narg(cause)::text)
  AND (sqlc.narg(ids)::bigint[] IS NULL OR x.id = ANY(sqlc.narg(ids)::bigint[]))
  AND (@older_than_seconds::float8 = 0 OR x.failed_at <= now() - make_interval(secs => @older_than_seconds::float8))
  AND x.id < @before_id::bigint
ORDER BY x.id DESC
LIMIT @max_rows::integer;

-- name: GetDeadLetter :one
-- One dead-lettered row by its id, read as ListDeadLetters reads rows.
SELECT x.id, x.queue, x.payload, octet_length(x.payload)::bigint AS payload_size, x.headers, x.ordering_key, x.timer_id,
       x.deliveries_count, x.attempts_count,
       least(greatest(x.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       least(greatest(x.failed_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS failed_at,
       x.failure_reason, x.last_error
FROM /*outbox:table*/outbox_dlq AS x
WHERE x.id = @id::bigint;

-- name: DeadLetterCauses :many
-- Why the newest @sample dead letters failed (of @queue, when set): their
-- groups by queue, reason and cause, the last error with every run of
-- digits and every id-like hex run replaced by "#" (so "order 4211
-- timed out after 30s" and "order 977 timed out after 12s" are one
-- cause), each with how many of the sample it holds and its newest dead
-- letter (id, failure time, last error as written), the largest groups
-- first, at most @max_groups. The sample is the newest rows by id,
-- through the primary key (or one queue's through its index), as
-- ListDeadLettersNewest walks them: a bounded read however many rows the
-- table holds. With @contains, only the sample's rows whose last error
-- holds it (case-insensitive) are grouped: a search within the sample.
WITH sample AS MATERIALIZED (
    SELECT x.id, x.queue, x.failure_reason, x.failed_at, coalesce(x.last_error, '') AS last_error
    FROM /*outbox:table*/outbox_dlq AS x
    WHERE (sqlc.narg(queue)::text IS NULL OR x.queue = sqlc.narg(queue)::text)
    ORDER BY x.id DESC
    LIMIT @sample::integer
), grouped AS (
    SELECT s.queue, s.failure_reason,
           regexp_replace(regexp_replace(s.last_error, '[0-9a-fA-F]*[0-9][0-9a-fA-F]*(-[0-9a-fA-F]+)*', '#', 'g'), '#(\s*#)+', '#', 'g') AS cause,
           count(*)::bigint AS rows, max(s.id) AS newest_id
    FROM sample AS s
    WHERE sqlc.narg(contains)::text IS NULL OR strpos(lower(s.last_error), lower(sqlc.narg(contains)::text)) > 0
    GROUP BY 1, 2, 3
)
SELECT g.queue::text AS queue, g.failure_reason::text AS failure_reason, g.cause::text AS cause, g.rows, g.newest_id::bigint AS newest_id,
       least(greatest(s.failed_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS newest_failed_at,
       s.last_error::text AS newest_error,
       (SELECT count(*) FROM sample)::bigint AS sampled
FROM grouped AS g
JOIN sample AS s ON s.id = g.newest_id
ORDER BY g.rows DESC, g.newest_id DESC
LIMIT @max_groups::integer;
