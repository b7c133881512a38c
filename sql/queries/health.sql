-- name: TableHealth :one
-- The outbox table's vacuum state, from the statistics collector (which
-- lags by up to a few hundred milliseconds): live and dead tuples, the
-- seconds since its last vacuum (-1: never), and the age in transactions of its oldest unfrozen row
-- (past autovacuum_freeze_max_age a vacuum to prevent wraparound runs).
-- And the usage of the server's notification queue, from 0 to 1. No row
-- when the table does not exist. @table_name is the
-- schema-qualified, quoted name.
SELECT coalesce(s.n_live_tup, 0)::bigint AS live_tuples,
       coalesce(s.n_dead_tup, 0)::bigint AS dead_tuples,
       coalesce(date_part('epoch', now() - greatest(s.last_vacuum, s.last_autovacuum)), -1)::float8 AS since_vacuum_seconds,
       age(c.relfrozenxid)::bigint AS xid_age,
       pg_notification_queue_usage()::float8 AS notification_queue_usage
FROM pg_catalog.pg_class AS c
LEFT JOIN pg_catalog.pg_stat_all_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass(@table_name::text);

-- name: OldestXmin :many
-- What holds back vacuum in the whole cluster, oldest first: the session,
-- replication slot or prepared transaction whose snapshot horizon (xmin)
-- is oldest, its age in transactions, and for a session how long its
-- transaction has been open. Rows deleted after that horizon stay in
-- every table, the outbox's included, until it moves. The state and the
-- open time of another role's session show only to roles with its
-- privileges or pg_read_all_stats: hidden says they could not be read.
-- The caller's own session is left out.
SELECT h.kind::text AS kind, h.name::text AS name, h.xmin_age::bigint AS xmin_age,
       h.xact_seconds::float8 AS xact_seconds, h.state::text AS state, h.hidden::boolean AS hidden
FROM (
    SELECT 'session' AS kind,
           format('pid %s (%s%s)', a.pid, a.usename,
                  CASE WHEN a.application_name <> '' THEN ', ' || a.application_name ELSE '' END) AS name,
           age(a.backend_xmin) AS xmin_age,
           coalesce(date_part('epoch', now() - a.xact_start), 0) AS xact_seconds,
           coalesce(a.state, '') AS state,
           coalesce(NOT (pg_has_role(a.usesysid, 'USAGE') OR pg_has_role('pg_read_all_stats', 'USAGE')), false) AS hidden
    FROM pg_catalog.pg_stat_activity AS a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT 'replication slot', r.slot_name::text, greatest(age(r.xmin), age(r.catalog_xmin)), 0,
           CASE WHEN r.active THEN 'active' ELSE 'inactive' END, false
    FROM pg_catalog.pg_replication_slots AS r
    WHERE r.xmin IS NOT NULL OR r.catalog_xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', p.gid, age(p.transaction), date_part('epoch', now() - p.prepared), 'prepared', false
    FROM pg_catalog.pg_prepared_xacts AS p
) AS h
ORDER BY h.xmin_age DESC
LIMIT 1;

-- name: ListenProbe :exec
-- Subscribes the session to the channel of the NOTIFY probes (Health's, and
-- a subscriber's check that its LISTEN connection hears).
LISTEN /*outbox:listen*/"outbox_outbox:probe";

-- name: NotifyProbe :exec
-- Sends Health's NOTIFY probe, @payload telling probes apart.
SELECT pg_notify(/*outbox:channel*/'outbox_outbox:probe', @payload::text);
