-- name: Claim :many
-- Leases up to @max_rows available rows of the given queues: rows whose
-- lease is unset, that are not blocked behind their key's head, and whose
-- next_attempt_at has come, and rows whose lease expired (lease_expires_at,
-- stamped by the holder from its own TTL, has passed). Each claimed row
-- gets the lease token @token, an expiry @lease_ttl_seconds from now, and
-- one more delivery. The caller draws a fresh token for every claim
-- statement, so the rows of one claim share it and a row claimed again
-- gets another: a delivery is its row id and token together, and the
-- writes of an earlier delivery of the row match nothing. A key has one
-- unblocked row at a time, so a batch never holds two rows of one key.
-- A paused queue (a row of <table>_pauses, schema 14) is passed by: none
-- of its rows is claimed, due or with an expired lease.
--
-- It keeps the promises of claims by lock (sql/queries/locked.sql) too.
-- A row that the record of an ended claim by lock still holds (in
-- <table>_locks, until its lease would have expired: that claim's
-- handler may still run) is passed by. A row of such a record whose hold
-- ended counts that claim's delivery, which ended without an outcome,
-- and leaves the record, so it is counted once. The records that hold are
-- read once per statement through the index on until (schema 12): those
-- of the claims made within a lease. Only a row whose version another
-- transaction locked (its xmax is set; see recheck below) can be named by
-- a record that lapsed, as a claim by lock locked it: only those rows look
-- the lapsed records up, each through the GiST index on their ids. Reading
-- every record instead walked every record a held vacuum horizon keeps,
-- one per claim by lock since it began. Joining the picked rows to a list of the
-- counted ones was planned as a nested loop, quadratic in the rows, and
-- a claim of 5,000 rows that a crashed claim by lock had named took 17 s.
-- Every record naming a row
-- this statement locked has ended: a claim by lock in progress holds its
-- rows' locks, and one that committed deleted its record.
--
-- Rows written by other clients may hold values this library never
-- writes, and one row must not fail the claim of its batch: the delivery
-- count saturates at the integer maximum (a negative one starts again
-- from zero), created_at is read within the years 1 to 9999, which Go
-- prints and encodes as JSON (infinity as the last microsecond of 9999,
-- -infinity as the first of year 1), and the time since the first attempt
-- is returned in seconds on the server's clock: 0 when there was none,
-- infinite when first_attempt_at is.
--
-- Each queue is scanned through its own partial-index ranges (LATERAL), so
-- the cost of a claim is bounded by @max_rows per queue, not by the
-- backlog. The batch is shared across the queues: candidates are ranked
-- within their queue and taken rank by rank, so one queue's backlog never
-- delays another queue's due rows by more than a claim. SKIP LOCKED lets
-- concurrent claimers pass each other instead of queueing on row locks.
-- Candidates that are locked but not picked are released when the
-- statement's transaction ends, so run the claim in autocommit.
--
-- Each queue's pending rows are read from its floor in @floors (its
-- next_attempt_at; year 1 or earlier: from the queue's start), and
-- expired leases from @expired_within seconds ago (NULL: from the
-- oldest). A held vacuum horizon keeps the index entries of every row
-- claimed or deleted since it began, and a scan from the start walks them
-- all: the caller passes where its last claims stopped, and looks from
-- the start now and then for rows that landed behind (see
-- internal/claim's floors).
--
-- recheck marks a row whose version, as the statement read it, another
-- transaction had locked or changed (its xmax is set): a claim by lock
-- may have held it, and recorded it after this statement's snapshot. The
-- caller reads the records again for those rows (RecordedAmong) before
-- any handler gets them.
WITH held AS MATERIALIZED (
    -- The records that hold (until > now()), through the index on until:
    -- those of claims made within a lease, not every record.
    SELECT coalesce(range_agg(r.ids), '{}')::int8multirange AS ids
    FROM /*outbox:table*/outbox_locks AS l CROSS JOIN LATERAL unnest(l.ids) AS r(ids)
    WHERE l.until > now()
), candidates AS (
    SELECT p.id, p.queue, p.next_attempt_at, p.recheck
    FROM (SELECT unnest(@queues::text[]) AS name, unnest(@floors::timestamptz[]) AS floor) AS q
    CROSS JOIN LATERAL (
        SELECT o.id, o.queue, o.next_attempt_at, NOT o.xmax = '0'::xid AS recheck
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = q.name
          AND o.acquired_token IS NULL
          AND NOT o.blocked
          AND o.next_attempt_at <= now()
          AND o.next_attempt_at >= CASE WHEN q.floor > '0001-01-01 00:00:00+00' THEN q.floor ELSE '-infinity' END
          AND NOT o.id <@ (SELECT h.ids FROM held AS h)
        ORDER BY o.next_attempt_at, o.id
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS p
    WHERE NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = q.name)
    UNION ALL
    SELECT e.id, e.queue, e.next_attempt_at, false
    FROM unnest(@queues::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT o.id, o.queue, o.next_attempt_at
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
), ranked AS (
    SELECT c.id, c.next_attempt_at, c.recheck,
           row_number() OVER (PARTITION BY c.queue ORDER BY c.next_attempt_at, c.id) AS rank
    FROM candidates AS c
), picked AS MATERIALIZED (
    SELECT r.id, r.recheck,
           CASE WHEN r.recheck
                THEN (SELECT count(*) FROM /*outbox:table*/outbox_locks AS e WHERE e.until <= now() AND e.ids @> r.id)
                ELSE 0 END AS aborted
    FROM (SELECT r.id, r.recheck FROM ranked AS r
          ORDER BY r.rank, r.next_attempt_at, r.id
          LIMIT @max_rows::integer) AS r
), forgotten AS (
    UPDATE /*outbox:table*/outbox_locks AS l
    SET ids = l.ids - f.ids
    FROM (SELECT range_agg(CASE WHEN p.id = 9223372036854775807 THEN int8range(p.id, NULL)
                                ELSE int8range(p.id, p.id + 1) END) AS ids
          FROM picked AS p WHERE p.aborted > 0 HAVING count(*) > 0) AS f
    WHERE l.ids && f.ids
)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = @token::uuid,
    acquired_at      = now(),
    lease_expires_at = now() + make_interval(secs => @lease_ttl_seconds::float8),
    deliveries_count = least(greatest(o.deliveries_count, 0)::bigint + 1 + picked.aborted, 2147483647)::integer
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.queue, o.payload, o.headers, o.ordering_key, o.timer_id,
          least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
          o.attempts_count, o.deliveries_count,
          coalesce(extract(epoch FROM now()) - extract(epoch FROM o.first_attempt_at), 0)::float8 AS since_first_attempt_seconds,
          least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
          (picked.recheck IS TRUE)::boolean AS recheck;

-- name: ClaimQueue :many
-- Claim for a subscriber of one queue (from @floor, NULL: from its start):
-- the rows Claim would take, without the ranking that shares a batch
-- across queues (one queue needs none),
-- and with Claim's columns but the queue, which the caller named
-- (recheck among them). A paused queue gives no row.
WITH held AS MATERIALIZED (
    -- The records that hold (until > now()), through the index on until:
    -- those of claims made within a lease, not every record.
    SELECT coalesce(range_agg(r.ids), '{}')::int8multirange AS ids
    FROM /*outbox:table*/outbox_locks AS l CROSS JOIN LATERAL unnest(l.ids) AS r(ids)
    WHERE l.until > now()
), candidates AS (
    SELECT p.id, p.next_attempt_at, p.recheck
    FROM (
        SELECT o.id, o.next_attempt_at, NOT o.xmax = '0'::xid AS recheck
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = @queue::text
          AND NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = @queue::text)
          AND o.acquired_token IS NULL
          AND NOT o.blocked
          AND o.next_attempt_at <= now()
          AND o.next_attempt_at >= coalesce(sqlc.narg(floor)::timestamptz, '-infinity')
          AND NOT o.id <@ (SELECT h.ids FROM held AS h)
        ORDER BY o.next_attempt_at, o.id
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS p
    UNION ALL
    SELECT e.id, e.next_attempt_at, false
    FROM (
        SELECT o.id, o.next_attempt_at
        FROM /*outbox:table*/outbox AS o
        WHERE o.queue = @queue::text
          AND NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = @queue::text)
          AND o.acquired_token IS NOT NULL
          AND o.lease_expires_at < now()
          AND o.lease_expires_at >= coalesce(now() - make_interval(secs => sqlc.narg(expired_within)::float8), '-infinity')
        ORDER BY o.lease_expires_at
        LIMIT @max_rows::integer
        FOR UPDATE OF o SKIP LOCKED
    ) AS e
), picked AS MATERIALIZED (
    SELECT c.id, c.recheck,
           CASE WHEN c.recheck
                THEN (SELECT count(*) FROM /*outbox:table*/outbox_locks AS e WHERE e.until <= now() AND e.ids @> c.id)
                ELSE 0 END AS aborted
    FROM (SELECT c.id, c.recheck FROM candidates AS c
          ORDER BY c.next_attempt_at, c.id
          LIMIT @max_rows::integer) AS c
), forgotten AS (
    UPDATE /*outbox:table*/outbox_locks AS l
    SET ids = l.ids - f.ids
    FROM (SELECT range_agg(CASE WHEN p.id = 9223372036854775807 THEN int8range(p.id, NULL)
                                ELSE int8range(p.id, p.id + 1) END) AS ids
          FROM picked AS p WHERE p.aborted > 0 HAVING count(*) > 0) AS f
    WHERE l.ids && f.ids
)
UPDATE /*outbox:table*/outbox AS o
SET acquired_token   = @token::uuid,
    acquired_at      = now(),
    lease_expires_at = now() + make_interval(secs => @lease_ttl_seconds::float8),
    deliveries_count = least(greatest(o.deliveries_count, 0)::bigint + 1 + picked.aborted, 2147483647)::integer
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.payload, o.headers, o.ordering_key, o.timer_id,
          least(greatest(o.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS created_at,
          o.attempts_count, o.deliveries_count,
          coalesce(extract(epoch FROM now()) - extract(epoch FROM o.first_attempt_at), 0)::float8 AS since_first_attempt_seconds,
          least(greatest(o.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at,
          (picked.recheck IS TRUE)::boolean AS recheck;

-- name: RecordedAmong :many
-- Returns those of the rows @ids that a record of a claim by lock
-- (<table>_locks) names. A claim by lease runs it for the rows Claim or
-- ClaimQueue returned with recheck set, in a statement of its own, so
-- that it reads the records as committed after the claim took the rows'
-- locks; it hands the rows it returns to no handler and gives them back
-- (ReleaseBatchWithLease). It only reads, so a SERIALIZABLE pool seldom
-- fails it.
--
-- Why: a claim by lock's record commits in a transaction of its own
-- while the claim holds its rows' locks. A claim statement whose snapshot
-- is older than that commit does not see the record; if the claim by
-- lock then ends (its connection died) before that statement reaches
-- its rows, it finds them unlocked and leases them, though the record
-- holds them and that claim's handlers may still run. Such a row still
-- carries, as the statement read it, the lock of the claim that ended
-- (recheck: a row version that another transaction locked or changed),
-- so only those rows are read again. A row given back keeps every other
-- count: the next claim that takes it counts the record's delivery, or
-- passes the row while the record holds it.
SELECT c.id::bigint AS id
FROM unnest(@ids::bigint[]) AS c(id)
WHERE EXISTS (SELECT FROM /*outbox:table*/outbox_locks AS l WHERE l.ids @> c.id);

-- name: HandOff :one
-- Completes the key hand-overs recorded for the given queues that no other
-- transaction holds (see migration 5), locking at most @max_keys keys
-- (migration 9), and returns how many it found still held, whether keys
-- remain that it left for another call, and how many keys it handed on to
-- a next row (schema 12; 1 from an earlier schema, which does not say).
--
-- Only at READ COMMITTED: the function looks a key's rows up after it
-- took the key's lock, which must see every row the key's publishers
-- committed before they let the lock go. At REPEATABLE READ or
-- SERIALIZABLE its snapshot is the transaction's, taken before any lock,
-- and a row committed in between would stay blocked behind a hand-over
-- the call consumed. There (read_committed false) it does nothing, and
-- the caller runs it again in a READ COMMITTED transaction of its own.
SELECT coalesce(h.r[1], 0)::integer AS waiting, coalesce(h.r[2] > 0, false)::boolean AS more,
       coalesce(h.r[3], 1)::integer AS handed,
       h.read_committed::boolean AS read_committed
FROM (SELECT CASE WHEN i.read_committed
                  THEN /*outbox:table*/outbox_hand_off(@queues::text[], @max_keys::integer) END AS r,
             i.read_committed
      FROM (SELECT current_setting('transaction_isolation') = 'read committed' AS read_committed) AS i) AS h;
