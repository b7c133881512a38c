-- outboxgen: public.outbox 00009_least_privilege.sql
-- Writers with least privilege, bounded hand-overs, prepared transactions,
-- and locks that roles without grants cannot hold.
--
-- Writer-side triggers run as the outbox's owner. Until schema 8 they ran
-- with the privileges of whoever wrote the row, so a role that could only
-- insert rows failed ("permission denied for table <table>_sleepers") as
-- soon as a subscriber slept, and keyed rows needed grants on the id
-- sequence, the key columns and <table>_handoff. The trigger functions
-- are now SECURITY DEFINER with search_path pinned to pg_catalog and
-- pg_temp; every name in them is schema-qualified. docs/operations.md
-- lists the grants of a publishing and a subscribing role.
--
-- Hand-overs are completed in bounded batches. <table>_hand_off took one
-- advisory lock per recorded key and held them all until it ended, so
-- with more keys waiting than PostgreSQL's lock table holds (about
-- max_locks_per_transaction x max_connections, 6,400 by default) every
-- call failed with "out of shared memory" and no key was ever handed on.
-- It now locks at most max_keys keys per call and says whether more
-- remain, and the callers call again. The delete side likewise hands on at
-- most max_locks_per_transaction / 2 keys itself per transaction (a
-- locked claim's end can delete thousands of heads at once) and records
-- the rest for the subscribers.
--
-- Prepared transactions. PostgreSQL refuses to PREPARE a transaction that
-- issued NOTIFY, and a trigger cannot know whether its transaction will
-- be prepared. Where prepared transactions are possible
-- (max_prepared_transactions > 0), writers notify only in sessions that
-- declare they never prepare (outboxgen.notify = on); elsewhere they do
-- as before. outboxgen.notify = off turns every notification of the
-- outbox off. Rows written without a notification are found by polling,
-- within MaxFetchInterval.
--
-- The sleep horizon is never earlier than a committed record, at every
-- isolation level: a change to the records in a transaction that reads
-- with an older snapshot (REPEATABLE READ, SERIALIZABLE) can miss records
-- committed since, so it only ever raises the horizon.
--
-- Locks that a role without grants cannot hold. Any role that can connect
-- can take any advisory lock. Changes to the sleep records now take turns
-- on a row lock of <table>_sleepers_turn, which only the owner can read
-- or lock, and the keys' advisory locks are seeded with a random number
-- kept in <table>_lock_seed, a sequence only the owner can read, so a role
-- without grants cannot compute them.
--
-- Upgrading: the keys' locks change, so the migration waits for the
-- transactions writing the outbox to end and holds new ones back until it
-- commits.

-- +goose Up
LOCK TABLE "public"."outbox" IN SHARE ROW EXCLUSIVE MODE;

-- The secret: a random number kept as the value of a sequence, which
-- only its owner may read. Reading it is a function call, not a query
-- (a query of a one-row table in every keyed insert doubled its cost).
CREATE SEQUENCE "public"."outbox_lock_seed" AS bigint MINVALUE -9223372036854775808;
REVOKE ALL ON SEQUENCE "public"."outbox_lock_seed" FROM PUBLIC;
SELECT setval('"public"."outbox_lock_seed"',
    ('x' || substr(md5(gen_random_uuid()::text || clock_timestamp()::text), 1, 16))::bit(64)::bigint);

-- The row that changes to the sleep records take turns on.
CREATE TABLE "public"."outbox_sleepers_turn" (
    turn boolean PRIMARY KEY DEFAULT true CHECK (turn)
);
REVOKE ALL ON "public"."outbox_sleepers_turn" FROM PUBLIC;
INSERT INTO "public"."outbox_sleepers_turn" DEFAULT VALUES;

-- The advisory lock of one key, seeded with the outbox's secret. VOLATILE
-- as the sequence read is, so that it is inlined into its callers: run as
-- a function of its own it cost a keyed insert about as much again.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_lock"(queue text, ordering_key text) RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtextextended(queue || E'\x1f' || ordering_key,
        pg_catalog.pg_sequence_last_value('"public"."outbox_lock_seed"'))
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION "public"."outbox_key_lock"(text, text) FROM PUBLIC;

-- Whether this transaction may notify: not where it could be prepared
-- (unless its session says it never prepares), not when the session says
-- so, and not while the server's notification queue is half full.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_may_notify"() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT CASE coalesce(current_setting('outboxgen.notify', true), '')
               WHEN 'off' THEN false
               WHEN 'on' THEN true
               ELSE current_setting('max_prepared_transactions')::integer = 0
           END
       AND "public"."outbox_notify_queue_usage"() < 0.5
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_sequence_last_value('"public"."outbox_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM "public"."outbox_sleepers" AS s
           WHERE s.until > now() AND q = ANY (s.queues)) THEN
        RETURN;
    END IF;
    IF NOT "public"."outbox_may_notify"() THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_outbox' ELSE 'outbox_outbox:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_record_hand_off"(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (q, k);
    IF "public"."outbox_may_notify"() THEN
        PERFORM pg_notify('outbox_outbox:handoff', q);
    END IF;
END;
$$;
-- +goose StatementEnd

