-- outboxgen: public.outbox 00002_create_outbox_dlq.sql
-- The dead-letter table: rows that reached a terminal failure, kept for an
-- operator to inspect, replay or purge.

-- +goose Up
CREATE TABLE "public"."outbox_dlq" (
    id               bigint      NOT NULL,
    queue            text        COLLATE "C" NOT NULL,
    payload          bytea       NOT NULL,
    headers          jsonb,
    ordering_key     text,
    timer_id         text,
    deliveries_count integer     NOT NULL,
    attempts_count   integer     NOT NULL,
    created_at       timestamptz NOT NULL,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    failure_reason   text        NOT NULL,
    last_error       text,
    CONSTRAINT "outbox_dlq_pkey" PRIMARY KEY (id),
    CONSTRAINT "outbox_dlq_reason_chk" CHECK (
        failure_reason IN ('max_deliveries', 'retry_exhausted', 'rejected', 'decode_error')
    ),
    CONSTRAINT "outbox_dlq_last_error_chk" CHECK (octet_length(last_error) <= 8192)
);

CREATE INDEX "outbox_dlq_queue_idx"
    ON "public"."outbox_dlq" (queue, failed_at);

-- +goose Down
DROP TABLE "public"."outbox_dlq";
