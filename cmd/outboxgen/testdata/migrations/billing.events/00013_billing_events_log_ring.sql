-- outboxgen: billing.events 00013_log_ring.sql
-- The log tier: a ring of partitions beside the outbox table, which stays
-- the state tier.
--
-- Every writer may INSERT into <table>_ring as into the outbox table
-- (txid and slot are filled by defaults, id from the outbox's sequence);
-- nothing updates or deletes its rows. A subscriber reads a queue's rows
-- per lane by snapshot difference: a batch is the rows visible to the
-- claim's snapshot and not to the lane's newest progress row, whose
-- insert, in the claim's transaction, acknowledges every row of the
-- batch at once. Rows that need per-row state (a failure, a handler that
-- outlives LockWindow, a row not yet due, a keyed row behind its key in
-- the table, the rows of a claim that died) go to the outbox table, whose
-- claims, leases, hand-overs and dead letters serve them as before.
-- Partitions are emptied by TRUNCATE once every lane has read past them,
-- so the ring writes no row version per consumed message and a held
-- vacuum horizon leaves nothing behind in it. docs/architecture.md
-- describes it.
--
-- Upgrading: new tables, functions and a sequence; the outbox table is
-- not locked beyond what replacing its key trigger's function takes
-- (nothing a writer or a claim holds), so subscribers and writers of
-- schema 12 run on through it. Subscribers of this release claim from
-- both tiers once the ring exists. Roles need the new grants
-- (outboxgen grants, Outbox.Grant) to write into the ring or read it.
--
-- Down moves every row the ring holds that its lane has not consumed into
-- the outbox table, in id order, keeping its id (a keyed row whose key
-- has a later row in the table goes behind it), then drops the ring. It
-- waits for the ring's writers and claims in flight to end. The
-- deliveries made by claims of the ring that died are not carried over:
-- their rows arrive as never delivered.

-- +goose Up
-- Which partition writers write into: read with pg_sequence_last_value,
-- outside any snapshot, so that a turn is seen at once; a query of the
-- sequence per row would cost a quarter of a one-row publish.
CREATE SEQUENCE "billing"."events_ring_slot" MINVALUE 0 MAXVALUE 3 START 0 CYCLE;
-- Called once, so that its last value is the partition written (0) and
-- the next turn moves writers to 1.
SELECT nextval('"billing"."events_ring_slot"');

CREATE FUNCTION "billing"."events_ring_slot_now"() RETURNS smallint
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(pg_sequence_last_value('"billing"."events_ring_slot"'), 0)::smallint
$$;

-- The least transaction id among the rows that snapshot cur sees and
-- snapshot prev does not: prev's xmax, or the least of the transactions
-- prev saw running that cur sees done. A scan of those rows in txid
-- order starts here, not at prev's xmin: a transaction that stays open
-- (an idle one holding the vacuum horizon, say) keeps every snapshot's
-- xmin where it began, and a scan from there read again every row
-- written since, batch after batch. Not STRICT: the planner folds a
-- strict function's call with a NULL argument to NULL without asking
-- whether the caller may execute it.
CREATE FUNCTION "billing"."events_ring_since"(prev pg_snapshot, cur pg_snapshot) RETURNS xid8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT x FROM pg_snapshot_xip(prev) AS x WHERE pg_visible_in_snapshot(x, cur) ORDER BY x LIMIT 1),
                    pg_snapshot_xmax(prev))
$$;

