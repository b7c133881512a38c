-- +goose Up
ALTER TABLE shipments ADD COLUMN carrier text NOT NULL DEFAULT 'post';

-- +goose Down
ALTER TABLE shipments DROP COLUMN carrier;
