-- name: Claim :many
-- Leases up to @max_rows available rows of the given queues: rows whose
-- lease is unset and whose next_attempt_at has come, and rows whose lease
-- expired (acquired_at older than @lease_ttl_seconds). Each claimed row gets
-- a fresh lease token and one more delivery. Each queue is scanned through
-- its own partial-index range (LATERAL), so the cost of a claim is bounded by
-- @max_rows per queue, not by the backlog; SKIP LOCKED lets concurrent
-- claimers pass each other instead of queueing on row locks. Candidates
-- that are locked but not picked are released when the statement's
-- transaction ends, so run the claim in autocommit.
WITH candidates AS (
    SELECT p.id, p.next_attempt_at
    FROM unnest(@queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT o.id, o.next_attempt_at
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = q.name
          AND o.acquired_token IS NULL
          AND o.next_attempt_at <= now()
        ORDER BY o.next_attempt_at, o.id
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS p
    UNION ALL
    SELECT e.id, e.next_attempt_at
    FROM unnest(@queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT o.id, o.next_attempt_at
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = q.name
          AND o.acquired_token IS NOT NULL
          AND o.acquired_at < now() - make_interval(secs => @lease_ttl_seconds::float8)
        ORDER BY o.acquired_at
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS e
), picked AS (
    SELECT c.id FROM candidates AS c
    ORDER BY c.next_attempt_at, c.id
    LIMIT @max_rows::integer
)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = gen_random_uuid(),
    acquired_at      = now(),
    deliveries_count = o.deliveries_count + 1
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
          o.created_at, o.next_attempt_at, o.attempts_count, o.deliveries_count,
          o.first_attempt_at, o.last_attempt_at, o.acquired_at, o.acquired_token;