-- txid is declared before slot, so its default runs first: a transaction
-- has its xid before it reads the slot, which is what lets a turn know
-- below which xid the old partition is no longer written. ids come from
-- the outbox table's sequence: a row keeps its id when it moves there.
-- Lanes 0-3 hold unkeyed rows (by id), lanes 4-7 keyed rows (by key), so
-- a key's rows are read by one reader at a time, in commit order.
CREATE TABLE "billing"."events_ring" (
    id              bigint      NOT NULL DEFAULT nextval('"billing"."events_id_seq"'),
    queue           text        COLLATE "C" NOT NULL,
    payload         bytea       NOT NULL,
    -- json, not jsonb as in the outbox table: a row is read out as text
    -- once, and json's text is its stored form, where jsonb's must be
    -- rebuilt (about 1 µs of a drained message's server CPU, 3-4x
    -- json's). Its check casts it to jsonb, so that the ring takes exactly
    -- the headers the outbox table takes (jsonb refuses \u0000, lone
    -- surrogates and numbers past numeric's range, which json keeps) and
    -- a row's move into the table can never fail on them.
    headers         json,
    ordering_key    text        COLLATE "C",
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    txid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    slot            smallint    NOT NULL DEFAULT "billing"."events_ring_slot_now"(),
    lane            smallint    NOT NULL GENERATED ALWAYS AS (
        CASE WHEN ordering_key IS NULL THEN (id % 4)::smallint
             ELSE (4 + ((hashtext(ordering_key) % 4) + 4) % 4)::smallint END) STORED,
    CONSTRAINT "events_ring_queue_chk" CHECK (octet_length(queue) BETWEEN 1 AND 255),
    CONSTRAINT "events_ring_headers_chk" CHECK (headers IS NULL OR jsonb_typeof(headers::jsonb) = 'object')
) PARTITION BY LIST (slot);

CREATE TABLE "billing"."events_ring_p0" PARTITION OF "billing"."events_ring" FOR VALUES IN (0) WITH (autovacuum_enabled = off);
CREATE TABLE "billing"."events_ring_p1" PARTITION OF "billing"."events_ring" FOR VALUES IN (1) WITH (autovacuum_enabled = off);
CREATE TABLE "billing"."events_ring_p2" PARTITION OF "billing"."events_ring" FOR VALUES IN (2) WITH (autovacuum_enabled = off);
CREATE TABLE "billing"."events_ring_p3" PARTITION OF "billing"."events_ring" FOR VALUES IN (3) WITH (autovacuum_enabled = off);

-- A lane's rows in the order a batch takes them; ending in id, the
-- partitions' scans merge without a sort.
CREATE INDEX "events_ring_lane_idx" ON "billing"."events_ring" (queue, lane, txid, id);
-- A keyed lane's rows in id order, which within a key is commit order:
-- keyed batches are read in it (see outbox_ring_progress).
CREATE INDEX "events_ring_key_idx" ON "billing"."events_ring" (queue, lane, id) WHERE ordering_key IS NOT NULL;

-- A keyed row draws its id under its key's lock, as in the outbox table:
-- within a key, id order is commit order. It runs as the ring's owner
-- (the key's lock and the id sequence are the owner's), and only as the
-- ring's trigger (its partitions' clones of it).
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_ring_key_insert"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> ALL (ARRAY['"billing"."events_ring_p0"'::regclass, '"billing"."events_ring_p1"'::regclass,
                             '"billing"."events_ring_p2"'::regclass, '"billing"."events_ring_p3"'::regclass])
       OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the BEFORE INSERT row trigger of %', '"billing"."events_ring_key_insert"', '"billing"."events_ring"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM pg_advisory_xact_lock("billing"."events_key_lock"(NEW.queue, NEW.ordering_key));
    NEW.id := nextval('"billing"."events_id_seq"');
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_ring_key_insert_trg"
    BEFORE INSERT ON "billing"."events_ring"
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION "billing"."events_ring_key_insert"();

-- A row's place in the ring cannot change: its queue and ordering key
-- (which choose its lane), its id (its order within its lane and key), its
-- slot (its partition), nor its txid, but to the updating transaction's
-- (the row is then written now, as ring.Rebase writes them): a row moved
-- behind where its lane has read would never be delivered, and one moved
-- ahead of a key's earlier row would run first. Its payload, headers and
-- times may change while no lane has read it. It only refuses, so it
-- needs no privilege of the owner's, and runs only as the ring's trigger.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_ring_row_update"() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> ALL (ARRAY['"billing"."events_ring_p0"'::regclass, '"billing"."events_ring_p1"'::regclass,
                             '"billing"."events_ring_p2"'::regclass, '"billing"."events_ring_p3"'::regclass])
       OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION '% runs only as the BEFORE UPDATE row trigger of %', '"billing"."events_ring_row_update"', '"billing"."events_ring"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'the queue, ordering_key, id, slot and txid of a ring row cannot change (row %)', OLD.id
        USING ERRCODE = 'check_violation',
              HINT = 'Delete the row and insert it again; only its txid may become the updating transaction''s.';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_ring_row_update_trg"
    BEFORE UPDATE ON "billing"."events_ring"
    FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
                       OR OLD.id <> NEW.id OR OLD.slot <> NEW.slot
                       OR (OLD.txid <> NEW.txid AND NEW.txid <> pg_current_xact_id()))
    EXECUTE FUNCTION "billing"."events_ring_row_update"();

