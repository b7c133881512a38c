-- name: CreateSchema :exec
-- Creates the outbox's schema before migrations run: goose keeps its version
-- table there, so the schema must exist before the first migration.
CREATE SCHEMA IF NOT EXISTS /*outbox:schema*/public;
