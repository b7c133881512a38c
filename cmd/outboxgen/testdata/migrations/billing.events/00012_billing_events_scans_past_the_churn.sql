-- outboxgen: billing.events 00012_scans_past_the_churn.sql
-- The scans of the hot path start past the row versions a held vacuum
-- horizon keeps.
--
-- A held vacuum horizon (a long query, pg_dump, a replica's feedback, a
-- lagging slot, an idle transaction) keeps every deleted or updated row
-- version and its index entries: an index scan cannot even mark them
-- dead. A scan that starts where the churn is walks every version since
-- the hold began. Measured with 20,000 rows through the outbox under a
-- held snapshot (BenchmarkHotPathBuffersUnderAHeldSnapshot), schema 11's
-- acknowledgement of two keyed rows touched 28,278 blocks where it
-- touches 27 with nothing held; every statement that read the records of
-- claims by lock or the sleep records read all of their versions.
--
-- Key hand-overs start at the row that changed:
--
-- - The delete trigger passes, per key, the lowest head it deleted; a
--   key's rows below its head are gone (ids of a key are drawn under the
--   key's lock, in the order of its rows), so the next row, if any, is
--   above it. Schema 10 looked from the key's first entry and, once the
--   table was analyzed, the planner read that lookup as an ORDER BY id
--   and walked the primary key from the outbox's first row.
-- - A recorded hand-over (<table>_handoff) keeps that id too (after_id),
--   and a subscriber's outbox_hand_off looks past the lowest recorded for
--   the key, and now says how many keys it handed on (the subscriber's
--   claims look for those rows behind where they stopped). Records
--   written without one (by the insert side outside READ COMMITTED, or
--   before this schema) look from the key's first entry, as before.
-- - The insert side's look for a row of the key (whether a new row waits
--   behind one) and the statement trigger's look for a row before the
--   statement's first stay within the key's own entries. They read the
--   ordering index downward from the key's end and stopped at the first
--   live row of any key, so a drained key walked its own dead entries and
--   then those of every key before it in text order. A drained key's own
--   dead entries are still walked: nothing tells a writer where its live
--   rows would start without reading them.
--
-- The lookups are ranges over the index's (ordering_key, id) under an
-- equality on queue: that order is the ordering index's alone, so no plan
-- walks the primary key, and the range's bounds on the key column end the
-- scan at the key's last (or first) entry. The functions that run them
-- plan without bitmap scans (enable_bitmapscan off for their own
-- statements): once the table is analyzed, a key of few live rows is
-- estimated as cheaper to read whole through a bitmap and sort, which
-- reads every entry the snapshot keeps where the index scan stops at the
-- first live one (210 blocks against 6 for a key with rows, measured).
--
-- The records of claims by lock are read through indexes: those that
-- hold by their until (the claims of the last lease), and those that name
-- a row through a GiST index on their ids, which the claims read only for
-- rows whose version another transaction locked (sql/queries/claim.sql),
-- instead of reading every record, one per claim by lock since the hold
-- began.
--
-- The sleep records that hold are found through an index on until,
-- newest first: writers' wake-ups and the sleep horizon read only the
-- records whose sleep has not lapsed (a record is deleted when its
-- subscriber wakes, and each sleep has a record of its own), instead of
-- every version of every record.
--
-- The subscribers' claims read each queue from where they stopped
-- (internal/claim's floors). A row given back (its lease cleared, due from
-- before now) lands behind that, so it is announced on the hand-over
-- channel too, on which the subscribers read their queues from the start.
--
-- Upgrading: <table>_handoff gains the nullable column after_id; records
-- already there keep NULL. Two indexes are built (<table>_locks and
-- <table>_sleepers are small). Functions are replaced; outbox_unblock_heads
-- takes the ids to look past, and outbox_hand_off returns a third count.

-- +goose Up
ALTER TABLE "billing"."events_handoff" ADD COLUMN after_id bigint;

-- The records of claims by lock that name a row, found by the row; and
-- those that hold, found by how long they hold.
CREATE INDEX "events_locks_ids_idx"
    ON "billing"."events_locks" USING gist (ids);