-- Wakes the sleeping subscribers of a row's queue, as the outbox table's
-- statement trigger does, once for each run of a transaction's rows of
-- one queue, due or not: its WHEN, evaluated for every row, reads one
-- sequence, and while nobody may sleep nothing else runs. (A statement
-- trigger needs the statement's rows as a transition table, whose
-- capture cost a one-row INSERT about 17 µs, and its lanes' INSERT as
-- much again.) A queue's lanes are made by its subscribers' claimers
-- before their first claim (RingAddLanes), and by a turn that finds its
-- rows in a partition (outbox_ring_truncate), which keeps the partition
-- until they read it. It runs as the ring's owner (outbox_wake is the
-- owner's), and only as the ring's trigger; its WHEN runs as the writer,
-- who reads the sleep horizon (Grants).
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_ring_wake"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    woke text := CASE WHEN NEW.next_attempt_at <= now() THEN 'due ' ELSE 'later ' END || NEW.queue;
BEGIN
    IF TG_RELID <> ALL (ARRAY['"billing"."events_ring_p0"'::regclass, '"billing"."events_ring_p1"'::regclass,
                             '"billing"."events_ring_p2"'::regclass, '"billing"."events_ring_p3"'::regclass])
       OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the AFTER INSERT row trigger of %', '"billing"."events_ring_wake"', '"billing"."events_ring"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_setting('outboxgen.ring_woke', true) IS DISTINCT FROM woke THEN
        PERFORM "billing"."events_wake"(NEW.queue, NEW.next_attempt_at <= now());
        PERFORM set_config('outboxgen.ring_woke', woke, true);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_ring_wake_trg"
    AFTER INSERT ON "billing"."events_ring"
    FOR EACH ROW
    WHEN (pg_sequence_last_value('"billing"."events_sleep_horizon"') > date_part('epoch', now()) * 1000)
    EXECUTE FUNCTION "billing"."events_ring_wake"();

-- One row per lane of a queue, only ever locked: it admits one reader
-- per lane, and writes no row version.
CREATE TABLE "billing"."events_ring_lanes" (
    queue text     COLLATE "C" NOT NULL,
    lane  smallint NOT NULL,
    PRIMARY KEY (queue, lane)
);

-- Where each lane's reading stands: the rows it has consumed are those
-- snapshot snap sees with ids up to below. Unkeyed lanes end every batch
-- at a snapshot (below is the largest bigint); keyed lanes read in id
-- order, and a batch that fills ends at its largest id: a batch cut at
-- a transaction could hand a key's later row out before its earlier
-- one, since a transaction may take its xid before an earlier writer of
-- the key takes its own, while any snapshot that sees a key's later row
-- sees its earlier one, whose id is smaller. Append-only, read newest
-- first; a lane without a row reads from the ring's start.
CREATE TABLE "billing"."events_ring_progress" (
    queue text        COLLATE "C" NOT NULL,
    lane  smallint    NOT NULL,
    seq   bigint      GENERATED ALWAYS AS IDENTITY,
    snap  pg_snapshot NOT NULL,
    below bigint      NOT NULL DEFAULT 9223372036854775807,
    at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, lane, seq)
);

-- The record of a batch in progress, committed before its handlers run:
-- a claim whose transaction aborted delivered the rows its snapshot sees
-- after the progress it read (after_seq, 0 for none), and the next
-- reader counts that delivery; its handlers may run until its lease
-- would have expired (until), and its rows wait for that.
CREATE TABLE "billing"."events_ring_claims" (
    queue     text        COLLATE "C" NOT NULL,
    lane      smallint    NOT NULL,
    after_seq bigint      NOT NULL,
    xid       xid8        NOT NULL,
    snap      pg_snapshot NOT NULL,
    below     bigint      NOT NULL DEFAULT 9223372036854775807,
    until     timestamptz NOT NULL,
    PRIMARY KEY (queue, lane, after_seq, xid)
);

-- The acknowledgements a claim of keyed lanes made to outlive it before
-- it handed a key's next row out (ids, of the claim of transaction xid),
-- each committed on its own: when the claim's transaction aborts, the
-- lanes' next reader leaves these rows out of what it moves into the
-- outbox table, so a key's row acknowledged before its next one ran is
-- not handed out again after it.
CREATE TABLE "billing"."events_ring_acks" (
    xid xid8     NOT NULL,
    ids bigint[] NOT NULL
);
CREATE INDEX "events_ring_acks_xid_idx" ON "billing"."events_ring_acks" (xid);

