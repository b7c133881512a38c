-- name: Listen :exec
-- Subscribes the session to the channels on which the NOTIFY trigger
-- announces due and scheduled rows.
LISTEN /*outbox:listen*/outbox_outbox;

-- name: KeepListening :exec
-- Lifts a role's or database's idle_session_timeout for the LISTEN
-- connection, a session of its own that idles by design between
-- notifications (and probes); every other session keeps it.
SELECT set_config('idle_session_timeout', '0', false)
WHERE current_setting('idle_session_timeout', true) <> '0';

-- name: ListenScheduled :exec
LISTEN /*outbox:listen*/"outbox_outbox:scheduled";

-- name: ListenHandoff :exec
LISTEN /*outbox:listen*/"outbox_outbox:handoff";

-- name: Probe :one
-- A bounded round trip that proves a connection is alive.
SELECT 1::integer AS alive;

-- name: Sleep :exec
-- Records that a subscriber sleeps on @queues for @for_seconds: until the
-- record lapses, writers of those queues' rows notify (migration 6). @id
-- is a random id per sleep: the subscriber refreshes its record while it
-- sleeps, and draws a new id when it sleeps again after a wake-up, so no
-- record has more versions than one sleep's refreshes. Paused queues are
-- left out of the record: writers of their rows need not wake a
-- subscriber that would not claim them (a resume notifies, see
-- ResumeQueue).
INSERT INTO /*outbox:table*/outbox_sleepers AS s (id, queues, until)
VALUES (@id::uuid,
        ARRAY(SELECT q.name FROM unnest(@queues::text[]) AS q(name)
              WHERE NOT EXISTS (SELECT FROM /*outbox:table*/outbox_pauses AS z WHERE z.queue = q.name)),
        now() + make_interval(secs => @for_seconds::float8))
ON CONFLICT (id) DO UPDATE SET queues = excluded.queues, until = excluded.until;

-- name: Wake :exec
-- Ends a subscriber's sleep record: it is claiming, so writers need not
-- notify it. The record is deleted: the records that hold are read through
-- the index on until (schema 12), which a deleted record leaves as soon as
-- its sleep would have lapsed.
DELETE FROM /*outbox:table*/outbox_sleepers AS s WHERE s.id = @id::uuid;

-- name: Leave :exec
-- Removes a stopping subscriber's record (@id, its last sleep's), and
-- records that lapsed more than an hour ago (subscribers that ended
-- without removing theirs).
DELETE FROM /*outbox:table*/outbox_sleepers AS s
WHERE s.id = @id::uuid OR s.until < now() - interval '1 hour';

-- name: InFlight :one
-- The transactions in progress now (in the whole cluster), as 64-bit
-- transaction ids: a writer that looked for sleep records before ours was
-- committed is among them or has committed. Locked claims (migration 7)
-- are left out: they write no rows a subscriber waits for.
-- Each transaction's record is looked up by its id, through the primary
-- key (a subquery per transaction, which no plan turns into a read of
-- every record).
SELECT coalesce(array_agg(x::text::bigint), '{}')::bigint[] AS xids
FROM pg_snapshot_xip(pg_current_snapshot()) AS x
WHERE (SELECT count(*) FROM (SELECT FROM /*outbox:table*/outbox_locks AS l WHERE l.xid = x::text::bigint LIMIT 1) AS r) = 0;

-- name: StillInFlight :one
-- Those of @xids still in progress.
SELECT coalesce(array_agg(x), '{}')::bigint[] AS xids
FROM unnest(@xids::bigint[]) AS x
WHERE pg_xact_status(x::text::xid8) = 'in progress';
