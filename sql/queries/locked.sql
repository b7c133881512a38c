-- Claims that hold their rows by row lock (migration 7). Each runs in the
-- claim's own transaction but RecordLock, which must commit on its own.
-- Each passes a paused queue by (<table>_pauses, schema 14; see Claim).

-- name: LockQueue :many
-- Locks, in the calling transaction, up to @max_rows rows of one queue
-- that ClaimQueue would lease, without writing them: rows with no lease
-- that are not blocked and are due. (Rows whose lease expired are taken
-- over by ClaimExpired.) They stay locked, and so claimed, until the
-- transaction ends: a commit that wrote nothing, or a rollback, frees them
-- at once. The server ends the transaction when it stays idle for
-- @idle_timeout_ms, so a subscriber that stalls frees its rows after that
-- long, as an unextended lease would. Returns ClaimQueue's columns
-- (deliveries_count counting this delivery), read from the row versions it
-- locked, each row's next_attempt_at, and the transaction's id. Values
-- written by other clients are read as ClaimQueue reads them.
--
-- With @after_at and @after_id set, it looks only past that position of
-- the queue's order (next_attempt_at, id): a claim made while another
-- claim of the same subscriber holds the rows before it need not step
-- over their locks one by one. Rows before it wait for a claim without.
--
-- Rows that the record of an ended claim still holds (RecordLock) are
-- passed by, as a claim by lease passes them: that claim's handlers may
-- still run: the records that hold, read through the index on until.
--
-- The transaction id and the timeout are set once, by an InitPlan run
-- when the first row comes, before its lock: a claim that finds nothing
-- takes no transaction id. Every other column is read as it is stored or
-- in float8 arithmetic: the rows are projected before they are locked, so
-- a costly expression is paid for every row stepped over too.
SELECT o.id, o.payload, o.headers, o.ordering_key, o.timer_id,
       least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       o.attempts_count,
       least(greatest(o.deliveries_count, 0)::bigint + 1, 2147483647)::integer AS deliveries_count,
       CASE WHEN o.first_attempt_at IS NULL THEN 0
            ELSE date_part('epoch', now()) - date_part('epoch', o.first_attempt_at)
       END::float8 AS since_first_attempt_seconds,
       least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
       (SELECT pg_current_xact_id()::text::bigint
        FROM (SELECT set_config('idle_in_transaction_session_timeout', (@idle_timeout_ms::bigint)::text, true)) AS session(idle_timeout)
       ) AS xid
FROM /*outbox:table*/outbox AS o
WHERE o.queue = @queue::text
  AND NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = @queue::text)
  AND o.acquired_token IS NULL
  AND NOT o.blocked
  AND o.next_attempt_at <= now()
  AND (o.next_attempt_at, o.id) > (coalesce(sqlc.narg(after_at)::timestamptz, '-infinity'), coalesce(sqlc.narg(after_id)::bigint, -9223372036854775808))
  AND NOT o.id <@ (SELECT coalesce(range_agg(r.ids), '{}')::int8multirange
                   FROM /*outbox:table*/outbox_locks AS l CROSS JOIN LATERAL unnest(l.ids) AS r(ids)
                   WHERE l.until > now())
ORDER BY o.next_attempt_at, o.id
LIMIT @max_rows::integer
FOR UPDATE OF o SKIP LOCKED;

