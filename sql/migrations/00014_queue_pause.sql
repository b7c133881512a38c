-- Queue pause and resume.
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
-- Upgrading: one new table and the version function; nothing else is
-- locked. Subscribers of schema 13 do not read it, so pause a queue only
-- once every subscriber of it runs this release. The subscriber role
-- needs the new grant (outboxgen grants, Outbox.Grant) to claim, and to
-- pause and resume; the publisher role has none on it.
--
-- Down drops the table: every paused queue runs again.

-- +goose Up
CREATE TABLE /*outbox:table*/outbox_pauses (
    queue     text        COLLATE "C" PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    -- The role that paused it, and why (free text, may be empty).
    paused_by text        NOT NULL DEFAULT session_user,
    reason    text        NOT NULL DEFAULT '',
    CONSTRAINT /*outbox:name*/outbox_pauses_queue_chk CHECK (octet_length(queue) BETWEEN 1 AND 255),
    CONSTRAINT /*outbox:name*/outbox_pauses_reason_chk CHECK (octet_length(reason) <= 1024)
);

CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 14';

-- +goose Down
DROP TABLE /*outbox:table*/outbox_pauses;

CREATE OR REPLACE FUNCTION /*outbox:table*/outbox_schema_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 13';
