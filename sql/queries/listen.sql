-- name: Listen :exec
-- Subscribes the session to the channels on which the NOTIFY trigger
-- announces due and scheduled rows.
LISTEN /*outbox:listen*/outbox_outbox;

-- name: ListenScheduled :exec
LISTEN /*outbox:listen*/"outbox_outbox:scheduled";

-- name: ListenHandoff :exec
LISTEN /*outbox:listen*/"outbox_outbox:handoff";

-- name: Probe :one
-- A bounded round trip that proves a connection is alive.
SELECT 1::integer AS alive;
