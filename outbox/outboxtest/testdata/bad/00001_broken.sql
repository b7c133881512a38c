-- +goose Up
CREATE TABLE shipments (order_id text REFERENCES no_such_table);
