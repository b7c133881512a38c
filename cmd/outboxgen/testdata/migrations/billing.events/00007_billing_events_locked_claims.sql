-- outboxgen: billing.events 00007_locked_claims.sql
-- Claims that hold their rows by row lock instead of writing a lease.
--
-- A claim that writes a lease on every row makes a new version of the row
-- and new index entries for it: most of what a delivery costs the
-- database. A subscriber may instead claim in a transaction of its own,
-- with SELECT ... FOR UPDATE SKIP LOCKED, keep the transaction open while
-- the rows' handlers run, and end it by deleting the rows that were
-- handled. Nothing is written at the claim; a crash (of the subscriber or
-- of its connection) writes nothing either, as the transaction aborts.
-- Rows whose handlers outlive a short bound have their lease written before
-- the transaction commits, and go on as leased rows.
--
-- A claim that aborts writes nothing, so it cannot count its delivery on
-- the row. Before any handler of such a claim runs, the subscriber records
-- the claim here, in a transaction of its own: its transaction id and the
-- ids of its rows, as ranges (a claim's ids are mostly consecutive, so its
-- record stays a few bytes where an array would take eight per row). The claim's transaction deletes its record when it
-- commits, so a record whose transaction aborted names the rows of a
-- delivery that ended without an outcome: a later claim of those rows
-- counts it towards MaxDeliveries, and a handler that crashes its process
-- every time still ends as a dead letter.
--
-- A claim's transaction can also end while its subscriber lives (its
-- connection was cut, its backend terminated), and then its handlers may
-- still run until the subscriber notices. A record holds its rows until
-- the claim's lease would have expired (until: LeaseTTL after the claim,
-- on the server's clock): no claim hands them to a handler before then, so
-- a row is never handled by two live claims at once, as with leases.

-- +goose Up
CREATE TABLE "billing"."events_locks" (
    -- The claim's transaction id (64-bit, as pg_current_xact_id).
    xid        bigint         NOT NULL,
    ids        int8multirange NOT NULL,
    claimed_at timestamptz    NOT NULL DEFAULT now(),
    until      timestamptz    NOT NULL,
    CONSTRAINT "events_locks_pkey" PRIMARY KEY (xid)
);

CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 7';

-- +goose Down
CREATE OR REPLACE FUNCTION "billing"."events_schema_version"() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 6';

DROP TABLE "billing"."events_locks";