CREATE INDEX "events_locks_until_idx"
    ON "billing"."events_locks" (until);

-- The sleep records that hold, found by how long they hold.
CREATE INDEX "events_sleepers_until_idx"
    ON "billing"."events_sleepers" (until);

-- Records hand-overs of keys ks[i] of queues qs[i], whose next row lies
-- past id afters[i], for the subscribers to complete, and announces them
-- once per queue.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_record_hand_offs"(qs text[], ks text[], afters bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    INSERT INTO "billing"."events_handoff" (queue, ordering_key, after_id)
    SELECT h.q, h.k, h.a FROM unnest(qs, ks, afters) AS h(q, k, a);
    IF "billing"."events_may_notify"() THEN
        FOR q IN SELECT DISTINCT h.q FROM unnest(qs) AS h(q) LOOP
            PERFORM pg_notify('outbox_billing.events:handoff', q);
        END LOOP;
    END IF;
END;
$$;
-- +goose StatementEnd

-- Hands keys ks[i] of queues qs[i] on to their next rows past id
-- afters[i] (NULL: from the key's first entry), as schema 10's did: one
-- lookup of every key's next row, one row lock and one UPDATE for those
-- that are blocked, and one wake-up per queue. A key given more than once
-- looks past the lowest id given. Returns the keys it saw no row of
-- (unseen) and those whose next row another transaction holds (busy),
-- each with the id it looked past. It sees what was committed when it
-- starts: a caller that must see a key's every committed row takes the
-- key's lock first.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_unblock_heads"(qs text[], ks text[], afters bigint[],
    OUT unseen_queues text[], OUT unseen_keys text[], OUT unseen_afters bigint[],
    OUT busy_queues text[], OUT busy_keys text[], OUT busy_afters bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    next_ids bigint[];
    next_queues text[];
    next_keys text[];
    next_afters bigint[];
    done_ids bigint[];
    due_queues text[];
    later_queues text[];
BEGIN
    SELECT array_agg(h.id) FILTER (WHERE h.blocked),
           array_agg(k.q) FILTER (WHERE h.blocked),
           array_agg(k.k) FILTER (WHERE h.blocked),
           array_agg(k.a) FILTER (WHERE h.blocked),
           array_agg(k.q) FILTER (WHERE h.id IS NULL),
           array_agg(k.k) FILTER (WHERE h.id IS NULL),
           array_agg(k.a) FILTER (WHERE h.id IS NULL)
    INTO next_ids, next_queues, next_keys, next_afters, unseen_queues, unseen_keys, unseen_afters
    FROM (SELECT u.q, u.k, min(coalesce(u.a, -9223372036854775808)) AS a
          FROM unnest(qs, ks, afters) AS u(q, k, a) GROUP BY u.q, u.k) AS k
    LEFT JOIN LATERAL (
        SELECT o.id, o.blocked
        FROM "billing"."events" AS o
        WHERE o.ordering_key IS NOT NULL AND o.queue = k.q COLLATE "C"
          AND (o.ordering_key, o.id) > (k.k COLLATE "C", k.a)
          AND (o.ordering_key, o.id) <= (k.k COLLATE "C", 9223372036854775807)
        ORDER BY o.queue, o.ordering_key, o.id
        LIMIT 1
    ) AS h ON true;
    IF next_ids IS NULL THEN
        RETURN;
    END IF;
    WITH locked AS MATERIALIZED (
        SELECT o.id FROM "billing"."events" AS o WHERE o.id = ANY (next_ids)
        FOR NO KEY UPDATE SKIP LOCKED
    ), unblocked AS (
        UPDATE "billing"."events" AS o SET blocked = false
        FROM locked AS l WHERE o.id = l.id
        RETURNING o.id, o.queue, o.next_attempt_at <= now() AS due
    )
    SELECT array_agg(u.id),
           array_agg(DISTINCT u.queue) FILTER (WHERE u.due),
           array_agg(DISTINCT u.queue) FILTER (WHERE NOT u.due)
    INTO done_ids, due_queues, later_queues
    FROM unblocked AS u;
    IF coalesce(cardinality(done_ids), 0) < cardinality(next_ids) THEN
        SELECT array_agg(n.q), array_agg(n.k), array_agg(n.a) INTO busy_queues, busy_keys, busy_afters
        FROM unnest(next_ids, next_queues, next_keys, next_afters) AS n(id, q, k, a)
        WHERE n.id <> ALL (coalesce(done_ids, '{}'));
    END IF;
    PERFORM "billing"."events_wake"(w.q, true) FROM unnest(due_queues) AS w(q);
    PERFORM "billing"."events_wake"(w.q, false) FROM unnest(later_queues) AS w(q);
END;
$$;
-- +goose StatementEnd

-- Delete side (schema 11's), each key looked up past the lowest head the
-- statement deleted, and recorded with it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_key_hand_on"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $$
DECLARE
    heads record;
    again record;
    record_queues text[];
    record_keys text[];
    record_afters bigint[];
    locked_queues text[] := '{}';
    locked_keys text[] := '{}';
    locked_afters bigint[] := '{}';
    taken integer;
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'DELETE' THEN
        RAISE EXCEPTION '% runs only as the AFTER DELETE statement trigger of %', '"billing"."events_key_hand_on"', '"billing"."events"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(d.queue) AS q, array_agg(d.ordering_key) AS k, array_agg(d.head) AS a INTO heads
    FROM (SELECT o.queue, o.ordering_key, min(o.id) AS head FROM old_rows AS o
          WHERE o.ordering_key IS NOT NULL AND NOT o.blocked
          GROUP BY o.queue, o.ordering_key) AS d;
    IF heads.q IS NULL THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- The snapshot may predate rows of the keys: the subscribers decide.
        PERFORM "billing"."events_record_hand_offs"(heads.q, heads.k, heads.a);
        RETURN NULL;
    END IF;
    SELECT * INTO again FROM "billing"."events_unblock_heads"(heads.q, heads.k, heads.a);
    record_queues := coalesce(again.busy_queues, '{}');
    record_keys := coalesce(again.busy_keys, '{}');
    record_afters := coalesce(again.busy_afters, '{}');
    IF again.unseen_queues IS NOT NULL THEN
        taken := greatest(coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer, 0);
        FOR i IN 1 .. cardinality(again.unseen_queues) LOOP
            IF taken < current_setting('max_locks_per_transaction')::integer / 2
               AND pg_try_advisory_xact_lock("billing"."events_key_lock"(again.unseen_queues[i], again.unseen_keys[i])) THEN
                taken := taken + 1;
                locked_queues := locked_queues || again.unseen_queues[i];
                locked_keys := locked_keys || again.unseen_keys[i];
                locked_afters := locked_afters || again.unseen_afters[i];
            ELSE
                record_queues := record_queues || again.unseen_queues[i];
                record_keys := record_keys || again.unseen_keys[i];
                record_afters := record_afters || again.unseen_afters[i];
            END IF;
        END LOOP;
        PERFORM set_config('outboxgen.key_locks', taken::text, true);
        IF cardinality(locked_queues) > 0 THEN
            -- Under the keys' locks: every row their publishers committed.
            SELECT * INTO again FROM "billing"."events_unblock_heads"(locked_queues, locked_keys, locked_afters);
            record_queues := record_queues || coalesce(again.busy_queues, '{}');
            record_keys := record_keys || coalesce(again.busy_keys, '{}');
            record_afters := record_afters || coalesce(again.busy_afters, '{}');
        END IF;
    END IF;
    IF cardinality(record_queues) > 0 THEN
        PERFORM "billing"."events_record_hand_offs"(record_queues, record_keys, record_afters);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- Completes recorded hand-overs as schema 10 did, each key looked up past
-- the lowest id its records keep (from its first entry when one keeps
-- none), and a key still busy recorded again with that id. It returns
-- {waiting, more, handed}: handed counts the keys it handed on to a next
-- row, which the subscriber's claims then look for behind where they
-- stopped.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_hand_off"(queues text[], max_keys integer) RETURNS integer[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $$
DECLARE
    k record;
    waiting integer := 0;
    more integer := 0;
    locked_queues text[] := '{}';
    locked_keys text[] := '{}';
    locked_afters bigint[] := '{}';
    again record;
BEGIN
    -- In no order, without DISTINCT (see schema 9).
    FOR k IN
        SELECT h.queue, h.ordering_key, coalesce(h.after_id, -9223372036854775808) AS after_id
        FROM "billing"."events_handoff" AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF cardinality(locked_queues) >= greatest(max_keys, 1) THEN
            more := 1;
            EXIT;
        END IF;
        IF NOT pg_try_advisory_xact_lock("billing"."events_key_lock"(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        locked_queues := locked_queues || k.queue;
        locked_keys := locked_keys || k.ordering_key;
        locked_afters := locked_afters || k.after_id;
    END LOOP;
    IF cardinality(locked_queues) = 0 THEN
        RETURN ARRAY[waiting, more, 0];
    END IF;
    -- Every record of a locked key goes, those the loop did not reach
    -- too: each key is looked up past the lowest id of its records.
    WITH gone AS (
        DELETE FROM "billing"."events_handoff" AS h
        USING (SELECT DISTINCT l.q, l.k FROM unnest(locked_queues, locked_keys) AS l(q, k)) AS l
        WHERE h.queue = l.q AND h.ordering_key = l.k
        RETURNING h.queue, h.ordering_key, coalesce(h.after_id, -9223372036854775808) AS after_id
    )
    SELECT array_agg(g.q), array_agg(g.k), array_agg(g.a)
    INTO locked_queues, locked_keys, locked_afters
    FROM (SELECT u.q, u.k, min(u.a) AS a
          FROM (SELECT g.queue AS q, g.ordering_key AS k, g.after_id AS a FROM gone AS g
                UNION ALL
                SELECT l.q, l.k, l.a FROM unnest(locked_queues, locked_keys, locked_afters) AS l(q, k, a)) AS u
          GROUP BY u.q, u.k) AS g;
    SELECT * INTO again FROM "billing"."events_unblock_heads"(locked_queues, locked_keys, locked_afters);
    IF again.busy_queues IS NOT NULL THEN
        INSERT INTO "billing"."events_handoff" (queue, ordering_key, after_id)
        SELECT b.q, b.k, b.a FROM unnest(again.busy_queues, again.busy_keys, again.busy_afters) AS b(q, k, a);
        waiting := waiting + cardinality(again.busy_queues);
    END IF;
    RETURN ARRAY[waiting, more, cardinality(locked_queues) - coalesce(cardinality(again.unseen_queues), 0)
                                - coalesce(cardinality(again.busy_queues), 0)];
END;
$$;
-- +goose StatementEnd

-- Insert side (schema 11's), the key's newest row looked for among the
-- key's own index entries: the range stops at the key's first entry
-- instead of reading on, through the dead entries of the keys before it,
-- to the first live row of any key.
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

-- The statement trigger of inserts (schema 11's), its look for a row of
-- the key before the statement's first bounded the same way.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $$
DECLARE
    keys record;
    seen bigint;
    earlier boolean;
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the AFTER INSERT statement trigger of %', '"billing"."events_notify"', '"billing"."events"'
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
                         pg_advisory_xact_lock("billing"."events_key_lock"(n.queue, n.ordering_key))::text AS locked
                  FROM new_rows AS n WHERE n.ordering_key IS NOT NULL
                  GROUP BY n.queue, n.ordering_key HAVING bool_or(n.blocked)) AS f;
            FOR i IN 1 .. coalesce(cardinality(keys.q), 0) LOOP
                -- The count is bounded whichever index the planner takes:
                -- the key's rows from the statement's first on, or every
                -- row with an id from the statement's first on.
                SELECT (SELECT count(*)
                        FROM "billing"."events" AS o
                        WHERE o.ordering_key IS NOT NULL AND o.queue = keys.q[i] AND o.ordering_key = keys.k[i]
                          AND o.id >= keys.first[i]),
                       NOT keys.first_blocked[i] OR coalesce(
                       (SELECT true
                        FROM "billing"."events" AS o
                        WHERE o.ordering_key IS NOT NULL AND o.queue = keys.q[i] COLLATE "C"
                          AND (o.ordering_key, o.id) < (keys.k[i] COLLATE "C", keys.first[i])
                          AND (o.ordering_key, o.id) >= (keys.k[i] COLLATE "C", -9223372036854775808)
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
                    UPDATE "billing"."events" AS o SET blocked = false WHERE o.id = keys.first[i];
                END IF;
            END LOOP;
        END IF;
    ELSE
        SELECT array_agg(k.queue) AS q, array_agg(k.ordering_key) AS k INTO keys
        FROM (SELECT DISTINCT n.queue, n.ordering_key FROM new_rows AS n WHERE n.ordering_key IS NOT NULL) AS k;
        IF keys.q IS NOT NULL THEN
            PERFORM "billing"."events_record_hand_offs"(keys.q, keys.k);
        END IF;
    END IF;
    IF pg_sequence_last_value('"billing"."events_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT coalesce((SELECT true FROM "billing"."events_sleepers" AS s WHERE s.until > now()
                          ORDER BY s.until DESC LIMIT 1), false) THEN
        RETURN NULL;
    END IF;
    PERFORM "billing"."events_wake"(q.queue, q.due)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- A queue's sleep records, newest first through the index on until: as a
-- scalar subquery (an EXISTS drops the order), so that no plan reads the
-- table whole, which a held snapshot fills with versions.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_wake"(q text, due boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_sequence_last_value('"billing"."events_sleep_horizon"') <= date_part('epoch', now()) * 1000 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT coalesce((
           SELECT true FROM "billing"."events_sleepers" AS s
           WHERE s.until > now() AND q = ANY (s.queues)
           ORDER BY s.until DESC LIMIT 1), false) THEN
        RETURN;
    END IF;
    IF NOT "billing"."events_may_notify"() THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_billing.events' ELSE 'outbox_billing.events:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

-- A row whose lease is cleared without moving it later (released: a
-- stopping subscriber's unstarted rows, rows a record of a claim by lock
-- names) keeps its place in its queue's order, behind where the
-- subscribers' claims look: it is announced on the hand-over channel too,
-- whose subscribers then read their queues from the start. A retry is due
-- from now on, where the claims look.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify_release"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION '% runs only as the AFTER UPDATE row trigger of %', '"billing"."events_notify_release"', '"billing"."events"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM "billing"."events_wake"(NEW.queue, NEW.next_attempt_at <= now());
    IF NEW.next_attempt_at < now() AND "billing"."events_may_notify"() THEN
        -- Given back (a release), due from before now: behind where the
        -- subscribers' claims look. The hand-over channel asks them to
        -- look from their queues' start.
        PERFORM pg_notify('outbox_billing.events:handoff', NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION "billing"."events_unblock_heads"(text[], text[]);
REVOKE ALL ON FUNCTION
    "billing"."events_record_hand_offs"(text[], text[], bigint[]),
    "billing"."events_unblock_heads"(text[], text[], bigint[])
FROM PUBLIC;

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 12';

-- +goose Down
CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 11';

-- Schema 10's lookup, from each key's first entry.
-- +goose StatementBegin
CREATE FUNCTION "billing"."events_unblock_heads"(qs text[], ks text[],
    OUT unseen_queues text[], OUT unseen_keys text[], OUT busy_queues text[], OUT busy_keys text[])
LANGUAGE plpgsql AS $$
DECLARE
    next_ids bigint[];
    next_queues text[];
    next_keys text[];
    done_ids bigint[];
    due_queues text[];
    later_queues text[];
BEGIN
    SELECT array_agg(h.id) FILTER (WHERE h.blocked),
           array_agg(k.q) FILTER (WHERE h.blocked),
           array_agg(k.k) FILTER (WHERE h.blocked),
           array_agg(k.q) FILTER (WHERE h.id IS NULL),
           array_agg(k.k) FILTER (WHERE h.id IS NULL)
    INTO next_ids, next_queues, next_keys, unseen_queues, unseen_keys
    FROM (SELECT DISTINCT u.q, u.k FROM unnest(qs, ks) AS u(q, k)) AS k
    LEFT JOIN LATERAL (
        SELECT o.id, o.blocked
        FROM "billing"."events" AS o
        WHERE o.ordering_key IS NOT NULL AND o.queue = k.q AND o.ordering_key = k.k
        ORDER BY o.queue, o.ordering_key, o.id
        LIMIT 1
    ) AS h ON true;
    IF next_ids IS NULL THEN
        RETURN;
    END IF;
    WITH locked AS MATERIALIZED (
        SELECT o.id FROM "billing"."events" AS o WHERE o.id = ANY (next_ids)
        FOR NO KEY UPDATE SKIP LOCKED
    ), unblocked AS (
        UPDATE "billing"."events" AS o SET blocked = false
        FROM locked AS l WHERE o.id = l.id
        RETURNING o.id, o.queue, o.next_attempt_at <= now() AS due
    )
    SELECT array_agg(u.id),
           array_agg(DISTINCT u.queue) FILTER (WHERE u.due),
           array_agg(DISTINCT u.queue) FILTER (WHERE NOT u.due)
    INTO done_ids, due_queues, later_queues
    FROM unblocked AS u;
    IF coalesce(cardinality(done_ids), 0) < cardinality(next_ids) THEN
        SELECT array_agg(n.q), array_agg(n.k) INTO busy_queues, busy_keys
        FROM unnest(next_ids, next_queues, next_keys) AS n(id, q, k)
        WHERE n.id <> ALL (coalesce(done_ids, '{}'));
    END IF;
    PERFORM "billing"."events_wake"(w.q, true) FROM unnest(due_queues) AS w(q);
    PERFORM "billing"."events_wake"(w.q, false) FROM unnest(later_queues) AS w(q);
END;
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION "billing"."events_unblock_heads"(text[], text[]) FROM PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_key_hand_on"() RETURNS trigger
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
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'DELETE' THEN
        RAISE EXCEPTION '% runs only as the AFTER DELETE statement trigger of %', '"billing"."events_key_hand_on"', '"billing"."events"'
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
        PERFORM "billing"."events_record_hand_offs"(heads.q, heads.k);
        RETURN NULL;
    END IF;
    SELECT * INTO again FROM "billing"."events_unblock_heads"(heads.q, heads.k);
    record_queues := coalesce(again.busy_queues, '{}');
    record_keys := coalesce(again.busy_keys, '{}');
    IF again.unseen_queues IS NOT NULL THEN
        taken := greatest(coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer, 0);
        FOR i IN 1 .. cardinality(again.unseen_queues) LOOP
            IF taken < current_setting('max_locks_per_transaction')::integer / 2
               AND pg_try_advisory_xact_lock("billing"."events_key_lock"(again.unseen_queues[i], again.unseen_keys[i])) THEN
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
            SELECT * INTO again FROM "billing"."events_unblock_heads"(locked_queues, locked_keys);
            record_queues := record_queues || coalesce(again.busy_queues, '{}');
            record_keys := record_keys || coalesce(again.busy_keys, '{}');
        END IF;
    END IF;
    IF cardinality(record_queues) > 0 THEN
        PERFORM "billing"."events_record_hand_offs"(record_queues, record_keys);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_hand_off"(queues text[], max_keys integer) RETURNS integer[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k record;
    waiting integer := 0;
    more integer := 0;
    locked_queues text[] := '{}';
    locked_keys text[] := '{}';
    again record;
BEGIN
    -- In no order, without DISTINCT (see schema 9).
    FOR k IN
        SELECT h.queue, h.ordering_key
        FROM "billing"."events_handoff" AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF cardinality(locked_queues) >= greatest(max_keys, 1) THEN
            more := 1;
            EXIT;
        END IF;
        IF NOT pg_try_advisory_xact_lock("billing"."events_key_lock"(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        locked_queues := locked_queues || k.queue;
        locked_keys := locked_keys || k.ordering_key;
    END LOOP;
    IF cardinality(locked_queues) = 0 THEN
        RETURN ARRAY[waiting, more];
    END IF;
    DELETE FROM "billing"."events_handoff" AS h
    USING unnest(locked_queues, locked_keys) AS l(q, k)
    WHERE h.queue = l.q AND h.ordering_key = l.k;
    SELECT * INTO again FROM "billing"."events_unblock_heads"(locked_queues, locked_keys);
    IF again.busy_queues IS NOT NULL THEN
        INSERT INTO "billing"."events_handoff" (queue, ordering_key)
        SELECT b.q, b.k FROM unnest(again.busy_queues, again.busy_keys) AS b(q, k);
        waiting := waiting + cardinality(again.busy_queues);
    END IF;
    RETURN ARRAY[waiting, more];
END;
$$;
-- +goose StatementEnd

-- Schema 11's insert side and statement trigger.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_key_insert"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
        -- The key's newest row, if any (see schema 6).
        SELECT o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
        INTO NEW.blocked
        FROM "billing"."events" AS o
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    keys record;
    seen bigint;
    earlier boolean;
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION '% runs only as the AFTER INSERT statement trigger of %', '"billing"."events_notify"', '"billing"."events"'
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
                         pg_advisory_xact_lock("billing"."events_key_lock"(n.queue, n.ordering_key))::text AS locked
                  FROM new_rows AS n WHERE n.ordering_key IS NOT NULL
                  GROUP BY n.queue, n.ordering_key HAVING bool_or(n.blocked)) AS f;
            FOR i IN 1 .. coalesce(cardinality(keys.q), 0) LOOP
                -- The count is bounded whichever index the planner takes:
                -- the key's rows from the statement's first on, or every
                -- row with an id from the statement's first on.
                SELECT (SELECT count(*)
                        FROM "billing"."events" AS o
                        WHERE o.ordering_key IS NOT NULL AND o.queue = keys.q[i] AND o.ordering_key = keys.k[i]
                          AND o.id >= keys.first[i]),
                       NOT keys.first_blocked[i] OR coalesce(
                       (SELECT o.queue = keys.q[i] AND o.ordering_key = keys.k[i]
                        FROM "billing"."events" AS o
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
                    UPDATE "billing"."events" AS o SET blocked = false WHERE o.id = keys.first[i];
                END IF;
            END LOOP;
        END IF;
    ELSE
        SELECT array_agg(k.queue) AS q, array_agg(k.ordering_key) AS k INTO keys
        FROM (SELECT DISTINCT n.queue, n.ordering_key FROM new_rows AS n WHERE n.ordering_key IS NOT NULL) AS k;
        IF keys.q IS NOT NULL THEN
            PERFORM "billing"."events_record_hand_offs"(keys.q, keys.k);
        END IF;
    END IF;
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
    IF NOT "billing"."events_may_notify"() THEN
        RETURN;
    END IF;
    PERFORM pg_notify(
        CASE WHEN due THEN 'outbox_billing.events' ELSE 'outbox_billing.events:scheduled' END,
        q);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "billing"."events_notify_release"() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> '"billing"."events"'::regclass OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION '% runs only as the AFTER UPDATE row trigger of %', '"billing"."events_notify_release"', '"billing"."events"'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM "billing"."events_wake"(NEW.queue, NEW.next_attempt_at <= now());
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION "billing"."events_unblock_heads"(text[], text[], bigint[]);
DROP FUNCTION "billing"."events_record_hand_offs"(text[], text[], bigint[]);
ALTER TABLE "billing"."events_handoff" DROP COLUMN after_id;
DROP INDEX "billing"."events_sleepers_until_idx";
DROP INDEX "billing"."events_locks_until_idx";
DROP INDEX "billing"."events_locks_ids_idx";
