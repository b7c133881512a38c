-- The owner's functions run only as the outbox's own triggers, and trust
-- no setting a writer can change.
--
-- Since schema 9 the writer-side trigger functions run as the outbox's
-- owner (SECURITY DEFINER), and PostgreSQL lets PUBLIC execute every new
-- function. A trigger function is not tied to a table: any role could
-- create a temporary table with the outbox's columns, attach
-- <table>_key_insert() to it and insert, and the function ran as the
-- owner: it took the key's seeded lock (publishers of the key then waited
-- for that role's transaction), drew ids from the outbox's sequence and
-- recorded hand-overs in <table>_handoff. <table>_set_sleep_horizon() let
-- it hold <table>_sleepers_turn, so sleep records waited too. Now:
--
-- - PUBLIC executes none of the outbox's functions but
--   <table>_schema_version(). A trigger fires whatever the writer's
--   privileges on its function, so writers need no grant; creating a
--   trigger needs EXECUTE, which only the owner has. Functions called
--   only from the owner's functions are the owner's alone too, and so is
--   the sleep horizon (read only by the owner's functions since schema 9).
-- - Each owner's trigger function checks that it runs as the trigger it
--   was written for: on the outbox's own table (its oid, fixed when the
--   function is planned), at the timing, level and event of that trigger.
--   Anything else is refused with insufficient_privilege, before the
--   function does anything.
--
-- Schema 10 let a row that arrives blocked skip the key's insert trigger
-- when the setting outboxgen.insert_key named its key, as the trigger
-- itself set it for the rest of a statement (PublishBatch's rows after a
-- keyed call's first). Any writer can set any setting: a publisher that
-- set it and inserted one blocked row of a key without rows stranded the
-- key for ever, and rows that skipped the trigger drew their ids outside
-- the key's lock. The skip stays (at READ COMMITTED only), and the
-- statement trigger of inserts, which runs as the owner once per
-- statement, now checks what the setting claimed: for each key of which
-- the statement inserted a blocked row, under the key's lock, no other
-- transaction's row of the key has an id from the statement's first row
-- of the key on (else its rows drew ids outside the lock: the statement
-- is refused), and that first row, if blocked, has a row of its key
-- before it (else it is the key's head, and is unblocked, as the trigger
-- would decide it now). The key's trigger itself no longer reads the
-- setting: it takes the key's lock for every row it decides. The check
-- costs a statement without blocked rows one look at its rows; running
-- the trigger for every keyed row instead, which needs no check, cost
-- keyed PublishBatch calls four times the server time, measured.
-- Outside READ COMMITTED every keyed row runs the trigger, which blocks
-- it, and the statement trigger records one hand-over per key the
-- statement wrote (schema 10 recorded it from the row trigger, once per
-- key it remembered). A statement that skips a row after its BEFORE
-- triggers ran (INSERT ... ON CONFLICT DO NOTHING) no longer leaves
-- its key's next row blocked: the check decides that row.
--
-- outboxgen.key_locks, the delete side's per-transaction count of key
-- locks, is read as at least 0: a writer that sets it changes only how
-- many of its own transaction's hand-overs it completes itself rather
-- than records. outboxgen.notify stays the session's choice of whether
-- its own writes notify (schema 9).
--
-- Upgrading: nothing in the tables changes; functions are replaced and
-- privileges revoked.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox'::regclass OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the BEFORE INSERT row trigger of %', /*outbox:literal*/'outbox_key_insert', /*outbox:literal*/'outbox'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM pg_advisory_xact_lock(/*outbox:table*/outbox_key_lock(NEW.queue, NEW.ordering_key));
    IF NEW.blocked AND current_setting('transaction_isolation') = 'read committed' THEN
        -- More rows of the key follow: they may skip this trigger (its
        -- WHEN), and the statement trigger checks them.
        PERFORM set_config('outboxgen.insert_key',
            octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key, true);
    END IF;
    NEW.id := nextval(/*outbox:literal*/'outbox_id_seq');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest row, if any (see schema 6).
        SELECT o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        INTO NEW.blocked
        FROM /*outbox:table*/outbox AS o
        WHERE o.ordering_key IS NOT NULL
          AND (o.queue, o.ordering_key, o.id) <= (NEW.queue COLLATE "C", NEW.ordering_key COLLATE "C", 9223372036854775807)
        ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
        LIMIT 1;
        NEW.blocked := coalesce(NEW.blocked, false);
    ELSE
        -- The statement trigger records the key's hand-over.
        NEW.blocked := true;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- At READ COMMITTED, a row that arrives blocked, of the key the setting
-- names, skips the trigger: schema 10's saving for PublishBatch, whose
-- statement trigger now checks what the setting claimed.
DROP TRIGGER /*outbox:name*/outbox_key_insert_trg ON /*outbox:table*/outbox;
CREATE TRIGGER /*outbox:name*/outbox_key_insert_trg
    BEFORE INSERT ON /*outbox:table*/outbox
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL
          AND NOT (NEW.blocked AND current_setting('transaction_isolation') = 'read committed'
                   AND coalesce(current_setting('outboxgen.insert_key', true), '')
                       = octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key))
    EXECUTE FUNCTION /*outbox:table*/outbox_key_insert();

