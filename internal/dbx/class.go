package dbx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Class is what a failed statement of the subscriber's tells it to do
// next. Every error the database returns to a claim or an outcome write is
// classified here, once, for both claim paths.
type Class int

const (
	// Transient: the same statement may succeed later (a lost or
	// refused connection, a deadlock, a timeout, a lock not available, a
	// server shutting down or short of resources, a failover). Retry it
	// with backoff.
	Transient Class = iota
	// Doomed: the transaction the statement ran in can do nothing more
	// (a serialization failure, a transaction already failed). In a
	// transaction, roll it back; in autocommit, where each statement is a
	// transaction of its own, it is transient.
	Doomed
	// Permanent: the statement fails for its values, whatever its
	// SQLSTATE (a data exception, a constraint, a user trigger raising an
	// exception, a privilege a row's write lacks): writing the same values
	// again fails the same way, so a batch is split to isolate the rows
	// the database refuses.
	Permanent
)

// Classify tells what err, returned by a statement, means for the next
// one. Errors without a SQLSTATE (the network, a context, the pool) are
// transient.
func Classify(err error) Class {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return Transient
	}
	switch pe.Code {
	case "40001", // serialization_failure
		"25P02": // in_failed_sql_transaction
		return Doomed
	case "40P01", // deadlock_detected: the statement alone was rolled back
		"40003", // statement_completion_unknown
		"55P03", // lock_not_available (lock_timeout)
		"55006", // object_in_use
		"25006", // read_only_sql_transaction: a standby, until a failover ends
		"42P01", // undefined_table: an outbox migrating under a live service
		// The connection's named prepared statements (pgx's statement
		// cache) are not the server connection's: a pooler in transaction
		// mode (PgBouncer before 1.21) switched them. pgx prepares again
		// on the next try; the values are not at fault.
		"26000", // invalid_sql_statement_name: prepared statement does not exist
		"42P05": // duplicate_prepared_statement
		return Transient
	}
	switch pe.Code[:2] {
	case "08", // connection exception
		"53", // insufficient resources (out of memory, too many connections, disk full)
		"57", // operator intervention (query_canceled, admin_shutdown, cannot_connect_now, idle timeouts)
		"58", // system error (I/O)
		"XX": // internal error
		return Transient
	}
	return Permanent
}

// IsPermanent reports whether err fails its statement for the
// statement's values (Permanent), whatever its SQLSTATE.
func IsPermanent(err error) bool { return Classify(err) == Permanent }
