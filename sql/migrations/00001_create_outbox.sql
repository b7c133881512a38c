-- The outbox table. Every identifier that depends on the configured table
-- carries an /*outbox:KIND*/ marker; the outbox package renders the file for
-- the configured schema and table before goose applies it.

-- +goose Up
CREATE TABLE /*outbox:table*/outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME /*outbox:table*/outbox_id_seq),
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
    CONSTRAINT /*outbox:name*/outbox_pkey PRIMARY KEY (id),
    CONSTRAINT /*outbox:name*/outbox_queue_chk CHECK (octet_length(queue) BETWEEN 1 AND 255),
    CONSTRAINT /*outbox:name*/outbox_lease_chk CHECK ((acquired_token IS NULL) = (acquired_at IS NULL)),
    CONSTRAINT /*outbox:name*/outbox_headers_chk CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- Rows in claim order: a claim walks one queue's range from the oldest due
-- row and takes those whose lease is unset or expired. The index names no
-- lease column, not even in a predicate, so a claim (which only sets the
-- lease) is a HOT update: a new row version on the same page and no index
-- writes at all, where a lease-predicated index would take two index
-- inserts per claimed row. The price is that a claim steps over rows whose
-- lease is still fresh; there are only as many as are in flight.
-- Keys end in the unique id, so B-tree deduplication can never merge them;
-- turning it off spares every insert into a full page a futile
-- deduplication pass.
CREATE INDEX /*outbox:name*/outbox_pending_idx
    ON /*outbox:table*/outbox (queue, next_attempt_at, id)
    WITH (deduplicate_items = off);

-- One live row per queue and timer id.
CREATE UNIQUE INDEX /*outbox:name*/outbox_timer_uidx
    ON /*outbox:table*/outbox (queue, timer_id)
    WHERE timer_id IS NOT NULL;

-- Per-key FIFO delivery.
CREATE INDEX /*outbox:name*/outbox_ordering_idx
    ON /*outbox:table*/outbox (queue, ordering_key, id)
    WITH (deduplicate_items = off)
    WHERE ordering_key IS NOT NULL;

-- A queue table churns: every row is inserted, updated a few times and
-- deleted within seconds. Vacuum it early and often so dead tuples do not
-- pile up in front of the claim's index scans, and leave half of each page
-- free so the claim's update finds room for its HOT version.
ALTER TABLE /*outbox:table*/outbox SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- +goose Down
DROP TABLE /*outbox:table*/outbox;
