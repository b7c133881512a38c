-- Cheaper per-key order: the hand-over runs once per statement and takes
-- the key's lock only when it must, recorded hand-overs are completed
-- together, and the rows of a key that one statement inserts after its
-- first do not run the trigger when they arrive blocked, as
-- PublishBatch's now do.
--
-- Delete side. Schema 9 ran a row trigger for every head a statement
-- deleted: it took the key's advisory lock, at most
-- max_locks_per_transaction / 2 of them per transaction, and recorded
-- every further hand-over for the subscribers to complete, so a claim
-- ending by deleting 250 heads of distinct keys handed 32 on itself and
-- recorded 218. The lock is needed only when the deleting transaction
-- sees no other row of the key. A row of the key it does see was
-- committed, and every row a publisher of the key has yet to commit has
-- a higher id (publishers draw ids under the key's lock, held until they
-- commit), so that row is the key's next head whoever holds the lock.
-- The hand-over is now a statement trigger over the deleted rows (a
-- transition table): it looks up every key's next row in one query,
-- unblocks the ones it sees in one UPDATE without the keys' locks, and
-- spends its lock budget only on keys it sees no row of. For those a
-- publisher of the key may be in flight, and the lock (or the recorded
-- hand-over when it is held) makes that publisher's row the head once
-- both commit. The subscribers' outbox_hand_off hands the keys it locks
-- on through the same set-based function.
--
-- Insert side. PublishBatch writes the rows of a keyed call in one
-- statement and now inserts them already blocked. The trigger decides
-- such a row as it decides any row, and remembers its key for the rest
-- of the statement (outboxgen.insert_key, an internal setting, cleared by
-- the statement trigger at the statement's end). A later row of that key
-- arriving blocked skips the trigger altogether (its WHEN condition): the
-- earlier row of the key is in the table, nothing deletes a statement's
-- own rows while it runs, the statement holds the key's lock, and the
-- row's id, drawn as the row is formed, comes after the earlier row's.
-- Rows that arrive unblocked, as every other writer's do, run the trigger
-- as in schema 9 (without taking a remembered key's lock again). A writer
-- that supplies blocked itself in a statement that can skip rows (INSERT
-- ... ON CONFLICT DO NOTHING skips a row after its BEFORE triggers ran),
-- or that gives rows their own ids (OVERRIDING SYSTEM VALUE), takes over
-- the order of those rows.
--
-- Upgrading: nothing in the tables changes; the delete trigger and the
-- trigger functions are replaced.

-- +goose Up
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

-- A row that arrives blocked, of a key the statement remembers, needs
-- nothing of the trigger.
DROP TRIGGER /*outbox:name*/outbox_key_insert_trg ON /*outbox:table*/outbox;
CREATE TRIGGER /*outbox:name*/outbox_key_insert_trg
    BEFORE INSERT ON /*outbox:table*/outbox
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL
          AND NOT (NEW.blocked AND coalesce(current_setting('outboxgen.insert_key', true), '')
                   = octet_length(NEW.queue)::text || E'\x1f' || NEW.queue || E'\x1f' || NEW.ordering_key))
    EXECUTE FUNCTION /*outbox:table*/outbox_key_insert();

-- The statement trigger of inserts also ends the statement's memory of
-- its last key.
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

-- Records hand-overs of keys ks[i] of queues qs[i] for the subscribers to
-- complete, and announces them once per queue (see schema 9's
-- outbox_record_hand_off).
-- +goose StatementBegin
CREATE FUNCTION /*outbox:table*/outbox_record_hand_offs(qs text[], ks text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    INSERT INTO /*outbox:table*/outbox_handoff (queue, ordering_key)
    SELECT h.q, h.k FROM unnest(qs, ks) AS h(q, k);
    IF /*outbox:table*/outbox_may_notify() THEN
        FOR q IN SELECT DISTINCT h.q FROM unnest(qs) AS h(q) LOOP
            PERFORM pg_notify(/*outbox:channel*/'outbox_outbox:handoff', q);
        END LOOP;
    END IF;
END;
$$;
-- +goose StatementEnd

-- Hands keys ks[i] of queues qs[i] on to their next rows, as many keys as
-- given in a few statements: one lookup of every key's lowest row, one row
-- lock and one UPDATE for those that are blocked, and one wake-up per
-- queue. Returns the keys it saw no row of (unseen) and those whose next
-- row another transaction holds (busy: it is being deleted, or handed on
-- by a subscriber). The lookup is an equality on the ordering index's
-- columns, joined laterally: its plan cannot depend on which keys are
-- frequent (the reason schema 6's lookups are ranges), and it costs half
-- as much as the range. It sees what was committed when it starts: a
-- caller that must see a key's every committed row takes the key's lock
-- first.
-- +goose StatementBegin
CREATE FUNCTION /*outbox:table*/outbox_unblock_heads(qs text[], ks text[],
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
        FROM /*outbox:table*/outbox AS o
        WHERE o.ordering_key IS NOT NULL AND o.queue = k.q AND o.ordering_key = k.k
        ORDER BY o.queue, o.ordering_key, o.id
        LIMIT 1
    ) AS h ON true;
    IF next_ids IS NULL THEN
        RETURN;
    END IF;
    WITH locked AS MATERIALIZED (
        SELECT o.id FROM /*outbox:table*/outbox AS o WHERE o.id = ANY (next_ids)
        FOR NO KEY UPDATE SKIP LOCKED
    ), unblocked AS (
        UPDATE /*outbox:table*/outbox AS o SET blocked = false
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
    PERFORM /*outbox:table*/outbox_wake(w.q, true) FROM unnest(due_queues) AS w(q);
    PERFORM /*outbox:table*/outbox_wake(w.q, false) FROM unnest(later_queues) AS w(q);
END;
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION /*outbox:table*/outbox_unblock_heads(text[], text[]) FROM PUBLIC;

-- Delete side, once per statement over the heads it deleted (a claim's
-- end deletes hundreds at once). Keys whose next row it sees are handed
-- on without their locks. A key it sees no row of takes the key's lock,
-- within the budget of schema 9, and is looked up again under it; every
-- other key's hand-over is recorded.
-- +goose StatementBegin
CREATE FUNCTION /*outbox:table*/outbox_key_hand_on() RETURNS trigger
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

-- Completes recorded hand-overs as schema 9 did (at most max_keys keys
-- locked, {waiting, more} returned), handing the locked keys on together
-- through outbox_unblock_heads instead of one at a time.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_hand_off(queues text[], max_keys integer) RETURNS integer[]
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
        FROM /*outbox:table*/outbox_handoff AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF cardinality(locked_queues) >= greatest(max_keys, 1) THEN
            more := 1;
            EXIT;
        END IF;
        IF NOT pg_try_advisory_xact_lock(/*outbox:table*/outbox_key_lock(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        locked_queues := locked_queues || k.queue;
        locked_keys := locked_keys || k.ordering_key;
    END LOOP;
    IF cardinality(locked_queues) = 0 THEN
        RETURN ARRAY[waiting, more];
    END IF;
    DELETE FROM /*outbox:table*/outbox_handoff AS h
    USING unnest(locked_queues, locked_keys) AS l(q, k)
    WHERE h.queue = l.q AND h.ordering_key = l.k;
    SELECT * INTO again FROM /*outbox:table*/outbox_unblock_heads(locked_queues, locked_keys);
    IF again.busy_queues IS NOT NULL THEN
        INSERT INTO /*outbox:table*/outbox_handoff (queue, ordering_key)
        SELECT b.q, b.k FROM unnest(again.busy_queues, again.busy_keys) AS b(q, k);
        waiting := waiting + cardinality(again.busy_queues);
    END IF;
    RETURN ARRAY[waiting, more];
END;
$$;
-- +goose StatementEnd

DROP TRIGGER /*outbox:name*/outbox_key_delete_trg ON /*outbox:table*/outbox;
DROP FUNCTION /*outbox:table*/outbox_key_delete();
CREATE TRIGGER /*outbox:name*/outbox_key_delete_trg
    AFTER DELETE ON /*outbox:table*/outbox
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION /*outbox:table*/outbox_key_hand_on();

CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 10';

-- +goose Down
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 9';

DROP TRIGGER /*outbox:name*/outbox_key_insert_trg ON /*outbox:table*/outbox;
CREATE TRIGGER /*outbox:name*/outbox_key_insert_trg
    BEFORE INSERT ON /*outbox:table*/outbox
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION /*outbox:table*/outbox_key_insert();

DROP TRIGGER /*outbox:name*/outbox_key_delete_trg ON /*outbox:table*/outbox;
DROP FUNCTION /*outbox:table*/outbox_key_hand_on();
DROP FUNCTION /*outbox:table*/outbox_unblock_heads(text[], text[]);
DROP FUNCTION /*outbox:table*/outbox_record_hand_offs(text[], text[]);

-- +goose StatementBegin
CREATE FUNCTION /*outbox:table*/outbox_key_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    taken integer;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        taken := coalesce(nullif(current_setting('outboxgen.key_locks', true), ''), '0')::integer;
        IF taken < current_setting('max_locks_per_transaction')::integer / 2
           AND pg_try_advisory_xact_lock(/*outbox:table*/outbox_key_lock(OLD.queue, OLD.ordering_key)) THEN
            PERFORM set_config('outboxgen.key_locks', (taken + 1)::text, true);
            IF /*outbox:table*/outbox_unblock_head(OLD.queue, OLD.ordering_key) THEN
                RETURN NULL;
            END IF;
        END IF;
    END IF;
    PERFORM /*outbox:table*/outbox_record_hand_off(OLD.queue, OLD.ordering_key);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER /*outbox:name*/outbox_key_delete_trg
    AFTER DELETE ON /*outbox:table*/outbox
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.blocked)
    EXECUTE FUNCTION /*outbox:table*/outbox_key_delete();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_key_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(/*outbox:table*/outbox_key_lock(NEW.queue, NEW.ordering_key));
    NEW.id := nextval(/*outbox:literal*/'outbox_id_seq');
    IF current_setting('transaction_isolation') = 'read committed' THEN
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
        PERFORM /*outbox:table*/outbox_record_hand_off(NEW.queue, NEW.ordering_key);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Schema 9's: completes recorded hand-overs of the given queues, locking
-- at most max_keys keys, and returns {waiting, more}: how many keys it found
-- still held by another transaction, and 1 when it stopped at max_keys
-- with keys left to try (call it again at once), else 0.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_hand_off(queues text[], max_keys integer) RETURNS integer[]
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
        FROM /*outbox:table*/outbox_handoff AS h
        WHERE h.queue = ANY(queues)
    LOOP
        IF locked >= greatest(max_keys, 1) THEN
            RETURN ARRAY[waiting, 1];
        END IF;
        IF NOT pg_try_advisory_xact_lock(/*outbox:table*/outbox_key_lock(k.queue, k.ordering_key)) THEN
            waiting := waiting + 1;
            CONTINUE;
        END IF;
        locked := locked + 1;
        DELETE FROM /*outbox:table*/outbox_handoff AS h
        WHERE h.queue = k.queue AND h.ordering_key = k.ordering_key;
        IF NOT /*outbox:table*/outbox_unblock_head(k.queue, k.ordering_key) THEN
            INSERT INTO /*outbox:table*/outbox_handoff (queue, ordering_key) VALUES (k.queue, k.ordering_key);
            waiting := waiting + 1;
        END IF;
    END LOOP;
    RETURN ARRAY[waiting, 0];
END;
$$;
-- +goose StatementEnd
