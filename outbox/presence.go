package outbox

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// SubscriberPresenceInterval is how often a running subscriber writes its
// presence record, which [Outbox.Subscribers] reads. A subscriber whose
// record is three intervals old (15 s) is shown gone: its process died,
// froze or lost the database.
const SubscriberPresenceInterval = engine.PresenceInterval

// SubscriberInfo is a subscriber as its presence record shows it.
type SubscriberInfo struct {
	// ID is drawn at random by each Run.
	ID string `json:"id"`
	// Name is SubscriberConfig.Name; Host and PID are its process's host
	// name and process id.
	Name string `json:"name"`
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// Queues are the queues it claims.
	Queues []string `json:"queues"`
	// Workers is how many handlers it runs at most, Busy how many ran,
	// and InFlight how many rows it held (claimed, outcome not yet
	// written), when the record was written.
	Workers  int `json:"workers"`
	Busy     int `json:"busy"`
	InFlight int `json:"in_flight"`
	// ClaimPath is "lock" (claims that hold their rows by row lock while
	// the handlers run, by lease when few rows come) or "lease".
	ClaimPath string `json:"claim_path"`
	// State is "claiming" (its claims find rows), "asleep" (they found
	// none: it waits for a notification or its next poll) or "stopping";
	// StateSince is since when it claims or sleeps.
	State      string    `json:"state"`
	StateSince time.Time `json:"state_since"`
	// LastClaimAt is when it last sent a claim; zero before its first.
	LastClaimAt time.Time `json:"last_claim_at"`
	// StartedAt is when it started, and SeenAt when it last wrote its
	// record, on the database's clock.
	StartedAt time.Time `json:"started_at"`
	SeenAt    time.Time `json:"seen_at"`
	// Gone is true when the record is older than three
	// SubscriberPresenceInterval: the subscriber stopped without
	// removing it (killed, frozen, cut off). Records gone for an hour are
	// deleted.
	Gone bool `json:"gone"`
}

// Subscribers returns every running subscriber of the outbox, in every
// process, as their presence records show them (schema 14), by name,
// host and process id, and those that are gone (Gone) for up to an hour.
// A subscriber writes its record as it starts and every
// SubscriberPresenceInterval, and deletes it when Run returns. Reading
// needs the subscriber role's grants; an outbox whose schema predates the
// records gives a *[SchemaError].
func (o *Outbox) Subscribers(ctx context.Context) ([]SubscriberInfo, error) {
	rows, err := o.queries(o.pool).Subscribers(ctx)
	if err != nil {
		return nil, o.readError(ctx, "Subscribers", err)
	}
	out := make([]SubscriberInfo, len(rows))
	for i, r := range rows {
		s := SubscriberInfo{ID: uuid.UUID(r.ID.Bytes).String(), Name: r.Name, Host: r.Host, PID: int(r.Pid), Queues: r.Queues,
			Workers: int(r.Workers), Busy: int(r.Busy), InFlight: int(r.InFlight), ClaimPath: r.ClaimPath, State: r.State,
			StateSince: r.StateSince, StartedAt: r.StartedAt, SeenAt: r.SeenAt, Gone: r.Gone}
		if r.LastClaimAt != nil {
			s.LastClaimAt = *r.LastClaimAt
		}
		out[i] = s
	}
	return out, nil
}
