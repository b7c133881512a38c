-- outboxgen: billing.events 00014_operators.sql
-- What operators need: queue pause and resume, and live subscribers.
--
-- A row in <table>_pauses pauses its queue: every claim of the queue's
-- rows reads the table and passes the queue by, in the outbox table and
-- in the ring, so subscribers stop handing its rows out at their next
-- claim; rows already claimed finish, and publishing goes on. The ring's
-- claims move a paused queue's new rows into the outbox table, unhanded,
-- so the ring keeps turning; they wait there. Deleting the row resumes
-- the queue. A pause is data: it survives restarts of subscribers and of
-- the database, and every process sees it at its next claim.
--
-- A row in <table>_subscribers is a running subscriber's presence: its
-- process, queues, workers, claim path and what it is doing, written
-- when it starts and every few seconds while it runs (one small row
-- updated in place per subscriber: a held vacuum horizon keeps a few
-- hundred versions of it an hour), deleted when it stops. A record not
-- refreshed for three of its intervals belongs to a subscriber that is
-- gone; records gone for an hour are deleted by the next write of any.
--
-- Upgrading: two new tables and the version function; nothing else is
-- locked. Subscribers of schema 13 neither read the pauses nor write
-- presence, so pause a queue only once every subscriber of it runs this
-- release. The subscriber role needs the new grants (outboxgen grants,
-- Outbox.Grant) to claim, to pause and resume, and to show itself; the
-- publisher role has none on them.
--
-- Down drops both tables: every paused queue runs again.

-- +goose Up
CREATE TABLE "billing"."events_pauses" (
    queue     text        COLLATE "C" PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    -- The role that paused it, and why (free text, may be empty).
    paused_by text        NOT NULL DEFAULT session_user,
    reason    text        NOT NULL DEFAULT '',
    CONSTRAINT "events_pauses_queue_chk" CHECK (octet_length(queue) BETWEEN 1 AND 255),
    CONSTRAINT "events_pauses_reason_chk" CHECK (octet_length(reason) <= 1024)
);

CREATE TABLE "billing"."events_subscribers" (
    id            uuid        PRIMARY KEY,
    -- SubscriberConfig.Name, the host name and the process id.
    name          text        NOT NULL,
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    queues        text[]      NOT NULL,
    workers       integer     NOT NULL,
    -- Handlers running, and rows held (claimed, not yet written).
    busy          integer     NOT NULL,
    in_flight     integer     NOT NULL,
    -- "lock" or "lease"; "claiming" or "asleep", since state_since.
    claim_path    text        NOT NULL,
    state         text        NOT NULL,
    state_since   timestamptz NOT NULL,
    last_claim_at timestamptz,
    started_at    timestamptz NOT NULL DEFAULT now(),
    seen_at       timestamptz NOT NULL DEFAULT now(),
    -- How often it writes its record: readers judge it gone after three.
    every_seconds float8      NOT NULL
);

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 14';

-- +goose Down
DROP TABLE "billing"."events_subscribers";
DROP TABLE "billing"."events_pauses";

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 13';
