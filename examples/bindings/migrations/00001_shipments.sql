-- +goose Up
-- The shop's own table: one row per shipped order.
CREATE TABLE shipments (
    order_id   text PRIMARY KEY,
    customer   text NOT NULL,
    shipped_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE shipments;
