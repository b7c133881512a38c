// Package outbox is a transactional outbox for PostgreSQL.
//
// A service writes its business rows and an outbox row in one transaction;
// the outbox delivers every committed row to a handler at least once. This
// package holds the runtime: [Outbox] is one outbox table (and its
// dead-letter table) in one database.
//
// # Tables and names
//
// [New] takes a [Config] naming the schema and table (default public.outbox)
// and validates them once. From the table name it derives the names of the
// dead-letter table (<table>_dlq), indexes, constraints, the NOTIFY trigger
// and function, goose's version table (<table>_goose_version) and the
// NOTIFY channel ([Outbox.Channel]); all must fit PostgreSQL's 63-byte
// identifier limit, or New returns a *[ConfigError] naming the field and the
// rule. Names are quoted wherever they reach SQL.
//
// [Outbox.Migrate] applies the embedded goose migrations for that table.
// Several outboxes, in one schema or in many, can share a database: each
// has its own tables, channel and migration history.
//
// # Claiming and leases
//
// A row is available when its next_attempt_at has come and its lease is
// unset or expired. Claiming sets a fresh lease token on each row; every
// statement that deletes, retries or dead-letters a row is filtered by that
// token, so a handler whose lease was reclaimed can never overwrite the
// newer delivery's outcome. Claims use FOR UPDATE SKIP LOCKED, so any number
// of processes can claim from one table without a coordinator.
package outbox
