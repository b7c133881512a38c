-- outboxgen: public.outbox 00003_create_outbox_notify.sql
-- Wake subscribers when rows arrive. The trigger is statement-level with a
-- transition table, so a batch of any size costs one pg_notify per distinct
-- queue, and rows written by any client (psql, COPY, another language) wake
-- subscribers the same way. Rows due now notify the outbox's channel; rows
-- due later notify its _scheduled channel instead, so idle subscribers can
-- set their wake-up to the new due time. PostgreSQL delivers notifications
-- only when the inserting transaction commits.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION "public"."outbox_notify"() RETURNS trigger
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

CREATE TRIGGER "outbox_notify_trg"
    AFTER INSERT ON "public"."outbox"
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION "public"."outbox_notify"();

-- +goose Down
DROP TRIGGER "outbox_notify_trg" ON "public"."outbox";
DROP FUNCTION "public"."outbox_notify"();
