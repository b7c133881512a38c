-- outboxgen: billing.events 00005_per_key_order.sql
-- Per-key order, enforced by the database for every writer (this library,
-- psql, COPY, another language). Rows with the same (queue, ordering_key)
-- are delivered one at a time, in the commit order of the transactions
-- that inserted them.
--
-- Only a key's head (its row with the lowest id) is claimable; every later
-- row of the key is inserted with blocked set, which keeps it out of the
-- pending index, so claims never step over a busy key's backlog. The head
-- blocks its key while it is leased, waiting for a retry, or scheduled for
-- later. When the head leaves the table (acknowledged, dead-lettered,
-- cancelled, deleted by hand), the next row of the key is unblocked in the
-- same transaction and announced on the outbox's channel.
--
-- Inserts of a key take a transaction-level advisory lock on the key and
-- draw their id under it, so ids follow commit order within a key. The
-- delete side only ever tries that lock: a publisher may hold locks of
-- several keys in any order for as long as its transaction lasts, and an
-- acknowledgement that waited for one of them could deadlock with it. When
-- the lock is taken (or the deleting transaction is not READ COMMITTED, so
-- its reads could miss rows committed after its snapshot), the hand-over is
-- recorded in <table>_handoff and announced on the :handoff channel; the
-- subscribers complete it once the publisher has committed.
--
-- Upgrading: rows of a key that were leased when this migration runs stay
-- claimable and finish first; every other row of a key but its lowest id
-- is blocked. Stop subscribers of older releases before applying it: their
-- claims do not know blocked rows, and the check below refuses a claim
-- that reaches one rather than deliver it out of order.

-- +goose Up
ALTER TABLE "billing"."events"
    ADD COLUMN blocked boolean NOT NULL DEFAULT false;

UPDATE "billing"."events" AS o
SET blocked = true
FROM (
    SELECT k.id, row_number() OVER (PARTITION BY k.queue, k.ordering_key ORDER BY k.id) AS pos
    FROM "billing"."events" AS k
    WHERE k.ordering_key IS NOT NULL
) AS r
WHERE o.id = r.id AND r.pos > 1 AND o.acquired_token IS NULL;

-- A blocked row is never leased, whoever writes the lease.
ALTER TABLE "billing"."events"
    ADD CONSTRAINT "events_blocked_chk" CHECK (NOT blocked OR acquired_token IS NULL);

-- Only rows that are not blocked wait in the pending index.
DROP INDEX "billing"."events_pending_idx";
CREATE INDEX "events_pending_idx"
    ON "billing"."events" (queue, next_attempt_at, id)
    WITH (deduplicate_items = off)
    WHERE acquired_token IS NULL AND NOT blocked;