-- The statement trigger of inserts. At READ COMMITTED it checks, under
-- each key's lock, the keys of the rows it inserted that are blocked
-- (those that skipped the key's trigger are among them): no other
-- transaction's row of the key has an id above the statement's first row
-- of the key (else those rows drew their ids outside the key's lock, and
-- the statement fails), and when that first row is blocked, a row of the
-- key comes before it (else it is the key's head, and is unblocked).
-- Outside READ COMMITTED it records one hand-over per key the statement
-- wrote rows of (they arrived blocked). Then the wake-ups of schema 8.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    keys record;
    seen bigint;
    earlier boolean;
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the AFTER INSERT statement trigger of %', /*outbox:literal*/'outbox_notify', /*outbox:literal*/'outbox'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_setting('outboxgen.insert_key', true) <> '' THEN
        PERFORM set_config('outboxgen.insert_key', '', true);
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- Most statements insert no blocked row: one look, and done.
        PERFORM 1 FROM new_rows AS n WHERE n.blocked LIMIT 1;
        IF FOUND THEN
            -- Each key's first row, and the key's lock (held already
            -- unless the key's trigger never ran), taken before the
            -- query below takes its snapshot.
            SELECT array_agg(f.queue) AS q, array_agg(f.ordering_key) AS k, array_agg(f.first) AS first,
                   array_agg(f.first_blocked) AS first_blocked, array_agg(f.rows) AS rows, count(f.locked) AS locked
            INTO keys
            FROM (SELECT n.queue, n.ordering_key, min(n.id) AS first, (array_agg(n.blocked ORDER BY n.id))[1] AS first_blocked,
                         count(*) AS rows,
                         pg_advisory_xact_lock(/*outbox:table*/outbox_key_lock(n.queue, n.ordering_key))::text AS locked
                  FROM new_rows AS n WHERE n.ordering_key IS NOT NULL
                  GROUP BY n.queue, n.ordering_key HAVING bool_or(n.blocked)) AS f;
            FOR i IN 1 .. coalesce(cardinality(keys.q), 0) LOOP
                -- The count is bounded whichever index the planner takes:
                -- the key's rows from the statement's first on, or every
                -- row with an id from the statement's first on.
                SELECT (SELECT count(*)
                        FROM /*outbox:table*/outbox AS o
                        WHERE o.ordering_key IS NOT NULL AND o.queue = keys.q[i] AND o.ordering_key = keys.k[i]
                          AND o.id >= keys.first[i]),
                       NOT keys.first_blocked[i] OR coalesce(
                       (SELECT o.queue = keys.q[i] AND o.ordering_key = keys.k[i]
                        FROM /*outbox:table*/outbox AS o
                        WHERE o.ordering_key IS NOT NULL
                          AND (o.queue, o.ordering_key, o.id) < (keys.q[i] COLLATE "C", keys.k[i] COLLATE "C", keys.first[i])
                        ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
                        LIMIT 1), false)
                INTO seen, earlier;
                IF seen <> keys.rows[i] THEN
                    RAISE EXCEPTION 'rows of key % of queue % skipped its trigger with ids drawn outside the key''s lock', keys.k[i], keys.q[i]
                        USING ERRCODE = 'insufficient_privilege',
                              HINT = 'outboxgen.insert_key is the outbox''s own setting: leave it unset.';
                END IF;
                IF NOT earlier THEN
                    -- The key's head (its trigger skipped, or its earlier
                    -- rows left since), as the trigger would decide it
                    -- now; announced below with the statement's rows.
                    UPDATE /*outbox:table*/outbox AS o SET blocked = false WHERE o.id = keys.first[i];
                END IF;
            END LOOP;
        END IF;
    ELSE
        SELECT array_agg(k.queue) AS q, array_agg(k.ordering_key) AS k INTO keys
        FROM (SELECT DISTINCT n.queue, n.ordering_key FROM new_rows AS n WHERE n.ordering_key IS NOT NULL) AS k;
        IF keys.q IS NOT NULL THEN
            PERFORM /*outbox:table*/outbox_record_hand_offs(keys.q, keys.k);
        END IF;
    END IF;
    IF pg_sequence_last_value(/*outbox:literal*/'outbox_sleep_horizon') <= date_part('epoch', now()) * 1000 THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM /*outbox:table*/outbox_sleepers AS s WHERE s.until > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM /*outbox:table*/outbox_wake(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_notify_release() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION '% runs only as the AFTER UPDATE row trigger of %', /*outbox:literal*/'outbox_notify_release', /*outbox:literal*/'outbox'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM /*outbox:table*/outbox_wake(NEW.queue, NEW.next_attempt_at <= now());
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox'::regclass OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION '% runs only as the BEFORE UPDATE row trigger of %', /*outbox:literal*/'outbox_key_update', /*outbox:literal*/'outbox'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'the queue and ordering_key of an outbox row cannot change (row %)', OLD.id
        USING ERRCODE = 'check_violation',
              HINT = 'Delete the row and insert it again.';
END;
$$;
-- +goose StatementEnd

-- Schema 10's delete side, its count of key locks read as at least 0.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_hand_on() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    heads record;
    again record;
    record_queues text[];
    record_keys text[];
    locked_queues text[] := '{}';
    locked_keys text[] := '{}';
    taken integer;
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'DELETE' THEN
        RAISE EXCEPTION '% runs only as the AFTER DELETE statement trigger of %', /*outbox:literal*/'outbox_key_hand_on', /*outbox:literal*/'outbox'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(d.queue) AS q, array_agg(d.ordering_key) AS k INTO heads
    FROM (SELECT DISTINCT o.queue, o.ordering_key FROM old_rows AS o
          WHERE o.ordering_key IS NOT NULL AND NOT o.blocked) AS d;
    IF heads.q IS NULL THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- The snapshot may predate rows of the keys: the subscribers decide.
        PERFORM /*outbox:table*/outbox_record_hand_offs(heads.q, heads.k);
        RETURN NULL;
    END IF;
    SELECT * INTO again FROM /*outbox:table*/outbox_unblock_heads(heads.q, heads.k);
    record_queues := coalesce(again.busy_queues, '{}');
    record_keys := coalesce(again.busy_keys, '{}');
    IF again.unseen_queues IS NOT NULL THEN
        taken := greatest(coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer, 0);
        FOR i IN 1 .. cardinality(again.unseen_queues) LOOP
            IF taken < current_setting('max_locks_per_transaction')::integer / 2
               AND pg_try_advisory_xact_lock(/*outbox:table*/outbox_key_lock(again.unseen_queues[i], again.unseen_keys[i])) THEN
                taken := taken + 1;
                locked_queues := locked_queues || again.unseen_queues[i];
                locked_keys := locked_keys || again.unseen_keys[i];
            ELSE
                record_queues := record_queues || again.unseen_queues[i];
                record_keys := record_keys || again.unseen_keys[i];
            END IF;
        END LOOP;
        PERFORM set_config('outboxgen.key_locks', taken::text, true);
        IF cardinality(locked_queues) > 0 THEN
            -- Under the keys' locks: every row their publishers committed.
            SELECT * INTO again FROM /*outbox:table*/outbox_unblock_heads(locked_queues, locked_keys);
            record_queues := record_queues || coalesce(again.busy_queues, '{}');
            record_keys := record_keys || coalesce(again.busy_keys, '{}');
        END IF;
    END IF;
    IF cardinality(record_queues) > 0 THEN
        PERFORM /*outbox:table*/outbox_record_hand_offs(record_queues, record_keys);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_set_sleep_horizon() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    horizon bigint;
BEGIN
    IF TG_RELID <> /*outbox:literal*/'outbox_sleepers'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' THEN
        RAISE EXCEPTION '% runs only as the AFTER statement trigger of %', /*outbox:literal*/'outbox_set_sleep_horizon', /*outbox:literal*/'outbox_sleepers'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM /*outbox:table*/outbox_sleepers_turn AS s FOR UPDATE;
    horizon := coalesce(
        (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
         FROM /*outbox:table*/outbox_sleepers AS s WHERE s.until > now()),
        0);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        horizon := greatest(horizon, pg_sequence_last_value(/*outbox:literal*/'outbox_sleep_horizon'));
    END IF;
    PERFORM setval(/*outbox:literal*/'outbox_sleep_horizon', horizon);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION
    /*outbox:table*/outbox_key_insert(),
    /*outbox:table*/outbox_key_update(),
    /*outbox:table*/outbox_key_hand_on(),
    /*outbox:table*/outbox_notify(),
    /*outbox:table*/outbox_notify_release(),
    /*outbox:table*/outbox_set_sleep_horizon(),
    /*outbox:table*/outbox_unblock_head(text, text),
    /*outbox:table*/outbox_record_hand_off(text, text),
    /*outbox:table*/outbox_record_hand_offs(text[], text[]),
    /*outbox:table*/outbox_wake(text, boolean),
    /*outbox:table*/outbox_may_notify(),
    /*outbox:table*/outbox_notify_queue_usage()
FROM PUBLIC;
REVOKE ALL ON SEQUENCE /*outbox:table*/outbox_sleep_horizon FROM PUBLIC;

CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 11';

-- +goose Down
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 10';

GRANT SELECT ON SEQUENCE /*outbox:table*/outbox_sleep_horizon TO PUBLIC;
GRANT EXECUTE ON FUNCTION
    /*outbox:table*/outbox_key_insert(),
    /*outbox:table*/outbox_key_update(),
    /*outbox:table*/outbox_key_hand_on(),
    /*outbox:table*/outbox_notify(),
    /*outbox:table*/outbox_notify_release(),
    /*outbox:table*/outbox_set_sleep_horizon(),
    /*outbox:table*/outbox_unblock_head(text, text),
    /*outbox:table*/outbox_record_hand_off(text, text),
    /*outbox:table*/outbox_record_hand_offs(text[], text[]),
    /*outbox:table*/outbox_wake(text, boolean),
    /*outbox:table*/outbox_may_notify(),
    /*outbox:table*/outbox_notify_queue_usage()
TO PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_set_sleep_horizon() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    horizon bigint;
BEGIN
    PERFORM 1 FROM /*outbox:table*/outbox_sleepers_turn AS s FOR UPDATE;
    horizon := coalesce(
        (SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
         FROM /*outbox:table*/outbox_sleepers AS s WHERE s.until > now()),
        0);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        horizon := greatest(horizon, pg_sequence_last_value(/*outbox:literal*/'outbox_sleep_horizon'));
    END IF;
    PERFORM setval(/*outbox:literal*/'outbox_sleep_horizon', horizon);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_hand_on() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    heads record;
    again record;
    record_queues text[];
    record_keys text[];
    locked_queues text[] := '{}';
    locked_keys text[] := '{}';
    taken integer;
BEGIN
    SELECT array_agg(d.queue) AS q, array_agg(d.ordering_key) AS k INTO heads
    FROM (SELECT DISTINCT o.queue, o.ordering_key FROM old_rows AS o
          WHERE o.ordering_key IS NOT NULL AND NOT o.blocked) AS d;
    IF heads.q IS NULL THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- The snapshot may predate rows of the keys: the subscribers decide.
        PERFORM /*outbox:table*/outbox_record_hand_offs(heads.q, heads.k);
        RETURN NULL;
    END IF;
    SELECT * INTO again FROM /*outbox:table*/outbox_unblock_heads(heads.q, heads.k);
    record_queues := coalesce(again.busy_queues, '{}');
    record_keys := coalesce(again.busy_keys, '{}');
    IF again.unseen_queues IS NOT NULL THEN
        taken := coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer;
        FOR i IN 1 .. cardinality(again.unseen_queues) LOOP
            IF taken < current_setting('max_locks_per_transaction')::integer / 2
               AND pg_try_advisory_xact_lock(/*outbox:table*/outbox_key_lock(again.unseen_queues[i], again.unseen_keys[i])) THEN
                taken := taken + 1;
                locked_queues := locked_queues || again.unseen_queues[i];
                locked_keys := locked_keys || again.unseen_keys[i];
            ELSE
                record_queues := record_queues || again.unseen_queues[i];
                record_keys := record_keys || again.unseen_keys[i];
            END IF;
        END LOOP;
        PERFORM set_config('outboxgen.key_locks', taken::text, true);
        IF cardinality(locked_queues) > 0 THEN
            -- Under the keys' locks: every row their publishers committed.
            SELECT * INTO again FROM /*outbox:table*/outbox_unblock_heads(locked_queues, locked_keys);
            record_queues := record_queues || coalesce(again.busy_queues, '{}');
            record_keys := record_keys || coalesce(again.busy_keys, '{}');
        END IF;
    END IF;
    IF cardinality(record_queues) > 0 THEN
        PERFORM /*outbox:table*/outbox_record_hand_offs(record_queues, record_keys);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'the queue and ordering_key of an outbox row cannot change (row %)', OLD.id
        USING ERRCODE = 'check_violation',
              HINT = 'Delete the row and insert it again.';
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_notify_release() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM /*outbox:table*/outbox_wake(NEW.queue, NEW.next_attempt_at <= now());
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('outboxgen.insert_key', true) <> '' THEN
        PERFORM set_config('outboxgen.insert_key', '', true);
    END IF;
    IF pg_sequence_last_value(/*outbox:literal*/'outbox_sleep_horizon') <= date_part('epoch', now()) * 1000 THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM /*outbox:table*/outbox_sleepers AS s WHERE s.until > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM /*outbox:table*/outbox_wake(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP TRIGGER /*outbox:name*/outbox_key_insert_trg ON /*outbox:table*/outbox;
CREATE TRIGGER /*outbox:name*/outbox_key_insert_trg
    BEFORE INSERT ON /*outbox:table*/outbox
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL
          AND NOT (NEW.blocked AND coalesce(current_setting('outboxgen.insert_key', true), '')
                   = octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key))
    EXECUTE FUNCTION /*outbox:table*/outbox_key_insert();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    this_key text := octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key;
    same_key boolean := current_setting('outboxgen.insert_key', true) IS NOT DISTINCT FROM this_key;
    more_follow boolean := NEW.blocked;
BEGIN
    -- A key the statement remembers: its earlier row took the lock.
    IF NOT same_key THEN
        PERFORM pg_advisory_xact_lock(/*outbox:table*/outbox_key_lock(NEW.queue, NEW.ordering_key));
    END IF;
    NEW.id := nextval(/*outbox:literal*/'outbox_id_seq');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The key's newest row, if any (see schema 6).
        SELECT o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        INTO NEW.blocked
        FROM /*outbox:table*/outbox AS o
        WHERE o.ordering_key IS NOT NULL
          AND (o.queue, o.ordering_key, o.id) <= (NEW.queue COLLATE "C", NEW.ordering_key COLLATE "C", 9223372036854775807)
        ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC
        LIMIT 1;
        NEW.blocked := coalesce(NEW.blocked, false);
    ELSE
        NEW.blocked := true;
        -- Recorded once per key and statement (a record outlives a row
        -- that ON CONFLICT skipped).
        IF NOT same_key THEN
            PERFORM /*outbox:table*/outbox_record_hand_off(NEW.queue, NEW.ordering_key);
        END IF;
    END IF;
    -- A row that arrives blocked says that more rows of its key follow.
    IF more_follow AND NOT same_key THEN
        PERFORM set_config('outboxgen.insert_key', this_key, true);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
