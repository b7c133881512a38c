-- outboxgen: billing.events 00008_sleep_horizon.sql
-- A cheap test for "no subscriber sleeps", read by every writer.
--
-- Since schema 6 a writer notifies only while a subscriber of the row's
-- queue sleeps, and it learns that from a query over <table>_sleepers.
-- That query was most of what the triggers cost a publisher: with 32
-- concurrent one-row publishing transactions and nobody asleep, it took
-- commit throughput from 0.97x to about 0.8x of the same INSERT into a
-- table without triggers.
--
-- <table>_sleep_horizon, a sequence, now holds the latest time until which
-- a sleep record holds (in milliseconds since the epoch; 0 when none
-- does). Reading it is a function call, not a query, and reads the
-- current value, whatever the reader's snapshot. A trigger on the
-- sleepers table sets it from the records after every change to them, in
-- the changing transaction and before it commits, serialised by an
-- advisory lock, so the horizon is never earlier than a committed
-- record's end. Records written by any client (older releases of the
-- library included) pass through the same trigger.
--
-- Writers read the horizon first and, when it has passed, neither query
-- the records nor notify. This keeps schema 6's guarantee: a writer reads
-- the horizon after its insert, when it has a transaction id. If it read
-- the horizon before a subscriber's record raised it, it is still in
-- progress when the subscriber takes its snapshot (the subscriber waits
-- for it and claims again) or has committed (the subscriber's claim sees
-- its rows). A writer that reads the raised horizon goes on to the query
-- of schema 6. Since the value is read outside any snapshot, this holds at
-- every isolation level.
--
-- Every role may read the horizon (it says only when the latest sleep
-- record lapses), so roles that publish need no new privilege; the
-- sleepers trigger runs as the owner of the outbox, so roles that
-- subscribe need none either.

-- +goose Up
CREATE SEQUENCE "billing"."events_sleep_horizon" AS bigint MINVALUE 0;
GRANT SELECT ON SEQUENCE "billing"."events_sleep_horizon" TO PUBLIC;

-- Sets the horizon from the records that hold. The advisory lock (on a key
-- no ordering key's lock can have: queue names are never empty) makes the
-- changes to the records take turns, so the last to set the horizon saw
-- every record committed before it and its own.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_set_sleep_horizon"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("billing"."events_key_lock"('', ''));
    PERFORM setval('"billing"."events_sleep_horizon"', coalesce(
        (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
         FROM "billing"."events_sleepers" AS s WHERE s.until > now()),
        0));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER "events_horizon_trg"
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "billing"."events_sleepers"
    FOR EACH STATEMENT
    EXECUTE FUNCTION "billing"."events_set_sleep_horizon"();

-- The records that exist now: the trigger's lock on the table holds back
-- other changes until this migration commits.
SELECT setval('"billing"."events_sleep_horizon"', coalesce(
    (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
     FROM "billing"."events_sleepers" AS s WHERE s.until > now()),
    0));

-- As in schema 6, after a test of the horizon.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_sequence_last_value('"billing"."events_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM "billing"."events_sleepers" AS s
           WHERE s.until > now() AND q = ANY (s.queues)) THEN
        RETURN;
    END IF;
    IF "billing"."events_notify_queue_usage"() >= 0.5 THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_billing.events' ELSE 'outbox_billing.events:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_sequence_last_value('"billing"."events_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM "billing"."events_sleepers" AS s WHERE s.until > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM "billing"."events_wake"(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 8';

-- +goose Down
CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 7';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM "billing"."events_sleepers" AS s WHERE s.until > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM "billing"."events_wake"(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM "billing"."events_sleepers" AS s
           WHERE s.until > now() AND q = ANY (s.queues)) THEN
        RETURN;
    END IF;
    IF "billing"."events_notify_queue_usage"() >= 0.5 THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_billing.events' ELSE 'outbox_billing.events:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

DROP TRIGGER "events_horizon_trg" ON "billing"."events_sleepers";
DROP FUNCTION "billing"."events_set_sleep_horizon"();
DROP SEQUENCE "billing"."events_sleep_horizon";
