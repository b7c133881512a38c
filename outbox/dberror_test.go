package outbox

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
	want := map[string]errClass{
		"no SQLSTATE": errTransient, "context": errTransient, "connection failure": errTransient,
		"deadlock": errTransient, "completion unknown": errTransient, "lock_timeout": errTransient,
		"object in use": errTransient, "standby during a failover": errTransient,
		"table missing while migrating": errTransient, "out of memory": errTransient,
		"prepared statement missing": errTransient, "prepared statement duplicated": errTransient,
		"too many connections": errTransient, "statement_timeout": errTransient, "admin shutdown": errTransient,
		"I/O error": errTransient, "internal error": errTransient,
		"serialization failure": errDoomed, "failed transaction": errDoomed,
		"trigger raised an exception": errPermanent, "data exception": errPermanent,
		"unique violation": errPermanent, "insufficient privilege": errPermanent, "check option": errPermanent,
	}
	got := make(map[string]errClass, len(cases))
	for name, err := range cases {
		got[name] = classifyDB(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("classes (-want +got):\n%s", diff)
	}
}
