package claim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// The floors: the first claim and one every MaxFetchInterval read every
// queue from its start and every expired lease; the others read each
// queue from FloorMargin before the newest row taken there, and expired
// leases from FloorMargin before the last claim that read them all. A
// row given back or a key's next row lowers the floor; a floor in year 1
// or before reads the queue from its start.
func TestFloorsLookFromWhereClaimsStopped(t *testing.T) {
	t.Parallel()
	every := 5 * time.Second
	f := newFloors(every)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	l := f.begin(t0, readsBoth)
	if !l.sweep || !l.sweepExpired || l.floor("a") != nil || l.expiredWithin != nil {
		t.Fatalf("first claim: %+v, want a sweep", l)
	}
	f.took(l, map[string]time.Time{"a": t0.Add(-time.Minute)}, true)

	l = f.begin(t0.Add(time.Second), readsBoth)
	if l.sweep || l.sweepExpired {
		t.Fatal("second claim sweeps")
	}
	if diff := cmp.Diff(t0.Add(-time.Minute-FloorMargin), *l.floor("a")); diff != "" {
		t.Errorf("a's floor (-want +got):\n%s", diff)
	}
	if l.floor("b") != nil || !l.floorOr("b").IsZero() {
		t.Errorf("b has a floor, %v, before any of its rows was taken", l.floor("b"))
	}
	if l.expiredWithin == nil || *l.expiredWithin != (time.Second+FloorMargin).Seconds() {
		t.Errorf("expired leases read within %v s, want %v", l.expiredWithin, (time.Second + FloorMargin).Seconds())
	}
	// A claim that took all it asked for leaves the expired leases'
	// bound where it was; an older row than the floor does not move it.
	f.took(l, map[string]time.Time{"a": t0.Add(-2 * time.Minute)}, false)
	l = f.begin(t0.Add(2*time.Second), readsBoth)
	if diff := cmp.Diff(t0.Add(-time.Minute-FloorMargin), *l.floor("a")); diff != "" {
		t.Errorf("a's floor after an older row (-want +got):\n%s", diff)
	}
	if *l.expiredWithin != (2*time.Second + FloorMargin).Seconds() {
		t.Errorf("expired leases read within %v s after a full claim", *l.expiredWithin)
	}

	// Rows given back and a key handed on lower the floor; a retry does not.
	key := "k"
	f.gaveBack([]*lease.Delivery{{Row: db.ClaimRow{Queue: "a", NextAttemptAt: t0.Add(-3 * time.Minute)}}})
	f.handedOn([]lease.Outcome{
		{Kind: lease.Retry, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", OrderingKey: &key, CreatedAt: t0.Add(-time.Hour), NextAttemptAt: t0.Add(-time.Hour)}}},
		{Kind: lease.Ack, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", CreatedAt: t0.Add(-time.Hour), NextAttemptAt: t0.Add(-time.Hour)}}},
	})
	l = f.begin(t0.Add(3*time.Second), readsBoth)
	if diff := cmp.Diff(t0.Add(-3*time.Minute-FloorMargin), *l.floor("a")); diff != "" {
		t.Errorf("a's floor after a row given back (-want +got):\n%s", diff)
	}
	f.handedOn([]lease.Outcome{{Kind: lease.Ack, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", OrderingKey: &key,
		CreatedAt: t0.Add(-4 * time.Minute), NextAttemptAt: t0.Add(time.Hour)}}}})
	l = f.begin(t0.Add(3*time.Second), readsBoth)
	if diff := cmp.Diff(t0.Add(-4*time.Minute-FloorMargin), *l.floor("a")); diff != "" {
		t.Errorf("a's floor after its key was handed on (-want +got):\n%s", diff)
	}
	f.gaveBack([]*lease.Delivery{{Row: db.ClaimRow{Queue: "a", NextAttemptAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}}})
	if l = f.begin(t0.Add(4*time.Second), readsBoth); l.floor("a") != nil {
		t.Errorf("a's floor after a row dated year 1: %v, want none", l.floor("a"))
	}

	// Every MaxFetchInterval, and after behind, a sweep; rows due and
	// expired leases each on their own clock.
	if l = f.begin(t0.Add(every), readsExpired); !l.sweepExpired || l.sweep || l.expiredWithin != nil {
		t.Errorf("a read of expired leases MaxFetchInterval after the last sweep: %+v", l)
	}
	f.took(l, nil, true)
	if l = f.begin(t0.Add(every), readsDue); !l.sweep || l.sweepExpired {
		t.Errorf("a read of rows due MaxFetchInterval after the last sweep, just after one of expired leases: %+v", l)
	}
	f.took(l, map[string]time.Time{"a": t0}, true)
	if l = f.begin(t0.Add(every+time.Second), readsBoth); l.sweep || l.sweepExpired || l.expiredWithin == nil {
		t.Errorf("a claim a second after both sweeps: %+v", l)
	}
	f.behind()
	if l = f.begin(t0.Add(every+time.Second), readsBoth); !l.sweep || l.sweepExpired {
		t.Errorf("a claim after behind: %+v", l)
	}
}
