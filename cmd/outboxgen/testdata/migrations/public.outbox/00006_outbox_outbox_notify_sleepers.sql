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

-- +goose Up
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

-- A recorded hand-over is announced whether or not a subscriber sleeps
-- (busy subscribers complete hand-overs at once only when told), unless
-- the notification queue is half full.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_record_hand_off"(q text, k text) RETURNS void
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
    -- that it is of the key (see schema 5).
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

CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 6';

-- +goose Down
CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 5';

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
    PERFORM pg_notify(
        CASE WHEN head_due <= now() THEN 'outbox_outbox'
             ELSE 'outbox_outbox:scheduled' END,
        q);
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_record_hand_off"(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (q, k);
    PERFORM pg_notify('outbox_outbox:handoff', q);
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

DROP FUNCTION "public"."outbox_wake"(text, boolean);
DROP FUNCTION "public"."outbox_notify_queue_usage"();
DROP TABLE "public"."outbox_sleepers";