-- name: Lock :many
-- LockQueue for a subscriber of several queues: locks up to @per_queue
-- rows of each of @queues, past that queue's position in @after_at and
-- @after_id (an id of -2^63: from the queue's start), ranks them across
-- the queues as Claim ranks them, and returns up to @max_rows of them. With @per_queue times
-- the number of queues at most @max_rows, it returns every row it locks;
-- its caller locks again, past what it has, in the queues that had more.
-- The timeout and the transaction id are set and read once, by an
-- InitPlan run when the first row leaves, after every lock is taken.
WITH held AS MATERIALIZED (
    -- The records that hold (until > now()), through the index on until:
    -- those of claims made within a lease, not every record.
    SELECT coalesce(range_agg(r.ids), '{}')::int8multirange AS ids
    FROM /*outbox:table*/outbox_locks AS l CROSS JOIN LATERAL unnest(l.ids) AS r(ids)
    WHERE l.until > now()
), candidates AS (
    SELECT p.* FROM (
        SELECT unnest(@queues::text[]) AS name, unnest(@after_at::timestamptz[]) AS after_at,
               unnest(@after_id::bigint[]) AS after_id
    ) AS q
    CROSS JOIN LATERAL (
        SELECT o.id, o.queue, o.next_attempt_at, o.payload, o.headers, o.ordering_key, o.timer_id,
               o.created_at, o.attempts_count, o.deliveries_count, o.first_attempt_at
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = q.name
          AND o.acquired_token IS NULL
          AND NOT o.blocked
          AND o.next_attempt_at <= now()
          AND (o.next_attempt_at, o.id) > (CASE WHEN q.after_id = -9223372036854775808 THEN '-infinity' ELSE q.after_at END, q.after_id)
          AND NOT o.id <@ (SELECT h.ids FROM held AS h)
        ORDER BY o.next_attempt_at, o.id
        LIMIT @per_queue::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS p
    WHERE NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = q.name)
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.next_attempt_at, c.id) AS rank
    FROM candidates AS c
)
SELECT c.id, c.queue, c.payload, c.headers, c.ordering_key, c.timer_id,
       least(greatest(c.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
       c.attempts_count,
       least(greatest(c.deliveries_count, 0)::bigint + 1, 2147483647)::integer AS deliveries_count,
       CASE WHEN c.first_attempt_at IS NULL THEN 0
            ELSE date_part('epoch', now()) - date_part('epoch', c.first_attempt_at)
       END::float8 AS since_first_attempt_seconds,
       least(greatest(c.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
       (SELECT pg_current_xact_id_if_assigned()::text::bigint
        FROM (SELECT set_config('idle_in_transaction_session_timeout', (@idle_timeout_ms::bigint)::text, true)) AS session(idle_timeout)
       ) AS xid
FROM (
    SELECT r.* FROM ranked AS r
    ORDER BY r.rank, r.next_attempt_at, r.id
    LIMIT @max_rows::integer
) AS c;

-- name: ClaimExpired :many
-- Leases, as Claim does, up to @max_rows rows of the given queues whose
-- lease expired: the takeover of rows whose holder stopped extending its
-- lease, for subscribers that claim new rows by lock. With
-- @expired_within set, only leases that expired within that many seconds
-- (see Claim). No record of a
-- claim by lock names a leased row, so recheck is false.
WITH picked AS (
    SELECT e.id
    FROM unnest(@queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT o.id
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = q.name
          AND o.acquired_token IS NOT NULL
          AND o.lease_expires_at < now()
          AND o.lease_expires_at >= coalesce(now() - make_interval(secs => sqlc.narg(expired_within)::float8), '-infinity')
        ORDER BY o.lease_expires_at
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS e
    WHERE NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = q.name)
    LIMIT @max_rows::integer
)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = @token::uuid,
    acquired_at      = now(),
    lease_expires_at = now() + make_interval(secs => @lease_ttl_seconds::float8),
    deliveries_count = least(greatest(o.deliveries_count, 0)::bigint + 1, 2147483647)::integer
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
          least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
          o.attempts_count, o.deliveries_count,
          coalesce(extract(epoch FROM now()) - extract(epoch FROM o.first_attempt_at), 0)::float8 AS since_first_attempt_seconds,
          least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
          false AS recheck;

-- name: RecordLock :one
-- Records, in a transaction of its own (autocommit), that the claim of
-- transaction @xid holds the rows in the ranges @lower to @upper
-- (inclusive; they cover exactly the claimed rows) until
-- @lease_ttl_seconds from now. It records nothing, and recorded is false,
-- when that transaction is no longer in progress (its connection died
-- after the claim): its locks are gone, so its rows must not be handed to
-- handlers. It returns, for each claimed row that earlier claims' records
-- name, how many those claims were (deliveries that ended without an
-- outcome: the subscriber crashed, its connection died) and whether one
-- of them still holds it (held: its handler may still run, so the row must
-- not be handled yet). The record names the claimed rows but the held
-- ones: the claim gives those up. It needs no flush at commit: it must
-- outlive the subscriber, not the server, whose crash aborts the claim
-- too.
--
-- Every record that names a row the claim locked is of a claim that
-- ended: one in progress holds its rows' locks, and one that committed
-- deleted its record. So no record's transaction status is read: a record
-- restored from another cluster (pg_dump, a logical-replication cut-over)
-- names a transaction id this server may not know, and asking for its
-- status would fail. Only the records that share rows with the claim are
-- expanded into row ids. An id of 2^63-1 has no exclusive upper bound in
-- bigint, so its range is unbounded above.
WITH session AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit
), claimed AS MATERIALIZED (
    SELECT range_agg(CASE WHEN r.upper = 9223372036854775807 THEN int8range(r.lower, NULL)
                          ELSE int8range(r.lower, r.upper + 1) END) AS ids
    FROM (SELECT unnest(@lower::bigint[]) AS lower, unnest(@upper::bigint[]) AS upper) AS r
), aborted AS (
    SELECT c.id, count(*)::integer AS aborted, bool_or(l.until > now()) AS held
    FROM claimed
    JOIN /*outbox:table*/outbox_locks AS l ON l.ids && claimed.ids
    CROSS JOIN LATERAL unnest(l.ids * claimed.ids) AS k(ids)
    CROSS JOIN LATERAL generate_series(lower(k.ids), coalesce(upper(k.ids) - 1, 9223372036854775807)) AS c(id)
    GROUP BY c.id
), record AS (
    INSERT INTO /*outbox:table*/outbox_locks (xid, ids, until)
    SELECT @xid::bigint,
           claimed.ids - coalesce((SELECT range_agg(CASE WHEN a.id = 9223372036854775807 THEN int8range(a.id, NULL)
                                                         ELSE int8range(a.id, a.id + 1) END)
                                   FROM aborted AS a WHERE a.held), '{}'),
           now() + make_interval(secs => @lease_ttl_seconds::float8)
    FROM session, claimed
    WHERE pg_xact_status((@xid::bigint)::text::xid8) = 'in progress'
    RETURNING xid
)
SELECT EXISTS (SELECT FROM record) AS recorded,
       coalesce((SELECT array_agg(a.id ORDER BY a.id) FROM aborted AS a), '{}')::bigint[] AS aborted_ids,
       coalesce((SELECT array_agg(a.aborted ORDER BY a.id) FROM aborted AS a), '{}')::integer[] AS aborted_counts,
       coalesce((SELECT array_agg(a.held ORDER BY a.id) FROM aborted AS a), '{}')::boolean[] AS held;

-- name: ConfirmLocked :exec
-- Runs in a claim by lock's transaction once its record (RecordLock) has
-- committed: that it succeeds shows the transaction, and so its rows'
-- locks, outlived the record's commit. RecordLock finds the transaction
-- in progress before it commits; a transaction that ended in between
-- freed its rows before the record could hold them, and another claim
-- may have taken them unseen by the record.
SELECT 1;

-- name: DeleteLocked :execrows
-- Deletes, in the claim's transaction, its rows in the ranges @lower to
-- @upper (inclusive), which cover exactly the rows to delete: handled, or
-- ended without a dead letter. One index range scan per range costs the
-- server about half as much per row as a lookup per id. The claim holds
-- every one of them, so fewer rows deleted means the transaction no
-- longer holds its locks.
DELETE FROM /*outbox:table*/outbox AS o
USING (SELECT unnest(@lower::bigint[]) AS lower, unnest(@upper::bigint[]) AS upper) AS r
WHERE o.id BETWEEN r.lower AND r.upper;

-- name: LeaseLocked :execrows
-- Leases, in the claim's transaction, its rows @ids with @token for
-- @lease_ttl_seconds from the statement's time (not the transaction's,
-- which began at the claim): rows whose handlers still run, or whose
-- failure the lease path writes next; sets their delivery counts to
-- @deliveries. Fewer rows leased than given means the transaction no
-- longer holds its locks.
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = @token::uuid,
    acquired_at      = clock_timestamp(),
    lease_expires_at = clock_timestamp() + make_interval(secs => @lease_ttl_seconds::float8),
    deliveries_count = l.deliveries
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@deliveries::integer[]) AS deliveries) AS l
WHERE o.id = l.id;

