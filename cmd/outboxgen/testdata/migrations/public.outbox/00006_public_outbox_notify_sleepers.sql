-- outboxgen: public.outbox 00006_notify_sleepers.sql
-- Wake-ups only for subscribers that sleep.
--
-- A transaction that has issued NOTIFY takes a database-wide lock when it
-- commits and holds it through its WAL flush, so notifying transactions
-- commit one at a time and lose group commit: with 32 concurrent
-- publishers, a NOTIFY on every insert cut commit throughput to a quarter.
-- A subscriber that is busy claiming needs no doorbell, so the outbox now
-- notifies only when a subscriber of the queue sleeps.
--
-- A subscriber about to sleep records itself in <table>_sleepers (its
-- queues, and until when the record holds), then claims once more. A
-- writer that inserts rows, clears a lease or unblocks a key's head
-- notifies when a record of the row's queue holds. A writer that looked
-- before the record was committed is still in progress when the
-- subscriber takes its next snapshot; the subscriber waits for those
-- transactions to end and claims again before it sleeps for long, so no
-- wake-up is lost. A transaction that is not READ COMMITTED reads the
-- records in a snapshot that may predate them, so it always notifies.
--
-- A record ends when the subscriber wakes, stops, or lets it lapse (a
-- crashed subscriber's record lapses on its own). Rows written by any
-- client (psql, COPY, another language) pass through the same triggers.
--
-- NOTIFY fails the committing transaction when the server's notification
-- queue is full (8 GB by default, filled by a session that LISTENs and
-- never reads). Writers skip NOTIFY while the queue is half full or more,
-- hand-over announcements included; subscribers then find rows by
-- polling, and sweep recorded hand-overs, within MaxFetchInterval.
--
-- Upgrading: subscribers of older releases never record themselves, so
-- they find rows by polling until they are replaced.
--
-- This migration also tightens schema 5: whichever form of schema 4's
-- lease checks a schema holds, it keeps one check for the whole lease; a
-- blocked row must have a key (no head would ever unblock one without);
-- and the key triggers' lookups walk the ordering index as a range of its
-- own order, so the planner cannot scan the primary key instead for a key
-- its statistics call frequent (192 ms and a million rows read for one
-- hand-over, measured; about 1 ms as a range).

-- +goose Up
-- One check for the whole lease, so every insert and update evaluates no
-- more lease checks than schema 3 did. last_error is written only by the
-- library, which cuts it to 2,048 characters, so it keeps no check of its
-- own. IF EXISTS: schemas at version 5 hold one of two forms.
ALTER TABLE "public"."outbox"
    DROP CONSTRAINT IF EXISTS "outbox_lease_state_chk",
    DROP CONSTRAINT IF EXISTS "outbox_lease_chk",
    DROP CONSTRAINT IF EXISTS "outbox_lease_expiry_chk",
    DROP CONSTRAINT IF EXISTS "outbox_last_error_chk",
    ADD CONSTRAINT "outbox_lease_state_chk" CHECK (
        (acquired_token IS NULL) = (acquired_at IS NULL)
        AND (acquired_token IS NULL) = (lease_expires_at IS NULL));

-- A blocked row is never leased, whoever writes the lease, and only a row
-- with a key can wait behind one.
ALTER TABLE "public"."outbox"
    DROP CONSTRAINT "outbox_blocked_chk",
    ADD CONSTRAINT "outbox_blocked_chk"
        CHECK (NOT blocked OR (acquired_token IS NULL AND ordering_key IS NOT NULL));

CREATE TABLE "public"."outbox_sleepers" (
    id     uuid        PRIMARY KEY,
    queues text[]      COLLATE "C" NOT NULL,
    until  timestamptz NOT NULL
) WITH (fillfactor = 50);

-- The usage of the server's notification queue, from 0 to 1.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_notify_queue_usage"() RETURNS float8
LANGUAGE sql VOLATILE AS $$ SELECT pg_notification_queue_usage() $$;
-- +goose StatementEnd

-- Notifies queue q's subscribers, on the due channel or the scheduled
-- one, when one of them sleeps (or the transaction's snapshot cannot
-- tell) and the notification queue has room.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM "public"."outbox_sleepers" AS s
           WHERE s.until > now() AND q = ANY (s.queues)) THEN
        RETURN;
    END IF;
    IF "public"."outbox_notify_queue_usage"() >= 0.5 THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_outbox' ELSE 'outbox_outbox:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

-- Insert side. When no subscriber sleeps at all, it returns without
-- reading the statement's rows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM "public"."outbox_sleepers" AS s WHERE s.until > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM "public"."outbox_wake"(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- A cleared lease (a retry, a release, an operator's reset).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_notify_release"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM "public"."outbox_wake"(NEW.queue, NEW.next_attempt_at <= now());
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- Records a hand-over of key k of queue q for the subscribers to complete,
-- and announces it when the recording transaction commits. It is
-- announced whether or not a subscriber sleeps
-- (busy subscribers complete hand-overs at once only when told), unless
-- the notification queue is half full.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_record_hand_off"(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (q, k);
    IF "public"."outbox_notify_queue_usage"() < 0.5 THEN
        PERFORM pg_notify('outbox_outbox:handoff', q);
    END IF;
