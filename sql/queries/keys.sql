-- Reads for an operator looking at ordering keys: which keys hold rows
-- back, and how many rows wait behind them. Each read is bounded by its
-- limits, whatever the backlog: it walks index ranges that stop at a
-- number of entries, never a whole queue.

-- name: HeldKeys :many
-- Keys of the given queues whose head (the row of the key being
-- delivered, or waiting for its retry or its scheduled time) holds back
-- rows published after it, oldest hold first: the head's id, its state
-- (leased, retrying or scheduled), when its lease expires or it comes due
-- (@scan_rows entries of each queue's lease expiry and pending indexes are
-- looked at, the earliest first), since when the key's first waiting row
-- has waited, and how many rows wait behind it, counted up to @count_cap.
-- A head that is due now is not listed: its key moves as soon as a
-- subscriber claims it.
WITH heads AS (
    SELECT c.id, c.queue, c.ordering_key, c.leased, c.attempts_count, c.until_at
    FROM unnest(@queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        (SELECT l.id, l.queue, l.ordering_key, true AS leased, l.attempts_count, l.lease_expires_at AS until_at
         FROM /*outbox:table*/outbox AS l
         WHERE l.queue = q.name AND l.acquired_token IS NOT NULL
         ORDER BY l.lease_expires_at
         LIMIT @scan_rows::integer)
        UNION ALL
        (SELECT w.id, w.queue, w.ordering_key, false AS leased, w.attempts_count, w.next_attempt_at AS until_at
         FROM /*outbox:table*/outbox AS w
         WHERE w.queue = q.name AND w.acquired_token IS NULL AND NOT w.blocked AND w.next_attempt_at > now()
         ORDER BY w.next_attempt_at
         LIMIT @scan_rows::integer)
    ) AS c
    WHERE c.ordering_key IS NOT NULL
), held AS (
    SELECT h.id, h.queue, h.ordering_key, h.leased, h.attempts_count, h.until_at, n.created_at AS waiting_since
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT b.created_at
        FROM /*outbox:table*/outbox AS b
        WHERE b.queue = h.queue AND b.ordering_key = h.ordering_key AND b.id > h.id AND b.blocked
        ORDER BY b.id
        LIMIT 1
    ) AS n
    ORDER BY n.created_at, h.queue, h.ordering_key
    LIMIT @max_rows::integer
)
SELECT h.id, h.queue::text AS queue, h.ordering_key::text AS ordering_key,
       (CASE WHEN h.leased THEN 'leased' WHEN h.attempts_count > 0 THEN 'retrying' ELSE 'scheduled' END)::text AS state,
       h.attempts_count,
       coalesce(extract(epoch FROM h.until_at) - extract(epoch FROM now()), 0)::float8 AS until_seconds,
       coalesce(greatest(extract(epoch FROM now()) - extract(epoch FROM h.waiting_since), 0), 0)::float8 AS held_seconds,
       w.waiting::bigint AS waiting
FROM held AS h
CROSS JOIN LATERAL (
    SELECT count(*) AS waiting
    FROM (
        SELECT
        FROM /*outbox:table*/outbox AS b
        WHERE b.queue = h.queue AND b.ordering_key = h.ordering_key AND b.id > h.id
        LIMIT @count_cap::integer
    ) AS r
) AS w
ORDER BY h.waiting_since, h.queue, h.ordering_key;

-- name: BlockedDepths :many
-- Per given queue, one row each in the order given: how many of the first
-- @scan_rows keyed rows (in key order, from the ordering index) are
-- blocked behind their key's head, and how many keyed rows were looked
-- at: when that reaches @scan_rows, the count is a lower bound.
SELECT q.name::text AS queue,
       count(*) FILTER (WHERE k.blocked)::bigint AS blocked,
       count(k.blocked)::bigint AS scanned
FROM unnest(@queues::text[]) WITH ORDINALITY AS q(name, n)
LEFT JOIN LATERAL (
    SELECT o.blocked
    FROM /*outbox:table*/outbox AS o
    WHERE o.queue = q.name AND o.ordering_key IS NOT NULL
    LIMIT @scan_rows::integer
) AS k ON true
GROUP BY q.n, q.name
ORDER BY q.n;