-- A partition's turn: done_below is the xid below which every writer of
-- the partition began (set when writers moved on to the next); NULL
-- while it is written.
CREATE TABLE "billing"."events_ring_turns" (
    slot       smallint    PRIMARY KEY,
    done_below xid8,
    since      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "billing"."events_ring_turns" (slot) SELECT s FROM generate_series(0, 3) AS s;

-- Whether every lane of every queue has read partition s past: no lane
-- has a row there that its newest progress did not consume (a lane with
-- no progress consumed nothing). Only the rows from where that
-- progress's unseen rows start (outbox_ring_since) are looked at, and a
-- keyed lane's rows above its id bound: a transaction that wrote nothing
-- into the ring, however long it runs, does not hold the ring back. Its
-- plans are custom, so that it locks partition s alone.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_ring_read_past"(s smallint) RETURNS boolean
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan SET jit = off AS $$
BEGIN
    RETURN NOT EXISTS (
        SELECT FROM "billing"."events_ring_lanes" AS l
        CROSS JOIN LATERAL (
            SELECT coalesce(n.snap, '1:1:'::pg_snapshot) AS snap, coalesce(n.below, 9223372036854775807) AS below
            FROM (SELECT 1) AS one
            LEFT JOIN LATERAL (SELECT g.snap, g.below FROM "billing"."events_ring_progress" AS g
                               WHERE g.queue = l.queue AND g.lane = l.lane ORDER BY g.seq DESC LIMIT 1) AS n ON true) AS p
        WHERE EXISTS (
            SELECT FROM "billing"."events_ring" AS r
            WHERE r.slot = s AND r.queue = l.queue AND r.lane = l.lane
              AND r.txid >= "billing"."events_ring_since"(p.snap, pg_current_snapshot())
              AND NOT pg_visible_in_snapshot(r.txid, p.snap))
           OR EXISTS (
            SELECT FROM "billing"."events_ring" AS r
            WHERE r.slot = s AND r.queue = l.queue AND r.lane = l.lane
              AND r.ordering_key IS NOT NULL AND r.id > p.below));
END;
$$;
-- +goose StatementEnd

-- Empties partition s, and marks it open for writers again, unless a
-- transaction holds a lock on it (a reader that can still reach it,
-- pg_dump, a writer still open): then it returns false at once, and the
-- next turn tries again. TRUNCATE is not MVCC-safe: only partitions
-- every lane has read past are given (RingDoneSlots), and it checks
-- again (outbox_ring_read_past) under the lock, which no writer of the
-- partition holds then: a writer open at the first check that committed
-- before the lock would otherwise have lost its rows. A queue that has
-- rows there but no lanes yet gets its lanes, and keeps the partition
-- until they read it. Its plans are custom, so that its reads lock only
-- partition s (another turn may hold another partition's lock); JIT is
-- off, as in doneSlots. It runs as the ring's owner: subscribers may
-- empty a partition only through it.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_ring_truncate"(s smallint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan SET jit = off AS $$
BEGIN
    CASE s
    WHEN 0 THEN LOCK TABLE "billing"."events_ring_p0" IN ACCESS EXCLUSIVE MODE NOWAIT;
    WHEN 1 THEN LOCK TABLE "billing"."events_ring_p1" IN ACCESS EXCLUSIVE MODE NOWAIT;
    WHEN 2 THEN LOCK TABLE "billing"."events_ring_p2" IN ACCESS EXCLUSIVE MODE NOWAIT;
    WHEN 3 THEN LOCK TABLE "billing"."events_ring_p3" IN ACCESS EXCLUSIVE MODE NOWAIT;
    END CASE;
    -- Each queue of the partition, one index probe each.
    WITH RECURSIVE q(queue) AS (
        (SELECT r.queue FROM "billing"."events_ring" AS r WHERE r.slot = s ORDER BY r.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT r.queue FROM "billing"."events_ring" AS r
                WHERE r.slot = s AND r.queue > q.queue ORDER BY r.queue LIMIT 1)
        FROM q WHERE q.queue IS NOT NULL)
    INSERT INTO "billing"."events_ring_lanes" (queue, lane)
    SELECT q.queue, l.lane FROM q, generate_series(0, 7) AS l(lane)
    WHERE q.queue IS NOT NULL
      AND NOT EXISTS (SELECT FROM "billing"."events_ring_lanes" AS x WHERE x.queue = q.queue AND x.lane = 0)
    ON CONFLICT DO NOTHING;
    -- Lanes without progress, those made just now included, see nothing.
    IF NOT "billing"."events_ring_read_past"(s) THEN
        RETURN false;
    END IF;
    -- An empty partition is left as it is: a TRUNCATE gives the table and
    -- its indexes new files, every turn of an idle outbox.
    IF EXISTS (SELECT FROM "billing"."events_ring" AS r WHERE r.slot = s) THEN
        CASE s
        WHEN 0 THEN TRUNCATE "billing"."events_ring_p0";
        WHEN 1 THEN TRUNCATE "billing"."events_ring_p1";
        WHEN 2 THEN TRUNCATE "billing"."events_ring_p2";
        WHEN 3 THEN TRUNCATE "billing"."events_ring_p3";
        END CASE;
    END IF;
    UPDATE "billing"."events_ring_turns" SET done_below = NULL WHERE slot = s;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END;
$$;
-- +goose StatementEnd

-- A keyed row that moves from the ring into the outbox table keeps its
-- id, as an unkeyed one does: a delivery in flight writes its outcome by
-- it. The outbox table's key trigger (schema 12's) draws a new id for
-- every keyed row; here it keeps the id of a row the ring's move gives
-- (outboxgen.ring_move set in its transaction) when the ring holds a row
-- of that id and key, in a lane the moving transaction holds, so that no
-- writer can choose a keyed row's place; and, for a row no delivery
-- holds (unleased), when no row of the key in the table has a larger id
-- (a writer wrote the key's later row into the table, or a move by lease
-- drew new ids): with its smaller id the row would take a place ahead of
-- that row, and the statement trigger's check, which finds rows of the
-- key past the statement's first that the statement did not insert,
-- would refuse the move, at every retry. The row then goes behind the
-- key's rows. A leased row keeps its id, by which its delivery writes
-- its outcome: if the check refuses its move, the claim ends without an
-- outcome, and the next claim of its lane moves the row unleased.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_key_insert"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $$
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the BEFORE INSERT row trigger of %', '"billing"."events_key_insert"', '"billing"."events"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM pg_advisory_xact_lock("billing"."events_key_lock"(NEW.queue, NEW.ordering_key));
    IF NEW.blocked AND current_setting('transaction_isolation') = 'read committed' THEN
        -- More rows of the key follow: they may skip this trigger (its
        -- WHEN), and the statement trigger checks them.
        PERFORM set_config('outboxgen.insert_key',
            octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key, true);
    END IF;
    IF current_setting('outboxgen.ring_move', true) IS DISTINCT FROM 'on' OR NOT EXISTS (
        SELECT FROM "billing"."events_ring" AS r
        JOIN "billing"."events_ring_lanes" AS l ON l.queue = r.queue AND l.lane = r.lane
        WHERE r.ordering_key IS NOT NULL AND r.queue = NEW.queue
          AND r.lane = (4 + ((hashtext(NEW.ordering_key) % 4) + 4) % 4)::smallint
          AND r.id = NEW.id AND r.ordering_key = NEW.ordering_key
          -- The inserting transaction holds the row's lane (its lock is
          -- the lane row's xmax): a reader of the lane is moving it. A
          -- writer, who may set the setting but cannot lock a lane, never
          -- chooses a keyed row's place.
          AND l.xmax = (pg_current_xact_id()::text)::xid)
       OR NEW.acquired_token IS NULL AND EXISTS (
        SELECT FROM "billing"."events" AS o
        WHERE o.ordering_key IS NOT NULL AND o.queue = NEW.queue COLLATE "C"
          AND (o.ordering_key, o.id) > (NEW.ordering_key COLLATE "C", NEW.id)
          AND (o.ordering_key, o.id) <= (NEW.ordering_key COLLATE "C", 9223372036854775807)) THEN
        NEW.id := nextval('"billing"."events_id_seq"');
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest row, if any (see schema 6), looked for among
        -- the key's own entries only (schema 12).
        -- Newest first, as a scalar subquery: an EXISTS would drop the
        -- order and read up from the key's first (long dead) entries.
        NEW.blocked := coalesce((
            SELECT true FROM "billing"."events" AS o
            WHERE o.ordering_key IS NOT NULL AND o.queue = NEW.queue COLLATE "C"
              AND (o.ordering_key, o.id) <= (NEW.ordering_key COLLATE "C", 9223372036854775807)
              AND (o.ordering_key, o.id) >= (NEW.ordering_key COLLATE "C", -9223372036854775808)
            ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
            LIMIT 1), false);
    ELSE
        -- The statement trigger records the key's hand-over.
        NEW.blocked := true;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Every function of the ring is private to its owner and the roles
-- ring.Grants names (PostgreSQL lets PUBLIC execute a new function).
REVOKE ALL ON FUNCTION
    "billing"."events_ring_slot_now"(),
    "billing"."events_ring_since"(pg_snapshot, pg_snapshot),
    "billing"."events_ring_key_insert"(),
    "billing"."events_ring_wake"(),
    "billing"."events_ring_row_update"(),
    "billing"."events_ring_read_past"(smallint),
    "billing"."events_ring_truncate"(smallint)
FROM PUBLIC;

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 13';

-- +goose Down
-- Keeps the ring's writers out, and waits for its claims in flight.
LOCK TABLE "billing"."events_ring", "billing"."events_ring_lanes", "billing"."events_ring_progress",
    "billing"."events_ring_claims", "billing"."events_ring_acks", "billing"."events_ring_turns"
    IN ACCESS EXCLUSIVE MODE;

-- The rows no lane consumed move into the outbox table with their ids, as
-- a claim's moves do: the key trigger keeps a keyed row's id while this
-- transaction holds the row's lane.
SELECT set_config('outboxgen.ring_move', 'on', true);
SELECT count(*) FROM (SELECT FROM "billing"."events_ring_lanes" FOR UPDATE) AS locked;
INSERT INTO "billing"."events" (id, queue, payload, headers, ordering_key, created_at, next_attempt_at) OVERRIDING SYSTEM VALUE
SELECT r.id, r.queue, r.payload, r.headers::jsonb, r.ordering_key, r.created_at, r.next_attempt_at
FROM "billing"."events_ring" AS r
LEFT JOIN LATERAL (
    SELECT g.snap, g.below FROM "billing"."events_ring_progress" AS g
    WHERE g.queue = r.queue AND g.lane = r.lane
    ORDER BY g.seq DESC LIMIT 1) AS p ON true
WHERE p.snap IS NULL OR NOT pg_visible_in_snapshot(r.txid, p.snap) OR r.id > p.below
ORDER BY r.id;
SELECT set_config('outboxgen.ring_move', '', true);

-- Schema 12's insert side of keys.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_key_insert"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $$
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the BEFORE INSERT row trigger of %', '"billing"."events_key_insert"', '"billing"."events"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM pg_advisory_xact_lock("billing"."events_key_lock"(NEW.queue, NEW.ordering_key));
    IF NEW.blocked AND current_setting('transaction_isolation') = 'read committed' THEN
        -- More rows of the key follow: they may skip this trigger (its
        -- WHEN), and the statement trigger checks them.
        PERFORM set_config('outboxgen.insert_key',
            octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key, true);
    END IF;
    NEW.id := nextval('"billing"."events_id_seq"');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest row, if any (see schema 6), looked for among
        -- the key's own entries only (schema 12).
        -- Newest first, as a scalar subquery: an EXISTS would drop the
        -- order and read up from the key's first (long dead) entries.
        NEW.blocked := coalesce((
            SELECT true FROM "billing"."events" AS o
            WHERE o.ordering_key IS NOT NULL AND o.queue = NEW.queue COLLATE "C"
              AND (o.ordering_key, o.id) <= (NEW.ordering_key COLLATE "C", 9223372036854775807)
              AND (o.ordering_key, o.id) >= (NEW.ordering_key COLLATE "C", -9223372036854775808)
            ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
            LIMIT 1), false);
    ELSE
        -- The statement trigger records the key's hand-over.
        NEW.blocked := true;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

DROP TABLE "billing"."events_ring";
DROP TABLE "billing"."events_ring_lanes";
DROP TABLE "billing"."events_ring_progress";
DROP TABLE "billing"."events_ring_claims";
DROP TABLE "billing"."events_ring_acks";
DROP TABLE "billing"."events_ring_turns";
DROP FUNCTION "billing"."events_ring_truncate"(smallint);
DROP FUNCTION "billing"."events_ring_read_past"(smallint);
DROP FUNCTION "billing"."events_ring_wake"();
DROP FUNCTION "billing"."events_ring_row_update"();
DROP FUNCTION "billing"."events_ring_key_insert"();
DROP FUNCTION "billing"."events_ring_since"(pg_snapshot, pg_snapshot);
DROP FUNCTION "billing"."events_ring_slot_now"();
DROP SEQUENCE "billing"."events_ring_slot";

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 12';
