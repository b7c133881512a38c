-- The log tier's ring (schema 13): claims that read a
-- lane's batch by snapshot difference, the moves of rows that need
-- per-row state into the outbox table, and the ring's turns. A claim of
-- a lane runs in a READ COMMITTED transaction of its own, which holds the
-- lane's row lock while the batch's handlers run, and ends by inserting
-- the lane's progress: that one row acknowledges every row of the batch
-- that did not move to the outbox table.

-- name: RingTakeLanes :many
-- Locks, in the claim's transaction, up to @max_lanes free lanes of
-- @queues between @from_lane and @to_lane (exclusive), at the positions
-- @ready when it is set (RingReadyLanes), the search going round every
-- (queue, lane) of them from position @turn (a queue's lanes one after
-- another, in the order of @queues), so that no queue's lanes wait while
-- another's are free; returns the lanes and their positions, in the
-- search's order. It sets the transaction's planner settings: plans
-- chosen as PostgreSQL's default does, whatever the server's setting
-- says, so that the statements that read the ring's partitions, sent as
-- one-shot statements (dbx.OneShot), are planned for their parameters
-- and lock only the partitions they name (a generic plan locks all of
-- them before pruning, and an open claim would then keep the ring from
-- turning), while the claim's other statements keep their cached plans
-- (planned at every execution, they cost a claim more than their runs);
-- no bitmap scans, so that
-- a lane's read stops at its batch's last row instead of reading, and
-- sorting, the lane's whole backlog; and no JIT: the ring's small tables
-- are never vacuumed, and estimates made without their statistics pass
-- jit_above_cost, whose compilation takes longer than the statements.
-- And it lets the claim's moves of keyed rows into the outbox table keep
-- their ids (the ring's version of the table's key trigger). The
-- server ends the transaction once it has been idle for
-- @idle_timeout_ms (the subscriber's LeaseTTL), as a claim by lock of the
-- outbox table has it end: a claim whose connection stalled (no FIN, no
-- reset) frees its lanes then, not when TCP keepalive gives up.
SELECT l.queue, l.lane, s.pos::integer AS pos,
       set_config('idle_in_transaction_session_timeout', (@idle_timeout_ms::bigint)::text, true) AS idle_timeout,
       set_config('plan_cache_mode', 'auto', true) AS plan_cache_mode,
       set_config('enable_bitmapscan', 'off', true) AS enable_bitmapscan,
       set_config('jit', 'off', true) AS jit,
       set_config('outboxgen.ring_move', 'on', true) AS ring_move
FROM (SELECT @queues::text[] AS queues, @from_lane::smallint AS from_lane, @to_lane::smallint AS to_lane,
             @turn::integer AS turn, sqlc.narg(ready)::integer[] AS ready) AS p
JOIN /*outbox:table*/outbox_ring_lanes AS l
  ON l.queue = ANY (p.queues) AND l.lane >= p.from_lane AND l.lane < p.to_lane
CROSS JOIN LATERAL (
    SELECT (array_position(p.queues, l.queue::text) - 1) * (p.to_lane - p.from_lane) + (l.lane - p.from_lane) AS pos,
           cardinality(p.queues) * (p.to_lane - p.from_lane) AS span) AS s
WHERE p.ready IS NULL OR s.pos = ANY (p.ready)
ORDER BY mod(s.pos - p.turn + s.span, s.span)
LIMIT @max_lanes::integer
FOR UPDATE OF l SKIP LOCKED;

-- name: RingReadyLanes :many
-- The positions (as RingTakeLanes counts them) of the lanes of @queues
-- between @from_lane and @to_lane (exclusive) that hold committed rows
-- their newest progress has not consumed, or whose newest progress is
-- older than @idle_progress_seconds (a claim writes a new one, so that
-- the ring turns past the lane). Read in a statement of its own, outside
-- any claim's transaction, so that it holds no partition: a hint of
-- which lanes a claim should take, each probe bounded by an index.
SELECT s.pos::integer AS pos
FROM (SELECT @queues::text[] AS queues, @from_lane::smallint AS from_lane, @to_lane::smallint AS to_lane) AS a
JOIN /*outbox:table*/outbox_ring_lanes AS l
  ON l.queue = ANY (a.queues) AND l.lane >= a.from_lane AND l.lane < a.to_lane
CROSS JOIN LATERAL (
    SELECT (array_position(a.queues, l.queue::text) - 1) * (a.to_lane - a.from_lane) + (l.lane - a.from_lane) AS pos) AS s
CROSS JOIN LATERAL (
    SELECT coalesce(n.snap, '1:1:'::pg_snapshot) AS snap, coalesce(n.below, 0) AS below,
           coalesce(extract(epoch FROM now() - n.at), 1e9) AS age
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (SELECT g.snap, g.below, g.at FROM /*outbox:table*/outbox_ring_progress AS g
                       WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n ON true) AS p
-- outbox_ring_since(p.snap, the statement's snapshot), written out: a
-- call of the SQL function for each lane cost about 3.5 µs.
CROSS JOIN LATERAL (
    SELECT coalesce((SELECT x FROM pg_snapshot_xip(p.snap) AS x WHERE pg_visible_in_snapshot(x, pg_current_snapshot())
                     ORDER BY x LIMIT 1), pg_snapshot_xmax(p.snap)) AS since) AS u
WHERE p.age > @idle_progress_seconds::float8
   -- Scalar subqueries in each index's order, not EXISTS (which drops
   -- the order): without the ring's statistics, the planner could
   -- otherwise read a lane's whole consumed backlog.
   OR (SELECT true FROM /*outbox:table*/outbox_ring AS r
       WHERE r.queue = l.queue AND r.lane = l.lane
         AND r.txid >= u.since
         AND NOT pg_visible_in_snapshot(r.txid, p.snap)
       ORDER BY r.queue, r.lane, r.txid, r.id LIMIT 1)
   OR (SELECT true FROM /*outbox:table*/outbox_ring AS r
       WHERE r.queue = l.queue AND r.lane = l.lane
         AND r.ordering_key IS NOT NULL AND r.id > p.below AND pg_visible_in_snapshot(r.txid, p.snap)
       ORDER BY r.queue, r.lane, r.id LIMIT 1)
ORDER BY s.pos;

-- name: RingPositions :many
-- Where each lane @lanes of @queues stands (arrays of one element per
-- lane), read in the claim's transaction once it holds the lanes it takes
-- (RingTakeLanes, whose statement's snapshot was taken before its locks):
-- its newest progress (seq 0 and the empty snapshot when it has none: the
-- lane reads from the ring's start), its id bound and its age; the
-- transaction's snapshot and id; the partitions the batch can reach
-- (those not done below the progress's xmin, and every one not emptied
-- since while a keyed lane's bound leaves rows that snapshot saw unread);
-- and the snapshots, bounds, lease ends and transaction ids of the claims
-- after that progress whose transactions aborted (crashed or lost
-- deliveries); and whether the lane's queue is paused (schema 14): then
-- the claim hands none of its rows out and moves them into the outbox
-- table, where they wait for the resume, and the ring turns past them.
SELECT w.queue::text AS queue, w.lane::smallint AS lane,
       coalesce(p.seq, 0)::bigint AS seq,
       coalesce(p.snap, '1:1:'::pg_snapshot)::text AS prev,
       coalesce(p.below, 0)::bigint AS below,
       coalesce(extract(epoch FROM now() - p.at), 1e9)::float8 AS age_seconds,
       pg_current_snapshot()::text AS cur,
       pg_current_xact_id()::text::bigint AS xid,
       coalesce((SELECT array_agg(t.slot ORDER BY t.slot) FROM /*outbox:table*/outbox_ring_turns AS t
                 WHERE t.done_below IS NULL OR t.done_below > pg_snapshot_xmin(coalesce(p.snap, '1:1:'::pg_snapshot))
                    OR p.below < 9223372036854775807),
                '{}')::smallint[] AS slots,
       coalesce(c.snaps, '{}')::text[] AS crashed,
       coalesce(c.belows, '{}')::bigint[] AS crashed_below,
       coalesce(c.untils, '{}')::timestamptz[] AS crashed_until,
       coalesce(c.xids, '{}')::bigint[] AS crashed_xids,
       EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = w.queue) AS paused
FROM (SELECT unnest(@queues::text[]) AS queue, unnest(@lanes::smallint[]) AS lane) AS w
LEFT JOIN LATERAL (
    SELECT g.seq, g.snap, g.below, g.at FROM /*outbox:table*/outbox_ring_progress AS g
    WHERE g.queue = w.queue AND g.lane = w.lane
    ORDER BY g.seq DESC LIMIT 1) AS p ON true
CROSS JOIN LATERAL (
    SELECT array_agg(a.snap::text ORDER BY a.xid) AS snaps, array_agg(a.below ORDER BY a.xid) AS belows,
           array_agg(a.until ORDER BY a.xid) AS untils, array_agg(a.xid::text::bigint ORDER BY a.xid) AS xids
    FROM /*outbox:table*/outbox_ring_claims AS a
    WHERE a.queue = w.queue AND a.lane = w.lane AND a.after_seq = coalesce(p.seq, 0)
      AND pg_xact_status(a.xid) = 'aborted') AS c;

-- name: RingRead :many
-- Up to @max_rows rows of the batch of lane @lane of @queue: visible to
-- snapshot @cur and not to @prev, in the partitions @slots, in (txid, id)
-- order, from the first transaction @cur sees done and @prev did not
-- (outbox_ring_since). A batch that fills is cut after its last
-- transaction's rows (RingReadRest) and its progress says so (a snapshot
-- whose xmin is the next txid).
SELECT r.id, r.payload, r.headers, r.created_at, r.next_attempt_at, r.txid
FROM (SELECT (@prev::text)::pg_snapshot AS prev, (@cur::text)::pg_snapshot AS cur) AS b
JOIN /*outbox:table*/outbox_ring AS r
  ON r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
 AND r.txid >= /*outbox:table*/outbox_ring_since(b.prev, b.cur)
 AND NOT pg_visible_in_snapshot(r.txid, b.prev)
 AND pg_visible_in_snapshot(r.txid, b.cur)
ORDER BY r.queue, r.lane, r.txid, r.id
LIMIT @max_rows;

-- name: RingReadRest :many
-- The rows of transaction @txid in lane @lane of @queue after row
-- @after_id: the rest of a full batch's last transaction.
SELECT r.id, r.payload, r.headers, r.created_at, r.next_attempt_at, r.txid
FROM /*outbox:table*/outbox_ring AS r
WHERE r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
  AND r.txid = (@txid::text)::xid8 AND r.id > @after_id
ORDER BY r.queue, r.lane, r.txid, r.id;

-- name: RingReadKeyed :many
-- Up to @max_rows rows of the batch of keyed lane @lane of @queue, in id
-- order, which within a key is commit order: the rows that snapshot @cur
-- sees and the lane's progress (@prev, @below) has not consumed. Those
-- of transactions that @prev did not see, with ids up to @below, come
-- whole; above @below, the @max_rows smallest ids (above marks them: the
-- batch's new bound is the largest). A key's earlier row committed
-- before its later row drew its id: every snapshot that sees the later
-- sees the earlier, whose smaller id puts it in the same batch or an
-- earlier one.
SELECT k.id, k.payload, k.headers, k.ordering_key, k.created_at, k.next_attempt_at, k.txid, k.above
FROM (
    SELECT r.id, r.payload, r.headers, r.ordering_key, r.created_at, r.next_attempt_at, r.txid, false AS above
    FROM (SELECT (@prev::text)::pg_snapshot AS prev, (@cur::text)::pg_snapshot AS cur) AS b
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
     AND r.txid >= /*outbox:table*/outbox_ring_since(b.prev, b.cur)
     AND r.id <= @below::bigint
     AND NOT pg_visible_in_snapshot(r.txid, b.prev)
     AND pg_visible_in_snapshot(r.txid, b.cur)
    UNION ALL
    (SELECT r.id, r.payload, r.headers, r.ordering_key, r.created_at, r.next_attempt_at, r.txid, true AS above
     FROM /*outbox:table*/outbox_ring AS r
     WHERE r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
       AND r.ordering_key IS NOT NULL AND r.id > @below::bigint
       AND pg_visible_in_snapshot(r.txid, (@cur::text)::pg_snapshot)
     ORDER BY r.queue, r.lane, r.id
     LIMIT @max_rows)
) AS k
ORDER BY k.id;

-- name: RingHeldKeys :many
-- The keys among @keys of which the outbox table holds a row of @queue:
-- the ring's rows of those keys go behind them.
SELECT k.key::text AS key
FROM unnest(@keys::text[]) AS k(key)
WHERE EXISTS (
    SELECT FROM /*outbox:table*/outbox AS o
    WHERE o.ordering_key IS NOT NULL AND o.queue = @queue AND o.ordering_key = k.key COLLATE "C");

-- name: RingRecord :one
-- Records, in a transaction of its own (autocommit), that the claim of
-- transaction @xid read, of each lane @lanes of @queues, the batch after
-- progress @after_seqs up to snapshot @snaps and id @belows (arrays of
-- one element per lane), and that its handlers may run for
-- @lease_ttl_seconds from now. It records nothing, and recorded is false,
-- when that transaction is no longer in progress: its lanes are free,
-- and their rows must not be handed to handlers.
WITH session AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit, (@xid::bigint)::text::xid8 AS xid
), record AS (
    INSERT INTO /*outbox:table*/outbox_ring_claims (queue, lane, after_seq, xid, snap, below, until)
    SELECT b.queue, b.lane, b.after_seq, session.xid, b.snap::pg_snapshot, b.below,
           now() + make_interval(secs => @lease_ttl_seconds::float8)
    FROM session
    CROSS JOIN (SELECT unnest(@queues::text[]) AS queue, unnest(@lanes::smallint[]) AS lane,
                       unnest(@after_seqs::bigint[]) AS after_seq, unnest(@snaps::text[]) AS snap,
                       unnest(@belows::bigint[]) AS below) AS b
    WHERE pg_xact_status(session.xid) = 'in progress'
    RETURNING 1
)
SELECT EXISTS (SELECT FROM record) AS recorded;

-- name: RingConfirm :exec
-- Runs in the claim's transaction once its record has committed: that it
-- succeeds shows the transaction, and so the lane's lock, outlived the
-- record's commit.
SELECT 1;

-- name: RingMove :execrows
-- Moves rows @ids (of transactions @txids) of lane @lane of @queue, in
-- the partitions @slots, into the outbox table with their ids, each with
-- its delivery count @deliveries: leased with @token for
-- @lease_ttl_seconds where @leased is true (rows whose handlers run on,
-- or whose failure the lease path writes next), else waiting for a claim
-- (rows no handler started, rows not yet due, rows of keys the outbox
-- table holds); in id order, in one statement, so that a key's rows take
-- their places behind each other (keeping their ids, see RingTakeLanes),
-- its leased row first. Fewer rows moved than given means the ring no
-- longer holds them.
INSERT INTO /*outbox:table*/outbox
    (id, queue, payload, headers, ordering_key, created_at, next_attempt_at, deliveries_count, acquired_token, acquired_at, lease_expires_at)
OVERRIDING SYSTEM VALUE
SELECT r.id, r.queue, r.payload, r.headers, r.ordering_key, r.created_at, r.next_attempt_at, m.deliveries,
       CASE WHEN m.leased THEN l.token END,
       CASE WHEN m.leased THEN clock_timestamp() END,
       CASE WHEN m.leased THEN clock_timestamp() + make_interval(secs => l.ttl) END
FROM (SELECT sqlc.narg(token)::uuid AS token, @lease_ttl_seconds::float8 AS ttl) AS l
CROSS JOIN (SELECT unnest(@ids::bigint[]) AS id, unnest(@txids::bigint[]) AS txid, unnest(@deliveries::integer[]) AS deliveries,
                   unnest(@leased::boolean[]) AS leased) AS m
JOIN /*outbox:table*/outbox_ring AS r
  ON r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane AND r.txid = m.txid::text::xid8 AND r.id = m.id
ORDER BY r.id;

-- name: RingWaitAcks :exec
-- Waits, in the claim's transaction, for the acknowledgements that
-- claims of transactions @xids, found aborted, are recording (RingAck
-- holds a claim's lock until it commits, and a claim writes one at a
-- time), and keeps new ones from being recorded until it ends: the move
-- that follows (RingMoveCrashed), in the next statement, sees each of
-- them. Shared, so that the readers of a dead claim's other lanes do not
-- wait for each other.
SELECT pg_advisory_xact_lock_shared(
           ((/*outbox:literal*/'outbox_ring_acks'::regclass::oid)::bigint - 2147483648)::integer,
           (x.xid % 4294967296 - 2147483648)::integer)
FROM unnest(@xids::bigint[]) AS x(xid);

-- name: RingMoveCrashed :one
-- Moves the rows of lane @lane of @queue that snapshot @cur sees and the
-- lane's progress (@prev, @below) has not consumed, in the partitions
-- @slots, into the outbox table, unleased, in id order (a keyed row
-- keeps its id and its place behind its key's), but for the rows that
-- claims whose transactions aborted acknowledged before handing their
-- keys' next rows out (those of transactions @crashed_xids, see
-- RingAck): they are consumed. Each row moved counts the deliveries that
-- those claims made of it (those of the snapshots @crashed, with bounds
-- @crashed_below, that consumed it: every unkeyed row, and of each key
-- the first row not acknowledged, which ran while the rest of the key's
-- rows waited for it): from there, each row counts toward MaxDeliveries
-- on its own, so a row that kills its subscriber does not take its batch
-- down with it again. A row such a claim delivered is due no sooner
-- than that claim's lease would have expired (@crashed_until): its
-- handler may still run (its process lives on, and only its connection
-- died), as a claim by lock of the outbox table's rows waits too
-- (RecordLock); a key's later rows wait behind it. Returns how many rows
-- moved, and the largest id the lane consumed (0 for none).
WITH crashed AS MATERIALIZED (
    SELECT ((@crashed::text[])[c.i])::pg_snapshot AS snap, (@crashed_below::bigint[])[c.i] AS below,
           (@crashed_until::timestamptz[])[c.i] AS held, (((@crashed_xids::bigint[])[c.i])::text)::xid8 AS xid
    FROM generate_subscripts(@crashed::text[], 1) AS c(i)
), acked AS MATERIALIZED (
    SELECT DISTINCT a.id
    FROM crashed
    JOIN /*outbox:table*/outbox_ring_acks AS k ON k.xid = crashed.xid
    CROSS JOIN LATERAL unnest(k.ids) AS a(id)
), unread AS MATERIALIZED (
    SELECT r.* FROM (SELECT (@prev::text)::pg_snapshot AS prev, (@cur::text)::pg_snapshot AS cur) AS b
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
     AND r.txid >= /*outbox:table*/outbox_ring_since(b.prev, b.cur)
     AND NOT pg_visible_in_snapshot(r.txid, b.prev)
     AND pg_visible_in_snapshot(r.txid, b.cur)
    UNION ALL
    SELECT r.* FROM /*outbox:table*/outbox_ring AS r
    WHERE r.slot = ANY (@slots::smallint[]) AND r.queue = @queue AND r.lane = @lane
      AND r.ordering_key IS NOT NULL AND r.id > @below::bigint
      AND pg_visible_in_snapshot(r.txid, (@prev::text)::pg_snapshot)
      AND pg_visible_in_snapshot(r.txid, (@cur::text)::pg_snapshot)
), kept AS MATERIALIZED (
    SELECT u.* FROM unread AS u WHERE u.id NOT IN (SELECT acked.id FROM acked)
), delivered AS (
    SELECT b.id, count(*)::integer AS deliveries, max(b.held) AS until
    FROM (
        SELECT k.id, k.ordering_key, c.held, row_number() OVER (PARTITION BY c.xid, k.ordering_key ORDER BY k.id) AS nth
        FROM crashed AS c
        JOIN kept AS k ON pg_visible_in_snapshot(k.txid, c.snap) AND k.id <= c.below) AS b
    WHERE b.ordering_key IS NULL OR b.nth = 1
    GROUP BY b.id
), moved AS (
    INSERT INTO /*outbox:table*/outbox (id, queue, payload, headers, ordering_key, created_at, next_attempt_at, deliveries_count)
    OVERRIDING SYSTEM VALUE
    SELECT k.id, k.queue, k.payload, k.headers, k.ordering_key, k.created_at,
           greatest(k.next_attempt_at, d.until), coalesce(d.deliveries, 0)
    FROM kept AS k
    LEFT JOIN delivered AS d ON d.id = k.id
    ORDER BY k.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved)::bigint AS moved, coalesce((SELECT max(u.id) FROM unread AS u), 0)::bigint AS last_id;

-- name: RingAck :one
-- Records, in a transaction of its own (autocommit), that the claim of
-- transaction @xid acknowledged rows @ids of its keyed lanes, before it
-- hands the rows of their keys that follow them out: should its
-- transaction abort, the lanes' next reader leaves them out of the move
-- (RingMoveCrashed). It records nothing, and recorded is false, when
-- that transaction is no longer in progress, or a reader that found it
-- aborted holds its lock (RingWaitAcks): then no next row may run.
-- Committed as the session's synchronous_commit says: a server crash
-- aborts the claim, and the acknowledgements must outlive it.
WITH claim AS MATERIALIZED (
    SELECT x.xid, pg_try_advisory_xact_lock(
               ((/*outbox:literal*/'outbox_ring_acks'::regclass::oid)::bigint - 2147483648)::integer,
               (x.xid % 4294967296 - 2147483648)::integer) AS locked
    FROM (SELECT @xid::bigint AS xid) AS x
), record AS (
    INSERT INTO /*outbox:table*/outbox_ring_acks (xid, ids)
    SELECT (claim.xid::text)::xid8, @ids::bigint[]
    FROM claim
    WHERE claim.locked AND pg_xact_status((claim.xid::text)::xid8) = 'in progress'
    RETURNING 1
)
SELECT EXISTS (SELECT FROM record) AS recorded;

-- name: RingLockKeyedLanes :many
-- Locks, in the keyed move's transaction, the free keyed lanes (4 to 7)
-- of @queues, and turns JIT off for the move (see RingTakeLanes). The move
-- is the transaction's next statement: its snapshot, taken after these
-- locks, sees the progress of every move that held them before.
SELECT l.queue, l.lane, set_config('jit', 'off', true) AS jit
FROM /*outbox:table*/outbox_ring_lanes AS l
WHERE l.queue = ANY (@queues::text[]) AND l.lane >= 4 AND l.lane < 8
ORDER BY l.queue, l.lane
FOR UPDATE SKIP LOCKED;

-- name: RingMoveKeyed :one
-- Moves the rows of the keyed lanes (@lane_queues, @lanes), which the
-- transaction locked (RingLockKeyedLanes), that their newest progress
-- has not seen into the outbox table, in id order, through the table's
-- key trigger: a key's rows take the outbox table's per-key order,
-- hand-overs and leases, behind the key's rows already there. Then
-- writes each lane's progress (up to the largest id moved: every row
-- the snapshot sees), when rows of it moved or its newest is
-- older than @idle_progress_seconds (so that the ring can turn past an
-- idle lane). Returns how many rows moved.
WITH lane AS MATERIALIZED (
    SELECT unnest(@lane_queues::text[]) AS queue, unnest(@lanes::smallint[]) AS lane
), pos AS MATERIALIZED (
    SELECT lane.queue, lane.lane,
           coalesce(p.snap, '1:1:'::pg_snapshot) AS prev,
           coalesce(p.below, 0) AS below,
           coalesce(extract(epoch FROM now() - p.at), 1e9) AS age,
           pg_current_snapshot() AS cur
    FROM lane
    LEFT JOIN LATERAL (
        SELECT g.snap, g.below, g.at FROM /*outbox:table*/outbox_ring_progress AS g
        WHERE g.queue = lane.queue AND g.lane = lane.lane
        ORDER BY g.seq DESC LIMIT 1) AS p ON true
), batch AS MATERIALIZED (
    SELECT r.id, r.queue, r.lane, r.payload, r.headers, r.ordering_key, r.created_at, r.next_attempt_at
    FROM pos
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.queue = pos.queue AND r.lane = pos.lane
     AND r.txid >= /*outbox:table*/outbox_ring_since(pos.prev, pos.cur)
     AND NOT pg_visible_in_snapshot(r.txid, pos.prev)
     AND pg_visible_in_snapshot(r.txid, pos.cur)
    UNION ALL
    SELECT r.id, r.queue, r.lane, r.payload, r.headers, r.ordering_key, r.created_at, r.next_attempt_at
    FROM pos
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.queue = pos.queue AND r.lane = pos.lane
     AND r.ordering_key IS NOT NULL AND r.id > pos.below
     AND pg_visible_in_snapshot(r.txid, pos.prev)
     AND pg_visible_in_snapshot(r.txid, pos.cur)
), moved AS (
    INSERT INTO /*outbox:table*/outbox (queue, payload, headers, ordering_key, created_at, next_attempt_at)
    SELECT b.queue, b.payload, b.headers, b.ordering_key, b.created_at, b.next_attempt_at
    FROM batch AS b
    ORDER BY b.id
    RETURNING 1
), progress AS (
    INSERT INTO /*outbox:table*/outbox_ring_progress (queue, lane, snap, below)
    SELECT pos.queue, pos.lane, pos.cur,
           greatest(pos.below, (SELECT max(b.id) FROM batch AS b WHERE b.queue = pos.queue AND b.lane = pos.lane))
    FROM pos
    WHERE pos.age > @idle_progress_seconds::float8
       OR EXISTS (SELECT FROM batch AS b WHERE b.queue = pos.queue AND b.lane = pos.lane)
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved)::integer AS moved, (SELECT count(*) FROM progress)::integer AS progressed;

-- name: RingProgress :exec
-- Acknowledges, in the claim's transaction, of each lane @lanes of
-- @queues, every row of its batch up to snapshot @snaps and id @belows
-- that did not move to the outbox table: the lane's next batch starts
-- there.
INSERT INTO /*outbox:table*/outbox_ring_progress (queue, lane, snap, below)
SELECT p.queue, p.lane, p.snap::pg_snapshot, p.below
FROM (SELECT unnest(@queues::text[]) AS queue, unnest(@lanes::smallint[]) AS lane, unnest(@snaps::text[]) AS snap,
             unnest(@belows::bigint[]) AS below) AS p;

-- name: RingTurnState :one
-- The partition writers write into, how long since they moved there, and
-- whether the next one is empty and may be written (a turn may move
-- writers there).
SELECT t.slot, extract(epoch FROM now() - t.since)::float8 AS age_seconds,
       (SELECT n.done_below IS NULL FROM /*outbox:table*/outbox_ring_turns AS n WHERE n.slot = (t.slot + 1) % 4)::boolean AS next_open
FROM /*outbox:table*/outbox_ring_turns AS t
WHERE t.slot = /*outbox:table*/outbox_ring_slot_now();

-- name: RingNextSlot :one
-- Moves writers from partition @slot to the next, unless another turn
-- moved them already or runs now, or the next is not open (emptied and
-- unmarked: a turn that read the ring's state before others went round
-- it must not send writers into a partition that holds rows); returns
-- the partition writers write into after it, and whether this statement
-- moved them.
SELECT coalesce(t.moved, /*outbox:table*/outbox_ring_slot_now())::smallint AS slot, (t.moved IS NOT NULL)::boolean AS turned
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT nextval(/*outbox:literal*/'outbox_ring_slot')::smallint AS moved
    FROM (SELECT 1) AS x
    WHERE pg_try_advisory_xact_lock(/*outbox:literal*/'outbox_ring_slot'::regclass::oid::bigint)
      AND /*outbox:table*/outbox_ring_slot_now() = @slot::smallint
      AND (SELECT n.done_below IS NULL FROM /*outbox:table*/outbox_ring_turns AS n WHERE n.slot = ((@slot::smallint) + 1) % 4)
) AS t ON true;

-- name: RingCloseSlot :exec
-- Marks partition @slot, which writers left, as no longer written by
-- transactions from this statement's own on, and the next as written
-- since now; in a transaction after the turn's. A writer takes its xid
-- before it reads the slot (txid's default runs before slot's), so every
-- writer that read the old slot took its xid before the turn, and ids
-- are given in order: each is below this transaction's. (This
-- snapshot's xmax is no such bound: it is one past the newest xid that
-- had ended, and a writer whose xid came after that one may be running
-- above it, its row in the old partition.) The next partition keeps its
-- mark: it is unmarked already unless another turn moved writers past
-- it meanwhile, and then that turn's mark stands.
UPDATE /*outbox:table*/outbox_ring_turns AS t
SET done_below = CASE WHEN t.slot = a.slot THEN pg_current_xact_id() ELSE t.done_below END,
    since = CASE WHEN t.slot = a.slot THEN t.since ELSE now() END
