-- name: CreateSchema :exec
-- Creates the outbox's schema before migrations run: goose keeps its version
-- table there, so the schema must exist before the first migration.
CREATE SCHEMA IF NOT EXISTS /*outbox:schema*/public;

-- name: SchemaObjects :one
-- Which of the outbox's objects exist, for telling the schema's version
-- when its version function does not exist yet (schemas older than
-- migration 4), and whether the library's migration history exists.
-- Relations are schema-qualified, quoted names; @schema_name is quoted,
-- the functions' names are not (both take no arguments). The functions
-- are looked up by name, arguments and schema at once: to_regprocedure
-- reads every function of the name in every schema, which a database
-- with an outbox in each of many schemas pays at every call.
SELECT to_regclass(@table_name::text) IS NOT NULL AS has_table,
       to_regclass(@dlq_name::text) IS NOT NULL AS has_dlq,
       EXISTS (SELECT FROM pg_catalog.pg_proc AS p
               WHERE p.proname = @notify_fn::text AND p.proargtypes = ''::pg_catalog.oidvector
                 AND p.pronamespace = to_regnamespace(@schema_name::text))::boolean AS has_notify,
       EXISTS (SELECT FROM pg_catalog.pg_proc AS p
               WHERE p.proname = @version_fn::text AND p.proargtypes = ''::pg_catalog.oidvector
                 AND p.pronamespace = to_regnamespace(@schema_name::text))::boolean AS has_version,
       (to_regclass(@history_name::text) IS NOT NULL)::boolean AS has_history;

-- name: SchemaVersion :one
-- The version the schema's own function reports (migration 4 on).
SELECT /*outbox:table*/outbox_schema_version()::integer AS version;

-- name: SchemaExists :one
-- Whether the outbox's schema exists (@name: quoted), so that Migrate
-- creates it only when it is missing: CREATE SCHEMA IF NOT EXISTS needs
-- the CREATE privilege on the database even when the schema exists.
SELECT (to_regnamespace(@name::text) IS NOT NULL)::boolean AS exists;

-- name: MigrationLock :one
-- Tries, for the calling transaction, the advisory lock that serialises
-- the migrations of this outbox (@id: its lock id). Migrate holds it in a
-- transaction of its own, idle while goose migrates on other connections,
-- so the transaction exempts itself from idle_in_transaction_session_timeout.
SELECT pg_try_advisory_xact_lock(@id::bigint) AS locked,
       set_config('idle_in_transaction_session_timeout', '0', true) AS idle_timeout;

-- name: CurrentSchema :one
-- The schema unqualified names are created in: the first of the session's
-- search_path that exists, "" when none does. outboxtest checks with it
-- that a search_path given at connect took effect (a pooler may drop it).
SELECT coalesce(current_schema()::text, '')::text AS schema;
