package outboxgen

import "embed"

// Migrations holds the goose migrations of the outbox, written for a table
// named outbox in schema public. Identifiers that depend on the table carry
// an /*outbox:KIND*/ marker; package outbox renders them for the configured
// schema and table before they are applied, and outboxgen migrations writes
// the rendered files into a consuming repository.
//
//go:embed sql/migrations/*.sql
var Migrations embed.FS

// MigrationsDir is the directory of [Migrations] that holds the files.
const MigrationsDir = "sql/migrations"
