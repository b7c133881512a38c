-- name: FetchUnprocessed :many
-- A lease-free peek at the rows of a queue, oldest first. It takes no locks
-- and changes nothing.
SELECT o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
       o.created_at, o.next_attempt_at, o.attempts_count, o.deliveries_count,
       o.first_attempt_at, o.last_attempt_at, o.acquired_at, o.acquired_token
FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text
ORDER BY o.id
LIMIT @max_rows::integer;

-- name: QueueStats :many
-- Per queue: rows ready now, scheduled for later, leased, leased past
-- their expiry, the age of the oldest row in seconds, and the dead-lettered
-- count.
WITH live AS (
    SELECT o.queue,
           count(*) FILTER (WHERE o.acquired_token IS NULL AND o.next_attempt_at <= now()) AS ready,
           count(*) FILTER (WHERE o.acquired_token IS NULL AND o.next_attempt_at > now()) AS scheduled,
           count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at >= now()) AS leased,
           count(*) FILTER (WHERE o.acquired_token IS NOT NULL AND o.lease_expires_at < now()) AS expired,
           min(o.created_at) AS oldest_created_at
    FROM /*outbox:table*/outbox AS o
    GROUP BY o.queue
), dead AS (
    SELECT x.queue, count(*) AS dead_lettered
    FROM /*outbox:table*/outbox_dlq AS x
    GROUP BY x.queue
)
SELECT coalesce(l.queue, d.queue)::text AS queue,
       coalesce(l.ready, 0)::bigint AS ready,
       coalesce(l.scheduled, 0)::bigint AS scheduled,
       coalesce(l.leased, 0)::bigint AS leased,
       coalesce(l.expired, 0)::bigint AS expired,
       coalesce(extract(epoch FROM now() - l.oldest_created_at), 0)::float8 AS oldest_age_seconds,
       coalesce(d.dead_lettered, 0)::bigint AS dead_lettered
FROM live AS l
FULL JOIN dead AS d ON d.queue = l.queue
ORDER BY 1;

-- name: NextDueIn :one
-- Seconds, on the server's clock, until the earliest next_attempt_at still
-- to come among unleased rows of the given queues; no row when none is due
-- later. Rows already due are left out: a claim that just found nothing
-- could not take them (another transaction holds their locks), so waking
-- for them would only spin. One index probe per queue.
SELECT extract(epoch FROM n.next_attempt_at - clock_timestamp())::float8 AS due_in_seconds
FROM unnest(@queues::text[]) AS q(name)
CROSS JOIN LATERAL (
    SELECT o.next_attempt_at
    FROM /*outbox:table*/outbox AS o
    WHERE o.queue = q.name AND o.acquired_token IS NULL AND o.next_attempt_at > clock_timestamp()
    ORDER BY o.next_attempt_at
    LIMIT 1
) AS n
ORDER BY n.next_attempt_at
LIMIT 1;

-- name: RetryBacklog :one
-- Over the given queues: rows that were handled at least once and are not
-- finished (waiting for their retry, due for it, or leased again), and
-- seconds on the server's clock until the earliest of them is due: a leased
-- one counts as due now (0), an overdue one is negative, and 0 when there is
-- none.
SELECT count(*)::bigint AS retrying,
       coalesce(extract(epoch FROM min(CASE WHEN o.acquired_token IS NULL THEN o.next_attempt_at
                                            ELSE statement_timestamp() END) - statement_timestamp()), 0)::float8 AS next_due_in_seconds
FROM /*outbox:table*/outbox AS o
WHERE o.queue = ANY(@queues::text[]) AND o.attempts_count > 0;
