package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/ring"
)

// Roles names the database roles [Grants] gives privileges on one outbox.
// The outbox's objects belong to the role that ran its migrations (the
// migrator), which needs no grant; its triggers run with its privileges
// (schema 9 on), so writers need none on the tables they maintain, nor on
// the triggers' functions, which only the migrator may execute (schema 11
// on; docs/operations.md declares who may do what).
type Roles struct {
	// Publisher publishes: Publish, PublishBatch and timers, keyed or not,
	// at any isolation level, Outbox.CancelTimer, and plain INSERTs into
	// the log tier's ring (<table>_ring, schema 13) of the columns a
	// writer chooses. Empty: none.
	Publisher string
	// Subscriber runs subscribers (claims by lease and by lock from the
	// outbox table, and of the ring's lanes, transactional handlers
	// included) and operates the outbox:
	// QueueStats, QueueDepths, RetryBacklog, Unprocessed, Health, queue
	// pauses (PauseQueue, ResumeQueue), Subscribers and the dead letters
	// (list, replay, purge). Empty: none.
	Subscriber string
}

// Grants returns the GRANT statements that give roles what they need on
// the outbox cfg names (nil: the defaults), in the order to run them,
// each without a trailing semicolon. Run them as the outbox's owner after
// its migrations; they grant nothing on other objects, and running them
// again changes nothing. docs/operations.md explains each. Invalid names
// give a *[ConfigError].
func Grants(cfg *Config, roles Roles) ([]string, error) {
	c := cfg.withDefaults()
	n, err := newNaming(c.Schema, c.Table)
	if err != nil {
		return nil, err
	}
	if roles.Publisher == "" && roles.Subscriber == "" {
		return nil, &ConfigError{Field: "Roles", Value: "", Rule: "must name a publisher or a subscriber role"}
	}
	for _, r := range []struct{ field, name string }{{"Roles.Publisher", roles.Publisher}, {"Roles.Subscriber", roles.Subscriber}} {
		if err := checkIdentifierBytes(r.field, r.name); err != nil {
			return nil, err
		}
	}
	schema := pgx.Identifier{n.Schema}.Sanitize()
	rel := func(suffix string) string { return n.Qualified(n.Table + suffix) }
	var out []string
	if roles.Publisher != "" {
		p := pgx.Identifier{roles.Publisher}.Sanitize()
		out = append(out,
			"GRANT USAGE ON SCHEMA "+schema+" TO "+p,
			// Publish returns the row's id; CancelTimer deletes by queue
			// and timer id the rows no subscriber holds.
			"GRANT INSERT, DELETE, SELECT (id, queue, timer_id, acquired_token) ON "+rel("")+" TO "+p,
		)
		// Writes into the log tier's ring (schema 13).
		out = append(out, ring.Grants(n, roles.Publisher, "")...)
	}
	if roles.Subscriber != "" {
		s := pgx.Identifier{roles.Subscriber}.Sanitize()
		out = append(out,
			"GRANT USAGE ON SCHEMA "+schema+" TO "+s,
			// Claims, leases, outcomes, dead letters and their replay.
			"GRANT SELECT, INSERT, UPDATE, DELETE ON "+rel("")+" TO "+s,
			"GRANT SELECT, INSERT, UPDATE, DELETE ON "+rel("_dlq")+" TO "+s,
			// Sleep records and the records of claims by lock.
			"GRANT SELECT, INSERT, UPDATE, DELETE ON "+rel("_sleepers")+", "+rel("_locks")+" TO "+s,
			// Recorded hand-overs: counted by QueueStats, completed
			// through the function alone.
			"GRANT SELECT ON "+rel("_handoff")+" TO "+s,
			"GRANT EXECUTE ON FUNCTION "+rel("_hand_off")+"(text[], integer) TO "+s,
			// Queue pauses (schema 14): read by every claim, written by
			// PauseQueue and ResumeQueue; and the subscribers' presence
			// records, which each writes and Subscribers reads.
			"GRANT SELECT, INSERT, DELETE ON "+rel("_pauses")+" TO "+s,
			"GRANT SELECT, INSERT, UPDATE, DELETE ON "+rel("_subscribers")+" TO "+s,
		)
		// Reads, claims and turns of the log tier's ring (schema 13).
		out = append(out, ring.Grants(n, "", roles.Subscriber)...)
	}
	return out, nil
}

// Grant runs the statements [Grants] returns for this outbox and roles in
// one transaction, through the outbox's pool, whose role must own the
// outbox (or be allowed to grant on its objects).
func (o *Outbox) Grant(ctx context.Context, roles Roles) error {
	stmts, err := Grants(&Config{Schema: o.naming.Schema, Table: o.naming.Table}, roles)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return wrapOp(fmt.Sprintf("Grant: %s", s), err)
			}
		}
		return nil
	})
}