FROM (SELECT (@slot::smallint) AS slot) AS a
WHERE t.slot = a.slot OR t.slot = (a.slot + 1) % 4;

-- name: RingDoneSlots :many
-- The partitions, other than the one written, that writers left and
-- every lane of every queue has read past (outbox_ring_read_past).
SELECT t.slot FROM /*outbox:table*/outbox_ring_turns AS t
WHERE t.done_below IS NOT NULL
  AND t.slot <> /*outbox:table*/outbox_ring_slot_now()
  AND /*outbox:table*/outbox_ring_read_past(t.slot)
ORDER BY t.slot;

-- name: RingTruncate :one
-- Empties partition @slot unless a transaction holds a lock on it.
SELECT /*outbox:table*/outbox_ring_truncate(@slot::smallint) AS truncated;

-- name: RingPrune :exec
-- Deletes the progress rows behind each lane's newest, the records of
-- claims after them, and the acknowledgements of claims older than every
-- record left: every read is of the newest, so these are behind every
-- scan. (A claim in progress keeps its record: it holds its lanes, whose
-- newest progress it read.)
WITH newest AS (
    SELECT l.queue, l.lane,
           (SELECT g.seq FROM /*outbox:table*/outbox_ring_progress AS g
            WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS seq
    FROM /*outbox:table*/outbox_ring_lanes AS l
), progress AS (
    DELETE FROM /*outbox:table*/outbox_ring_progress AS g
    USING newest AS n
    WHERE g.queue = n.queue AND g.lane = n.lane AND g.seq < n.seq
), acks AS (
    DELETE FROM /*outbox:table*/outbox_ring_acks AS k
    -- (xid8 has no min() before PostgreSQL 15.)
    WHERE k.xid < coalesce((SELECT c.xid FROM /*outbox:table*/outbox_ring_claims AS c ORDER BY c.xid LIMIT 1),
                           '18446744073709551615'::xid8)
)
DELETE FROM /*outbox:table*/outbox_ring_claims AS c
USING newest AS n
WHERE c.queue = n.queue AND c.lane = n.lane AND c.after_seq < n.seq;

-- name: RingAddLanes :exec
-- Gives each queue of @queues its lanes, unless it has them: a
-- subscriber's queues have their lanes before it claims. (A queue's rows
-- written before any subscriber of it ran get theirs from the turn that
-- finds them: outbox_ring_truncate.)
INSERT INTO /*outbox:table*/outbox_ring_lanes (queue, lane)
SELECT q.queue, l.lane FROM unnest(@queues::text[]) AS q(queue), generate_series(0, 7) AS l(lane)
ON CONFLICT DO NOTHING;