END;
$$;
-- +goose StatementEnd

-- A key's next row becoming its head: as in schema 5, announced through
-- outbox_wake.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_unblock_head"(q text, k text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    head_queue text;
    head_key text;
    head_id bigint;
    head_blocked boolean;
    head_due timestamptz;
BEGIN
    -- The first row at or after (q, k) in the ordering index, then a check
    -- that it is of the key. Written as a range of the index's own order,
    -- this lookup can only walk that index: an equality on the key would
    -- let the planner, for a key its statistics call frequent, scan the
    -- primary key instead and read the whole table.
    SELECT o.queue, o.ordering_key, o.id, o.blocked, o.next_attempt_at
    INTO head_queue, head_key, head_id, head_blocked, head_due
    FROM "public"."outbox" AS o
    WHERE o.ordering_key IS NOT NULL
      AND (o.queue, o.ordering_key, o.id) >= (q COLLATE "C", k COLLATE "C", -9223372036854775808)
    ORDER BY o.queue, o.ordering_key, o.id
    LIMIT 1;
    IF NOT FOUND OR head_queue <> q OR head_key <> k OR NOT head_blocked THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM "public"."outbox" AS o WHERE o.id = head_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE "public"."outbox" AS o SET blocked = false WHERE o.id = head_id;
    PERFORM "public"."outbox_wake"(q, head_due <= now());
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- Insert side (see schema 5), with the key's newest row found as a range
-- of the ordering index's order, and hand-overs recorded through
-- outbox_record_hand_off.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_insert"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("public"."outbox_key_lock"(NEW.queue, NEW.ordering_key));
    NEW.id := nextval('"public"."outbox_id_seq"');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest row, if any: the last row at or before the key's
        -- end in the ordering index (newest rows are the least likely to
        -- be dead), found as a range of the index's order for the reason
        -- given in unblock_head.
        SELECT o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        INTO NEW.blocked
        FROM "public"."outbox" AS o
        WHERE o.ordering_key IS NOT NULL
          AND (o.queue, o.ordering_key, o.id) <= (NEW.queue COLLATE "C", NEW.ordering_key COLLATE "C", 9223372036854775807)
        ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
        LIMIT 1;
        NEW.blocked := coalesce(NEW.blocked, false);
    ELSE
        NEW.blocked := true;
        PERFORM "public"."outbox_record_hand_off"(NEW.queue, NEW.ordering_key);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Delete side (see schema 5), recording hand-overs through
-- outbox_record_hand_off.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_delete"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock("public"."outbox_key_lock"(OLD.queue, OLD.ordering_key))
       OR NOT "public"."outbox_unblock_head"(OLD.queue, OLD.ordering_key) THEN
        PERFORM "public"."outbox_record_hand_off"(OLD.queue, OLD.ordering_key);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 6';

-- +goose Down
CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 5';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_unblock_head"(q text, k text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    head_id bigint;
    head_blocked boolean;
    head_due timestamptz;
BEGIN
    SELECT o.id, o.blocked, o.next_attempt_at INTO head_id, head_blocked, head_due
    FROM "public"."outbox" AS o
    WHERE o.queue = q AND o.ordering_key = k
    ORDER BY o.id
    LIMIT 1;
    IF NOT FOUND OR NOT head_blocked THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM "public"."outbox" AS o WHERE o.id = head_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE "public"."outbox" AS o SET blocked = false WHERE o.id = head_id;
    PERFORM pg_notify(
        CASE WHEN head_due <= now() THEN 'outbox_outbox'
             ELSE 'outbox_outbox:scheduled' END,
        q);
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_insert"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("public"."outbox_key_lock"(NEW.queue, NEW.ordering_key));
    NEW.id := nextval('"public"."outbox_id_seq"');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest rows are the ones least likely to be dead.
        PERFORM 1 FROM "public"."outbox" AS o
        WHERE o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        ORDER BY o.id DESC
        LIMIT 1;
        NEW.blocked := FOUND;
    ELSE
        NEW.blocked := true;
        INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key);
        PERFORM pg_notify('outbox_outbox:handoff', NEW.queue);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_delete"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock("public"."outbox_key_lock"(OLD.queue, OLD.ordering_key))
       OR NOT "public"."outbox_unblock_head"(OLD.queue, OLD.ordering_key) THEN
        INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (OLD.queue, OLD.ordering_key);
        PERFORM pg_notify('outbox_outbox:handoff', OLD.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_notify_release"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        CASE WHEN NEW.next_attempt_at <= now() THEN 'outbox_outbox'
             ELSE 'outbox_outbox:scheduled' END,
        NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        CASE WHEN q.due THEN 'outbox_outbox' ELSE 'outbox_outbox:scheduled' END,
        q.queue)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION "public"."outbox_record_hand_off"(text, text);
DROP FUNCTION "public"."outbox_wake"(text, boolean);
DROP FUNCTION "public"."outbox_notify_queue_usage"();
DROP TABLE "public"."outbox_sleepers";

-- The lease checks keep their one-check form, which is schema 5's too.
ALTER TABLE "public"."outbox"
    DROP CONSTRAINT "outbox_blocked_chk",
    ADD CONSTRAINT "outbox_blocked_chk" CHECK (NOT blocked OR acquired_token IS NULL);
