-- outboxgen: public.outbox 00001_create_outbox.sql
-- The outbox table, its indexes and its storage settings.

-- +goose Up
CREATE TABLE "public"."outbox" (
    id               bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME "public"."outbox_id_seq"),
    queue            text        COLLATE "C" NOT NULL,
    payload          bytea       NOT NULL,
    headers          jsonb,
    ordering_key     text        COLLATE "C",
    timer_id         text        COLLATE "C",
    created_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    attempts_count   integer     NOT NULL DEFAULT 0,
    deliveries_count integer     NOT NULL DEFAULT 0,
    first_attempt_at timestamptz,
    last_attempt_at  timestamptz,
    acquired_at      timestamptz,
    acquired_token   uuid,
    CONSTRAINT "outbox_pkey" PRIMARY KEY (id),
    CONSTRAINT "outbox_queue_chk" CHECK (octet_length(queue) BETWEEN 1 AND 255),
    CONSTRAINT "outbox_lease_chk" CHECK ((acquired_token IS NULL) = (acquired_at IS NULL)),
    CONSTRAINT "outbox_headers_chk" CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- Rows waiting for their first (or next) delivery, in claim order. Keys
-- that end in id are unique, so B-tree deduplication can never merge them;
-- turning it off spares every insert into a full page a futile
-- deduplication pass (about a tenth of a batch insert's cost).
CREATE INDEX "outbox_pending_idx"
    ON "public"."outbox" (queue, next_attempt_at, id)
    WITH (deduplicate_items = off)
    WHERE acquired_token IS NULL;

-- Leased rows, so expired leases are found without scanning the backlog.
CREATE INDEX "outbox_leased_idx"
    ON "public"."outbox" (queue, acquired_at)
    WHERE acquired_token IS NOT NULL;

-- One live row per queue and timer id.
CREATE UNIQUE INDEX "outbox_timer_uidx"
    ON "public"."outbox" (queue, timer_id)
    WHERE timer_id IS NOT NULL;

-- Per-key FIFO delivery.
CREATE INDEX "outbox_ordering_idx"
    ON "public"."outbox" (queue, ordering_key, id)
    WITH (deduplicate_items = off)
    WHERE ordering_key IS NOT NULL;

-- A queue table churns: every row is inserted, updated a few times and
-- deleted within seconds. Vacuum it early and often so dead tuples do not
-- pile up in front of the claim's index scans.
ALTER TABLE "public"."outbox" SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- +goose Down
DROP TABLE "public"."outbox";
