// Package outboxgen holds the reviewed SQL of the outbox: the goose
// migrations that build its tables, indexes and NOTIFY trigger, and the
// queries from which sqlc generates package db.
//
// Most programs import package [github.com/outboxgen/outboxgen/outbox]
// instead; this package exists so that the SQL files can be embedded.
package outboxgen

//go:generate go tool -modfile=tools/go.mod sqlc generate