-- name: EndLockRecord :exec
-- Deletes, in the claim's transaction, the record of the claim of
-- transaction @xid, the last statement of its end.
--
-- An end that only deletes (@durable false) commits without waiting for
-- its WAL flush: a server crash can then undo it, and its rows (and a
-- key's next row, which the same transaction unblocked) are delivered
-- again, in order, which at-least-once delivery allows; no later flushed
-- commit can survive it, as WAL is flushed in order. An end that leases
-- rows waits as usual, so a running handler's lease outlives a crash.
WITH record AS (
    DELETE FROM /*outbox:table*/outbox_locks AS l WHERE l.xid = @xid::bigint
)
SELECT set_config('synchronous_commit',
                  CASE WHEN @durable::boolean THEN current_setting('synchronous_commit') ELSE 'off' END,
                  true)::text AS synchronous_commit;

-- name: SavepointLockEnd :exec
-- Marks where a locked claim's end starts, so a failed end statement can
-- be retried in the same transaction.
SAVEPOINT lock_end;

-- name: RollbackToLockEnd :exec
-- Undoes a failed end statement; the claim keeps its locks.
ROLLBACK TO SAVEPOINT lock_end;

-- name: ForgetAborted :exec
-- Removes @ids from the records of ended claims, in the claim of
-- transaction @xid, which counted those aborted deliveries, so they are
-- counted once. The claim holds the rows' locks, so every other record
-- naming them is of a claim that ended.
WITH counted AS (
    SELECT range_agg(CASE WHEN c.id = 9223372036854775807 THEN int8range(c.id, NULL)
                          ELSE int8range(c.id, c.id + 1) END) AS ids
    FROM unnest(@ids::bigint[]) AS c(id)
)
UPDATE /*outbox:table*/outbox_locks AS l
SET ids = l.ids - counted.ids
FROM counted
WHERE l.ids && counted.ids
  AND l.xid <> @xid::bigint;

-- name: SweepLocks :execrows
-- Deletes the records no claim needs: those of ended claims whose rows are
-- all gone (or were all counted), and any of a committed claim or one too
-- old for its status to be known. A record whose transaction id this
-- server has not reached yet (restored from another cluster) names no
-- claim of this server's: it is treated as aborted, and its status is
-- never asked for, which would fail.
DELETE FROM /*outbox:table*/outbox_locks AS l
USING (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next) AS horizon
WHERE CASE WHEN l.xid >= horizon.next OR l.xid < 3 THEN 'aborted'
           ELSE pg_xact_status(l.xid::text::xid8) END IS DISTINCT FROM 'in progress'
  AND (CASE WHEN l.xid >= horizon.next OR l.xid < 3 THEN 'aborted'
            ELSE pg_xact_status(l.xid::text::xid8) END IS DISTINCT FROM 'aborted'
       OR NOT EXISTS (SELECT FROM unnest(l.ids) AS r(ids)
                      JOIN /*outbox:table*/outbox AS o ON o.id BETWEEN lower(r.ids) AND coalesce(upper(r.ids) - 1, 9223372036854775807)));