-- Delete side: hands the key on itself for at most half of
-- max_locks_per_transaction keys per transaction (counted in
-- outboxgen.key_locks), and records the rest for the subscribers.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_delete"() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    taken integer;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        taken := coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer;
        IF taken < current_setting('max_locks_per_transaction')::integer / 2
           AND pg_try_advisory_xact_lock("public"."outbox_key_lock"(OLD.queue, OLD.ordering_key)) THEN
            PERFORM set_config('outboxgen.key_locks', (taken + 1)::text, true);
            IF "public"."outbox_unblock_head"(OLD.queue, OLD.ordering_key) THEN
                RETURN NULL;
            END IF;
        END IF;
    END IF;
    PERFORM "public"."outbox_record_hand_off"(OLD.queue, OLD.ordering_key);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- Completes recorded hand-overs of the given queues, locking at most
-- max_keys keys, and returns {waiting, more}: how many keys it found
-- still held by another transaction, and 1 when it stopped at max_keys
-- with keys left to try (call it again at once), else 0.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_hand_off"(queues text[], max_keys integer) RETURNS integer[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k record;
    waiting integer := 0;
    locked integer := 0;
BEGIN
    -- In no order, without DISTINCT: a sort would read every recorded
    -- hand-over at each call. A key recorded twice is locked again (no
    -- second slot, though it counts against max_keys), finds nothing left
    -- to delete, and its head already unblocked.
    FOR k IN
        SELECT h.queue, h.ordering_key
        FROM "public"."outbox_handoff" AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF locked >= greatest(max_keys, 1) THEN
            RETURN ARRAY[waiting, 1];
        END IF;
        IF NOT pg_try_advisory_xact_lock("public"."outbox_key_lock"(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        locked := locked + 1;
        DELETE FROM "public"."outbox_handoff" AS h
        WHERE h.queue = k.queue AND h.ordering_key = k.ordering_key;
        IF NOT "public"."outbox_unblock_head"(k.queue, k.ordering_key) THEN
            INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (k.queue, k.ordering_key);
            waiting := waiting + 1;
        END IF;
    END LOOP;
    RETURN ARRAY[waiting, 0];
END;
$$;
-- +goose StatementEnd
-- It takes key locks, which publishers of those keys wait for: only the
-- roles granted it may call it.
REVOKE ALL ON FUNCTION "public"."outbox_hand_off"(text[], integer) FROM PUBLIC;

-- Schema 8's subscribers call the one-argument form: one bounded batch,
-- and keys left for the next call count as waiting.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_hand_off"(queues text[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT r[1] + r[2] FROM (SELECT "public"."outbox_hand_off"(queues, 128) AS r) AS h
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION "public"."outbox_hand_off"(text[]) FROM PUBLIC;

-- Changes to the records take turns on the row lock of sleepers_turn; a change
-- reading with a snapshot older than its statement only raises the
-- horizon.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_set_sleep_horizon"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    horizon bigint;
BEGIN
    PERFORM 1 FROM "public"."outbox_sleepers_turn" AS s FOR UPDATE;
    horizon := coalesce(
        (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
         FROM "public"."outbox_sleepers" AS s WHERE s.until > now()),
        0);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        horizon := greatest(horizon, pg_sequence_last_value('"public"."outbox_sleep_horizon"'));
    END IF;
    PERFORM setval('"public"."outbox_sleep_horizon"', horizon);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

ALTER FUNCTION "public"."outbox_notify"() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION "public"."outbox_notify_release"() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION "public"."outbox_key_insert"() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION "public"."outbox_key_delete"() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION "public"."outbox_key_update"() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 9';

-- +goose Down
LOCK TABLE "public"."outbox" IN SHARE ROW EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 8';

ALTER FUNCTION "public"."outbox_notify"() SECURITY INVOKER RESET ALL;
ALTER FUNCTION "public"."outbox_notify_release"() SECURITY INVOKER RESET ALL;
ALTER FUNCTION "public"."outbox_key_insert"() SECURITY INVOKER RESET ALL;
ALTER FUNCTION "public"."outbox_key_delete"() SECURITY INVOKER RESET ALL;
ALTER FUNCTION "public"."outbox_key_update"() SECURITY INVOKER RESET ALL;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_set_sleep_horizon"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("public"."outbox_key_lock"('', ''));
    PERFORM setval('"public"."outbox_sleep_horizon"', coalesce(
        (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
         FROM "public"."outbox_sleepers" AS s WHERE s.until > now()),
        0));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_hand_off"(queues text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    waiting integer := 0;
BEGIN
    FOR k IN
        SELECT DISTINCT h.queue, h.ordering_key
        FROM "public"."outbox_handoff" AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF NOT pg_try_advisory_xact_lock("public"."outbox_key_lock"(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        DELETE FROM "public"."outbox_handoff" AS h
        WHERE h.queue = k.queue AND h.ordering_key = k.ordering_key;
        IF NOT "public"."outbox_unblock_head"(k.queue, k.ordering_key) THEN
            INSERT INTO "public"."outbox_handoff" (queue, ordering_key) VALUES (k.queue, k.ordering_key);
            waiting := waiting + 1;
        END IF;
    END LOOP;
    RETURN waiting;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION "public"."outbox_hand_off"(text[], integer);
GRANT EXECUTE ON FUNCTION "public"."outbox_hand_off"(text[]) TO PUBLIC;

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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_sequence_last_value('"public"."outbox_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN;
    END IF;
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

DROP FUNCTION "public"."outbox_may_notify"();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_key_lock"(queue text, ordering_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(queue || E'\x1f' || ordering_key, hashtext('"public"."outbox"'))
$$;
-- +goose StatementEnd
GRANT EXECUTE ON FUNCTION "public"."outbox_key_lock"(text, text) TO PUBLIC;

DROP TABLE "public"."outbox_sleepers_turn";
DROP SEQUENCE "public"."outbox_lock_seed";
