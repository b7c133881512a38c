package dbx

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every error a subscriber's statement meets is classified once: what may
// pass is retried, what dooms a transaction rolls it back, and anything
// else fails the statement for its values, whatever its SQLSTATE.
func TestDatabaseErrorsAreClassifiedOnce(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("statement: %w", &pgconn.PgError{Code: code}) }
	cases := map[string]error{
		"no SQLSTATE":                   errors.New("connection reset by peer"),
		"context":                       context.DeadlineExceeded,
		"connection failure":            pg("08006"),
		"deadlock":                      pg("40P01"),
		"completion unknown":            pg("40003"),
		"lock_timeout":                  pg("55P03"),
		"object in use":                 pg("55006"),
		"standby during a failover":     pg("25006"),
		"table missing while migrating": pg("42P01"),
		"prepared statement missing":    pg("26000"),
		"prepared statement duplicated": pg("42P05"),
		"out of memory":                 pg("53200"),
		"too many connections":          pg("53300"),
		"statement_timeout":             pg("57014"),
		"admin shutdown":                pg("57P01"),
		"I/O error":                     pg("58030"),
		"internal error":                pg("XX000"),
		"serialization failure":         pg("40001"),
		"failed transaction":            pg("25P02"),
		"trigger raised an exception":   pg("P0001"),
		"data exception":                pg("22001"),
		"unique violation":              pg("23505"),
		"insufficient privilege":        pg("42501"),
		"check option":                  pg("44000"),
	}
	want := map[string]Class{
		"no SQLSTATE": Transient, "context": Transient, "connection failure": Transient,
		"deadlock": Transient, "completion unknown": Transient, "lock_timeout": Transient,
		"object in use": Transient, "standby during a failover": Transient,
		"table missing while migrating": Transient, "out of memory": Transient,
		"prepared statement missing": Transient, "prepared statement duplicated": Transient,
		"too many connections": Transient, "statement_timeout": Transient, "admin shutdown": Transient,
		"I/O error": Transient, "internal error": Transient,
		"serialization failure": Doomed, "failed transaction": Doomed,
		"trigger raised an exception": Permanent, "data exception": Permanent,
		"unique violation": Permanent, "insufficient privilege": Permanent, "check option": Permanent,
	}
	got := make(map[string]Class, len(cases))
	for name, err := range cases {
		got[name] = Classify(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("classes (-want +got):\n%s", diff)
	}
}
