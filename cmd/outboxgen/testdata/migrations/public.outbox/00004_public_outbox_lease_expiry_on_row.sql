-- outboxgen: public.outbox 00004_lease_expiry_on_row.sql
-- Leases expire by the row: the claim and every heartbeat stamp the
-- holder's own expiry, so subscribers with different lease TTLs never take
-- each other's live rows. The row keeps the last handler error, so a
-- delivery that ends without running its handler (max_deliveries) still
-- records why it kept failing. A released or rescheduled row wakes the
-- listening subscribers the way a new row does. The scheduled channel gets
-- a name no outbox's due channel can have. The schema records its version,
-- whatever tool applied it.
--
-- Subscribers of releases older than this migration cannot claim rows
-- under it (their claims leave lease_expires_at unset, which the check
-- constraint refuses); stop them before applying it. Leases held when it is
-- applied expire 30 seconds after their last claim or heartbeat.

-- +goose Up
ALTER TABLE "public"."outbox"
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN last_error text;

UPDATE "public"."outbox" AS o
SET lease_expires_at = o.acquired_at + interval '30 seconds'
WHERE o.acquired_token IS NOT NULL;

-- One check for the whole lease, so every insert and update evaluates no
-- more constraints than before. last_error is written only by the library,
-- which cuts it to 2,048 characters.
ALTER TABLE "public"."outbox"
    DROP CONSTRAINT "outbox_lease_chk",
    ADD CONSTRAINT "outbox_lease_state_chk" CHECK (
        (acquired_token IS NULL) = (acquired_at IS NULL)
        AND (acquired_token IS NULL) = (lease_expires_at IS NULL));

-- Expired leases are found by their own expiry, through one index range
-- per queue, without scanning the backlog.
DROP INDEX "public"."outbox_leased_idx";
CREATE INDEX "outbox_lease_expiry_idx"
    ON "public"."outbox" (queue, lease_expires_at)
    WHERE acquired_token IS NOT NULL;

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

-- A row whose lease is cleared (a retry, a release at shutdown, an
-- operator's reset) announces itself like a new row. PostgreSQL folds
-- identical notifications of one transaction into one, so a batch costs a
-- notification per queue, not per row.
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_notify_release"() RETURNS trigger
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

CREATE TRIGGER "outbox_release_trg"
    AFTER UPDATE OF acquired_token ON "public"."outbox"
    FOR EACH ROW
    WHEN (OLD.acquired_token IS NOT NULL AND NEW.acquired_token IS NULL)
    EXECUTE FUNCTION "public"."outbox_notify_release"();

-- The schema version, for tools that did not apply the migrations
-- themselves; every later migration replaces it.
CREATE FUNCTION "public"."outbox_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 4';

-- +goose Down
DROP FUNCTION "public"."outbox_schema_version"();
DROP TRIGGER "outbox_release_trg" ON "public"."outbox";
DROP FUNCTION "public"."outbox_notify_release"();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "public"."outbox_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        CASE WHEN q.due THEN 'outbox_outbox' ELSE 'outbox_outbox_scheduled' END,
        q.queue)
    FROM (SELECT DISTINCT n.queue, n.next_attempt_at <= now() AS due FROM new_rows AS n) AS q;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP INDEX "public"."outbox_lease_expiry_idx";
CREATE INDEX "outbox_leased_idx"
    ON "public"."outbox" (queue, acquired_at)
    WHERE acquired_token IS NOT NULL;

ALTER TABLE "public"."outbox"
    DROP CONSTRAINT "outbox_lease_state_chk",
    ADD CONSTRAINT "outbox_lease_chk" CHECK ((acquired_token IS NULL) = (acquired_at IS NULL)),
    DROP COLUMN last_error,
    DROP COLUMN lease_expires_at;
