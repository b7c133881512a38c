-- +goose Up
CREATE TABLE shipments (
    order_id text PRIMARY KEY,
    attempt  integer NOT NULL
);

-- +goose Down
DROP TABLE shipments;