-- Hand-overs the deleting transaction could not complete itself.
CREATE TABLE "billing"."events_handoff" (
    queue        text        COLLATE "C" NOT NULL,
    ordering_key text        COLLATE "C" NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX "events_handoff_idx"
    ON "billing"."events_handoff" (queue, ordering_key);

-- The advisory lock of one key of this outbox: a 64-bit hash of queue and
-- key, seeded by the table's name so two outboxes' keys do not collide.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_key_lock"(queue text, ordering_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(queue || E'\x1f' || ordering_key, hashtext('"billing"."events"'))
$$;
-- +goose StatementEnd

-- Makes the lowest row of a key its head and announces it. The caller
-- holds the key's lock. Returns false when that row is locked by another
-- transaction (which may be deleting it), so the caller cannot decide and
-- must record the hand-over for later.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_unblock_head"(q text, k text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    head_id bigint;
    head_blocked boolean;
    head_due timestamptz;
BEGIN
    SELECT o.id, o.blocked, o.next_attempt_at INTO head_id, head_blocked, head_due
    FROM "billing"."events" AS o
    WHERE o.queue = q AND o.ordering_key = k
    ORDER BY o.id
    LIMIT 1;
    IF NOT FOUND OR NOT head_blocked THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM "billing"."events" AS o WHERE o.id = head_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE "billing"."events" AS o SET blocked = false WHERE o.id = head_id;
    PERFORM pg_notify(
        CASE WHEN head_due <= now() THEN 'outbox_billing.events'
             ELSE 'outbox_billing.events:scheduled' END,
        q);
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- Insert side: serialise the key's publishers, draw the id in commit
-- order, and block the row when its key already has rows. Outside READ
-- COMMITTED the transaction's snapshot may predate rows committed by the
-- key's previous holder, so the row is blocked and the subscribers decide.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_key_insert"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("billing"."events_key_lock"(NEW.queue, NEW.ordering_key));
    NEW.id := nextval('"billing"."events_id_seq"');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest rows are the ones least likely to be dead.
        PERFORM 1 FROM "billing"."events" AS o
        WHERE o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        ORDER BY o.id DESC
        LIMIT 1;
        NEW.blocked := FOUND;
    ELSE
        NEW.blocked := true;
        INSERT INTO "billing"."events_handoff" (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key);
        PERFORM pg_notify('outbox_billing.events:handoff', NEW.queue);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_key_insert_trg"
    BEFORE INSERT ON "billing"."events"
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION "billing"."events_key_insert"();

-- Delete side: when a key's head leaves the table, hand the key to its
-- next row, or record the hand-over when that cannot be done without
-- waiting.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_key_delete"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock("billing"."events_key_lock"(OLD.queue, OLD.ordering_key))
       OR NOT "billing"."events_unblock_head"(OLD.queue, OLD.ordering_key) THEN
        INSERT INTO "billing"."events_handoff" (queue, ordering_key) VALUES (OLD.queue, OLD.ordering_key);
        PERFORM pg_notify('outbox_billing.events:handoff', OLD.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_key_delete_trg"
    AFTER DELETE ON "billing"."events"
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.blocked)
    EXECUTE FUNCTION "billing"."events_key_delete"();

-- A row keeps its queue and key for life: moving it would break both keys'
-- order. Delete it and insert it again instead.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_key_update"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the queue and ordering_key of an outbox row cannot change (row %)', OLD.id
        USING ERRCODE = 'check_violation',
              HINT = 'Delete the row and insert it again.';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_key_update_trg"
    BEFORE UPDATE OF queue, ordering_key ON "billing"."events"
    FOR EACH ROW
    WHEN (OLD.ordering_key IS DISTINCT FROM NEW.ordering_key OR OLD.queue IS DISTINCT FROM NEW.queue)
    EXECUTE FUNCTION "billing"."events_key_update"();

-- Completes the recorded hand-overs of the given queues whose keys no
-- other transaction holds, and returns how many are still waiting. Each
-- key is locked before its rows are read, so the read sees every row the
-- key's previous holder committed.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_hand_off"(queues text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    waiting integer := 0;
BEGIN
    FOR k IN
        SELECT DISTINCT h.queue, h.ordering_key
        FROM "billing"."events_handoff" AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF NOT pg_try_advisory_xact_lock("billing"."events_key_lock"(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        DELETE FROM "billing"."events_handoff" AS h
        WHERE h.queue = k.queue AND h.ordering_key = k.ordering_key;
        IF NOT "billing"."events_unblock_head"(k.queue, k.ordering_key) THEN
            INSERT INTO "billing"."events_handoff" (queue, ordering_key) VALUES (k.queue, k.ordering_key);
            waiting := waiting + 1;
        END IF;
    END LOOP;
    RETURN waiting;
END;
$$;
-- +goose StatementEnd

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 5';

-- +goose Down
CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 4';

DROP FUNCTION "billing"."events_hand_off"(text[]);
DROP TRIGGER "events_key_update_trg" ON "billing"."events";
DROP FUNCTION "billing"."events_key_update"();
DROP TRIGGER "events_key_delete_trg" ON "billing"."events";
DROP FUNCTION "billing"."events_key_delete"();
DROP TRIGGER "events_key_insert_trg" ON "billing"."events";
DROP FUNCTION "billing"."events_key_insert"();
DROP FUNCTION "billing"."events_unblock_head"(text, text);
DROP FUNCTION "billing"."events_key_lock"(text, text);
DROP TABLE "billing"."events_handoff";

DROP INDEX "billing"."events_pending_idx";
CREATE INDEX "events_pending_idx"
    ON "billing"."events" (queue, next_attempt_at, id)
    WITH (deduplicate_items = off)
    WHERE acquired_token IS NULL;

ALTER TABLE "billing"."events"
    DROP CONSTRAINT "events_blocked_chk",
    DROP COLUMN blocked;