-- name: RingPresent :one
-- Whether the outbox has the ring beside its table.
SELECT (to_regclass(/*outbox:literal*/'outbox_ring') IS NOT NULL)::boolean AS present;

-- name: RingInUse :one
-- Whether the ring is in use for any of @queues: a claimer gave them
-- lanes (a subscriber read their rows there, or a turn found their rows),
-- or the ring holds rows of theirs. Until it is, a subscriber claims from
-- the outbox table alone and asks again now and then (claim.byRing).
SELECT (EXISTS (SELECT FROM /*outbox:table*/outbox_ring_lanes AS l WHERE l.queue = ANY (@queues::text[]))
        OR EXISTS (SELECT FROM /*outbox:table*/outbox_ring AS r WHERE r.queue = ANY (@queues::text[])))::boolean AS in_use;

-- name: RingQueueDepths :many
-- Per queue of the ring, its rows that the newest progress of their lane
-- has not consumed, those of queues that have no lanes yet included: due
-- now (ready), due later (scheduled), how long, in seconds, the ready row
-- due earliest has been due (0 when none is), and the age of the oldest
-- (0 when none). Rows a claim of lanes still in flight holds count as
-- ready until its end writes their lane's progress, as rows a claim by
-- row lock of the outbox table holds count as ready there. A queue's rows
-- are read lane after lane, each in the order the lane reads them, and
-- stop at @count_cap: a count equal to it means at least that many, and
-- the wait and the age are the longest among the rows looked at. Bounded
-- by the indexes, from where each progress's unseen rows start
-- (outbox_ring_since) and, for keyed lanes, its id bound; the queues are
-- found one index probe each.
WITH RECURSIVE q(queue) AS (
    (SELECT r.queue FROM /*outbox:table*/outbox_ring AS r ORDER BY r.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT r.queue FROM /*outbox:table*/outbox_ring AS r WHERE r.queue > q.queue ORDER BY r.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
), pos AS MATERIALIZED (
    SELECT l.queue, l.lane, coalesce(n.snap, '1:1:'::pg_snapshot) AS snap, coalesce(n.below, 9223372036854775807) AS below
    FROM /*outbox:table*/outbox_ring_lanes AS l
    LEFT JOIN LATERAL (SELECT g.snap, g.below FROM /*outbox:table*/outbox_ring_progress AS g
                       WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n ON true
)
SELECT q.queue::text AS queue,
       least(count(*) FILTER (WHERE u.next_attempt_at <= now()), @count_cap::bigint)::bigint AS ready,
       least(count(*) FILTER (WHERE u.next_attempt_at > now()), @count_cap::bigint)::bigint AS scheduled,
       coalesce(date_part('epoch', now()) - date_part('epoch', min(u.next_attempt_at) FILTER (WHERE u.next_attempt_at <= now())),
                0)::float8 AS oldest_ready_wait_seconds,
       coalesce(date_part('epoch', now()) - date_part('epoch', min(u.created_at)), 0)::float8 AS oldest_age_seconds
FROM q
CROSS JOIN LATERAL (
    SELECT x.next_attempt_at, x.created_at
    FROM (
        SELECT a.next_attempt_at, a.created_at
        FROM pos AS p
        CROSS JOIN LATERAL (
            SELECT r.next_attempt_at, r.created_at FROM /*outbox:table*/outbox_ring AS r
            WHERE r.queue = p.queue AND r.lane = p.lane
              AND r.txid >= /*outbox:table*/outbox_ring_since(p.snap, pg_current_snapshot())
              AND NOT pg_visible_in_snapshot(r.txid, p.snap)
            LIMIT @count_cap::bigint) AS a
        WHERE p.queue = q.queue
        UNION ALL
        SELECT k.next_attempt_at, k.created_at
        FROM pos AS p
        CROSS JOIN LATERAL (
            SELECT r.next_attempt_at, r.created_at FROM /*outbox:table*/outbox_ring AS r
            WHERE r.queue = p.queue AND r.lane = p.lane
              AND r.ordering_key IS NOT NULL AND r.id > p.below AND pg_visible_in_snapshot(r.txid, p.snap)
            LIMIT @count_cap::bigint) AS k
        WHERE p.queue = q.queue
        UNION ALL
        SELECT r.next_attempt_at, r.created_at
        FROM /*outbox:table*/outbox_ring AS r
        WHERE r.queue = q.queue
          AND NOT EXISTS (SELECT FROM /*outbox:table*/outbox_ring_lanes AS x WHERE x.queue = q.queue AND x.lane = 0)
    ) AS x
    LIMIT @count_cap::bigint
) AS u
WHERE q.queue IS NOT NULL
GROUP BY q.queue
ORDER BY q.queue;

-- name: RingLanesBehind :many
-- The lanes that have not read partition @slot past (as
-- outbox_ring_read_past judges it), at most @max_rows of them, oldest
-- first: each lane's queue and number, and the age in seconds of its
-- first row there that its newest progress did not consume (in the order
-- the lane reads them). One index probe per lane.
SELECT b.queue::text AS queue, b.lane::smallint AS lane, b.age_seconds::float8 AS age_seconds
FROM (
    SELECT l.queue, l.lane, date_part('epoch', now()) - date_part('epoch', least(u.created_at, k.created_at)) AS age_seconds
    FROM /*outbox:table*/outbox_ring_lanes AS l
    CROSS JOIN LATERAL (
        SELECT coalesce(n.snap, '1:1:'::pg_snapshot) AS snap, coalesce(n.below, 9223372036854775807) AS below
        FROM (SELECT 1) AS one
        LEFT JOIN LATERAL (SELECT g.snap, g.below FROM /*outbox:table*/outbox_ring_progress AS g
                           WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n ON true) AS p
    LEFT JOIN LATERAL (
        SELECT r.created_at FROM /*outbox:table*/outbox_ring AS r
        WHERE r.slot = @slot::smallint AND r.queue = l.queue AND r.lane = l.lane
          AND r.txid >= /*outbox:table*/outbox_ring_since(p.snap, pg_current_snapshot())
          AND NOT pg_visible_in_snapshot(r.txid, p.snap)
        ORDER BY r.txid, r.id LIMIT 1) AS u ON true
    LEFT JOIN LATERAL (
        SELECT r.created_at FROM /*outbox:table*/outbox_ring AS r
        WHERE r.slot = @slot::smallint AND r.queue = l.queue AND r.lane = l.lane
          AND r.ordering_key IS NOT NULL AND r.id > p.below AND pg_visible_in_snapshot(r.txid, p.snap)
        ORDER BY r.id LIMIT 1) AS k ON true
    WHERE u.created_at IS NOT NULL OR k.created_at IS NOT NULL
) AS b
ORDER BY b.age_seconds DESC, b.queue, b.lane
LIMIT @max_rows::integer;

-- name: RingPartitionLocks :many
-- The sessions, other than the caller's, that hold a lock on partition
-- @slot of the ring, which a turn's TRUNCATE (NOWAIT) then cannot take:
-- an open writer of the partition (RowExclusiveLock), a pg_dump
-- (AccessShareLock, for the whole dump), a transaction that read it. As
-- OldestXmin reads sessions: the open time and state of another role's
-- session show only to roles with its privileges or pg_read_all_stats.
SELECT format('pid %s (%s%s)', k.pid, coalesce(a.usename::text, '?'),
              CASE WHEN a.application_name <> '' THEN ', ' || a.application_name ELSE '' END)::text AS name,
       string_agg(DISTINCT k.mode, ', ' ORDER BY k.mode)::text AS modes,
       coalesce(date_part('epoch', now() - a.xact_start), 0)::float8 AS xact_seconds,
       coalesce(a.state, '')::text AS state,
       coalesce(NOT (pg_has_role(a.usesysid, 'USAGE') OR pg_has_role('pg_read_all_stats', 'USAGE')), true)::boolean AS hidden
FROM pg_catalog.pg_locks AS k
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = k.pid
WHERE k.locktype = 'relation' AND k.granted AND k.pid <> pg_backend_pid()
  AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  AND k.relation = CASE @slot::smallint WHEN 0 THEN /*outbox:literal*/'outbox_ring_p0'::regclass
                                         WHEN 1 THEN /*outbox:literal*/'outbox_ring_p1'::regclass
                                         WHEN 2 THEN /*outbox:literal*/'outbox_ring_p2'::regclass
                                         WHEN 3 THEN /*outbox:literal*/'outbox_ring_p3'::regclass END
GROUP BY k.pid, a.usename, a.application_name, a.xact_start, a.state, a.usesysid
ORDER BY xact_seconds DESC, k.pid;

-- name: RingHealthSettings :exec
-- Sets, for the rest of the calling transaction, what Health's reads of
-- the ring need: JIT off (the planner has no statistics of the ring's
-- small tables, and its estimates of statements that join them pass
-- jit_above_cost), and a lock wait of at most a second for a partition
-- someone holds exclusively.
SELECT set_config('jit', 'off', true), set_config('lock_timeout', '1s', true);

-- name: RingRebaseLock :exec
-- Rebase (after a restore into another cluster), first statement: keeps
-- writers, claims and turns of the ring out until the transaction ends.
LOCK TABLE /*outbox:table*/outbox_ring, /*outbox:table*/outbox_ring_lanes, /*outbox:table*/outbox_ring_progress,
           /*outbox:table*/outbox_ring_claims, /*outbox:table*/outbox_ring_acks, /*outbox:table*/outbox_ring_turns
    IN SHARE ROW EXCLUSIVE MODE;

-- name: RingRebaseDeleteConsumed :execrows
-- Rebase, second statement: deletes the rows that the newest progress of
-- their lane consumed, judged with the transaction ids and snapshots of
-- the cluster that wrote both (the rows and progress of a dump or of a
-- logical replica come from it, with its numbering).
DELETE FROM /*outbox:table*/outbox_ring AS r
USING (
    SELECT l.queue, l.lane, n.snap, n.below
    FROM /*outbox:table*/outbox_ring_lanes AS l
    CROSS JOIN LATERAL (SELECT g.snap, g.below FROM /*outbox:table*/outbox_ring_progress AS g
                        WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n
) AS p
WHERE r.queue = p.queue AND r.lane = p.lane AND r.id <= p.below AND pg_visible_in_snapshot(r.txid, p.snap);

-- name: RingRebaseRows :execrows
-- Rebase, third statement: the rows left, none consumed, take this
-- transaction's id in place of the other cluster's, so that every
-- snapshot taken after it commits sees them, whatever the two clusters'
-- transaction counters were; within a lane they keep their order (id
-- order, which is commit order within a key).
UPDATE /*outbox:table*/outbox_ring AS r SET txid = pg_current_xact_id();

-- name: RingRebaseForget :exec
-- Rebase, last statement: forgets the progress, the records of claims and
-- their acknowledgements, whose transaction ids and snapshots are the
-- other cluster's (a lane reads its rows from the ring's start again,
-- and reading one again costs it nothing), and closes the partitions
-- writers had left below this transaction's snapshot, so that every lane
-- reads them.
WITH progress AS (
    DELETE FROM /*outbox:table*/outbox_ring_progress
), claims AS (
    DELETE FROM /*outbox:table*/outbox_ring_claims
), acks AS (
    DELETE FROM /*outbox:table*/outbox_ring_acks
)
UPDATE /*outbox:table*/outbox_ring_turns AS t
SET done_below = pg_snapshot_xmax(pg_current_snapshot())
WHERE t.done_below IS NOT NULL;

-- name: RingUnprocessed :many
-- Up to @max_rows rows of @queue in the ring that the newest progress of
-- their lane has not consumed, as RingQueueDepths counts them, in id
-- order: Outbox.Unprocessed's rows of the ring. It takes no lock and
-- changes nothing. It reads each lane from where its progress's unseen
-- rows start, through the ring's indexes, and orders what it found: a
-- peek for tests and debugging, which reads a queue's whole unconsumed
-- backlog in the ring.
WITH pos AS MATERIALIZED (
    SELECT l.lane, coalesce(n.snap, '1:1:'::pg_snapshot) AS snap, coalesce(n.below, 9223372036854775807) AS below
    FROM /*outbox:table*/outbox_ring_lanes AS l
    LEFT JOIN LATERAL (SELECT g.snap, g.below FROM /*outbox:table*/outbox_ring_progress AS g
                       WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n ON true
    WHERE l.queue = @queue::text
)
SELECT u.id, u.payload, u.headers,
       least(greatest(u.next_attempt_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00')::timestamptz AS next_attempt_at
FROM (
    SELECT r.id, r.payload, r.headers, r.next_attempt_at
    FROM pos AS p
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.queue = @queue::text AND r.lane = p.lane
     AND r.txid >= /*outbox:table*/outbox_ring_since(p.snap, pg_current_snapshot())
     AND NOT pg_visible_in_snapshot(r.txid, p.snap)
    UNION ALL
    SELECT r.id, r.payload, r.headers, r.next_attempt_at
    FROM pos AS p
    JOIN /*outbox:table*/outbox_ring AS r
      ON r.queue = @queue::text AND r.lane = p.lane
     AND r.ordering_key IS NOT NULL AND r.id > p.below AND pg_visible_in_snapshot(r.txid, p.snap)
    UNION ALL
    SELECT r.id, r.payload, r.headers, r.next_attempt_at
    FROM /*outbox:table*/outbox_ring AS r
    WHERE r.queue = @queue::text
      AND NOT EXISTS (SELECT FROM /*outbox:table*/outbox_ring_lanes AS x WHERE x.queue = @queue::text AND x.lane = 0)
) AS u
ORDER BY u.id
LIMIT @max_rows::integer;
