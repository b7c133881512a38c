-- Queue depths that stay cheap on a large backlog, for metrics collectors
-- scraped every few seconds. Every read is an index-only scan of a partial
-- index, and every count stops at a cap, so a read costs a bounded number
-- of index entries per queue however many rows wait. What only the heap
-- knows (rows blocked behind their key, hand-overs) is QueueStats' part.

-- name: DepthPlanSettings :exec
-- Sets, for the rest of the calling transaction, what QueueDepths' plan
-- needs to stay bounded. Its counts are parameterised by queues found as
-- it runs, so the planner prices each for an average queue; on a table
-- whose pages vacuum has not yet marked all-visible it then prefers
-- sequential and bitmap scans, and a sequential scan that stops at the cap
-- reads the whole table for a queue with fewer rows than the cap. Without
-- them, an index-only scan reads at most the cap's entries (checking each
-- in the table only while its page is not all-visible). And the plan,
-- costed for every queue the planner imagines, passes jit_above_cost:
-- compiling it takes ten times longer than running it.
SELECT set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('jit', 'off', true);

-- name: QueueDepths :many
-- Per queue: rows due now and not leased (ready), due later (scheduled),
-- held by a live lease (leased) or by one past its expiry (expired), the
-- queue's dead letters, and how long, in seconds, the ready row due
-- earliest has been due (0 when none is). Each count stops at
-- @count_cap: a count equal to it means at least that many. Rows held by a
-- claim by row lock count as ready, as in QueueStats.
--
-- The queues are found by loose index scans, one index descent per queue,
-- of the four indexes that between them hold every row: pending (not
-- leased, not blocked), lease expiry (leased), ordering (keyed, so every
-- blocked row) and the dead-letter table's. The counts are index-only
-- ranges of the pending, lease expiry and dead-letter indexes. Waits are
-- measured with epochs, which are infinite for infinite timestamps.
WITH RECURSIVE pending_queues AS (
    (SELECT o.queue FROM /*outbox:table*/outbox AS o
     WHERE o.acquired_token IS NULL AND NOT o.blocked
     ORDER BY o.queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM pending_queues AS p CROSS JOIN LATERAL (
        SELECT o.queue FROM /*outbox:table*/outbox AS o
        WHERE o.acquired_token IS NULL AND NOT o.blocked AND o.queue > p.queue
        ORDER BY o.queue LIMIT 1) AS n
), leased_queues AS (
    (SELECT o.queue FROM /*outbox:table*/outbox AS o
     WHERE o.acquired_token IS NOT NULL
     ORDER BY o.queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM leased_queues AS p CROSS JOIN LATERAL (
        SELECT o.queue FROM /*outbox:table*/outbox AS o
        WHERE o.acquired_token IS NOT NULL AND o.queue > p.queue
        ORDER BY o.queue LIMIT 1) AS n
), keyed_queues AS (
    (SELECT o.queue FROM /*outbox:table*/outbox AS o
     WHERE o.ordering_key IS NOT NULL
     ORDER BY o.queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM keyed_queues AS p CROSS JOIN LATERAL (
        SELECT o.queue FROM /*outbox:table*/outbox AS o
        WHERE o.ordering_key IS NOT NULL AND o.queue > p.queue
        ORDER BY o.queue LIMIT 1) AS n
), dead_queues AS (
    (SELECT x.queue FROM /*outbox:table*/outbox_dlq AS x
     ORDER BY x.queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM dead_queues AS p CROSS JOIN LATERAL (
        SELECT x.queue FROM /*outbox:table*/outbox_dlq AS x
        WHERE x.queue > p.queue
        ORDER BY x.queue LIMIT 1) AS n
), queues AS (
    SELECT pq.queue FROM pending_queues AS pq
    UNION SELECT lq.queue FROM leased_queues AS lq
    UNION SELECT kq.queue FROM keyed_queues AS kq
    UNION SELECT dq.queue FROM dead_queues AS dq
)
SELECT q.queue::text AS queue,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*outbox:table*/outbox AS o
            WHERE o.queue = q.queue AND o.acquired_token IS NULL AND NOT o.blocked
              AND o.next_attempt_at <= now()
            LIMIT @count_cap::bigint) AS c)::bigint AS ready,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*outbox:table*/outbox AS o
            WHERE o.queue = q.queue AND o.acquired_token IS NULL AND NOT o.blocked
              AND o.next_attempt_at > now()
            LIMIT @count_cap::bigint) AS c)::bigint AS scheduled,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*outbox:table*/outbox AS o
            WHERE o.queue = q.queue AND o.acquired_token IS NOT NULL
              AND o.lease_expires_at >= now()
            LIMIT @count_cap::bigint) AS c)::bigint AS leased,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*outbox:table*/outbox AS o
            WHERE o.queue = q.queue AND o.acquired_token IS NOT NULL
              AND o.lease_expires_at < now()
            LIMIT @count_cap::bigint) AS c)::bigint AS expired,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*outbox:table*/outbox_dlq AS x
            WHERE x.queue = q.queue
            LIMIT @count_cap::bigint) AS c)::bigint AS dead_lettered,
       coalesce((SELECT extract(epoch FROM now()) - extract(epoch FROM min(o.next_attempt_at))
                 FROM /*outbox:table*/outbox AS o
                 WHERE o.queue = q.queue AND o.acquired_token IS NULL AND NOT o.blocked
                   AND o.next_attempt_at <= now()), 0)::float8 AS oldest_ready_wait_seconds
FROM queues AS q
ORDER BY q.queue;

-- name: DepthSamplePercent :one
-- The share, in percent, of the outbox table's pages that holds about
-- @sample_rows rows by the planner's count of its rows (pg_class's
-- reltuples, which VACUUM and ANALYZE keep): the sample DepthEstimates
-- reads. At most 100; -1 when the table was never vacuumed or analyzed
-- and the planner does not know.
SELECT (CASE WHEN c.reltuples < 0 THEN -1
             ELSE least(100, greatest(0.001, 100 * r.rows / greatest(c.reltuples, 1))) END)::float8 AS percent
FROM (SELECT @sample_rows::float8 AS rows) AS r
CROSS JOIN pg_catalog.pg_class AS c
WHERE c.oid = /*outbox:literal*/'outbox'::regclass;

-- name: DepthEstimates :many
-- Estimates of QueueDepths' counts of each of @queues past the cap, and
-- of its blocked rows: the rows of a sample of @percent of the outbox
-- table's pages (TABLESAMPLE SYSTEM, which reads only those pages),
-- counted by state and scaled up. Pages hold rows written together, so
-- an estimate is coarse (a queue whose rows lie in few pages may be
-- missed, or counted many times over); it is marked as one wherever it
-- is shown.
SELECT o.queue::text AS queue,
       (count(*) FILTER (WHERE o.acquired_token IS NULL AND NOT o.blocked AND o.next_attempt_at <= now())
        * 100 / @percent::float8)::bigint AS ready,
       (count(*) FILTER (WHERE o.acquired_token IS NULL AND NOT o.blocked AND o.next_attempt_at > now())
        * 100 / @percent::float8)::bigint AS scheduled,
       (count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at >= now())
        * 100 / @percent::float8)::bigint AS leased,
       (count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at < now())
        * 100 / @percent::float8)::bigint AS expired,
       (count(*) FILTER (WHERE o.acquired_token IS NULL AND o.blocked) * 100 / @percent::float8)::bigint AS blocked
FROM /*outbox:table*/outbox AS o TABLESAMPLE SYSTEM (@percent::float8)
WHERE o.queue = ANY (@queues::text[])
GROUP BY o.queue
ORDER BY o.queue;
