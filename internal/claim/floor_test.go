package claim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// The floors: the first claim reads every queue from its start and every
// expired lease; the others read each queue from floorNear before the
// newest row its claims took (FloorMargin at least every floorWideEvery),
// and expired leases from as long before the last claim that read them
// all. Rows due are swept every MaxFetchInterval and expired leases every
// expiredEvery, each on its own clock, and rows due after behind. A row
// given back or a key's next row lowers the floor; a floor in year 1 or
// before reads the queue from its start.
func TestFloorsLookFromWhereClaimsStopped(t *testing.T) {
	t.Parallel()
	every, expiredEvery := 5*time.Second, 30*time.Second
	f := newFloors(every, expiredEvery)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	newest := t0.Add(-time.Minute)
	floor := func(l look, q string) time.Time {
		t.Helper()
		at := l.floor(q)
		if at == nil {
			t.Fatalf("%s has no floor in %+v", q, l)
		}
		return *at
	}
	within := func(l look) time.Duration {
		t.Helper()
		if l.expiredWithin == nil {
			t.Fatalf("expired leases read without a bound in %+v", l)
		}
		return time.Duration(*l.expiredWithin * float64(time.Second))
	}

	l := f.begin(t0, readsBoth)
	if !l.sweep || !l.sweepExpired || l.floor("a") != nil || l.expiredWithin != nil {
		t.Fatalf("first claim: %+v, want a sweep", l)
	}
	f.took(l, map[string]time.Time{"a": newest}, true)

	// A wide look, then a near one.
	l = f.begin(t0.Add(time.Second), readsBoth)
	if l.sweep || l.sweepExpired {
		t.Fatal("second claim sweeps")
	}
	if diff := cmp.Diff(newest.Add(-FloorMargin), floor(l, "a")); diff != "" {
		t.Errorf("a's floor on a wide look (-want +got):\n%s", diff)
	}
	if got, want := within(l), time.Second+FloorMargin; got != want {
		t.Errorf("expired leases read within %v on a wide look, want %v", got, want)
	}
	if l.floor("b") != nil || !l.floorOr("b").IsZero() {
		t.Errorf("b has a floor, %v, before any of its rows was taken", l.floor("b"))
	}
	// A claim that took all it asked for leaves the expired leases' bound
	// where it was; an older row than the newest does not move the floor.
	f.took(l, map[string]time.Time{"a": newest.Add(-time.Minute)}, false)
	l = f.begin(t0.Add(time.Second+10*time.Millisecond), readsBoth)
	if diff := cmp.Diff(newest.Add(-floorNear), floor(l, "a")); diff != "" {
		t.Errorf("a's floor on a near look (-want +got):\n%s", diff)
	}
	if got, want := within(l), time.Second+10*time.Millisecond+floorNear; got != want {
		t.Errorf("expired leases read within %v after a full claim, want %v", got, want)
	}

	// Rows given back and a key handed on lower the floor; a retry does not.
	key := "k"
	f.gaveBack([]*lease.Delivery{{Row: db.ClaimRow{Queue: "a", NextAttemptAt: t0.Add(-3 * time.Minute)}}})
	f.handedOn([]lease.Outcome{
		{Kind: lease.Retry, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", OrderingKey: &key, CreatedAt: t0.Add(-time.Hour), NextAttemptAt: t0.Add(-time.Hour)}}},
		{Kind: lease.Ack, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", CreatedAt: t0.Add(-time.Hour), NextAttemptAt: t0.Add(-time.Hour)}}},
	})
	l = f.begin(t0.Add(time.Second+20*time.Millisecond), readsBoth)
	if diff := cmp.Diff(t0.Add(-3*time.Minute-floorNear), floor(l, "a")); diff != "" {
		t.Errorf("a's floor after a row given back (-want +got):\n%s", diff)
	}
	f.handedOn([]lease.Outcome{{Kind: lease.Ack, D: &lease.Delivery{Row: db.ClaimRow{Queue: "a", OrderingKey: &key,
		CreatedAt: t0.Add(-4 * time.Minute), NextAttemptAt: t0.Add(time.Hour)}}}})
	l = f.begin(t0.Add(time.Second+30*time.Millisecond), readsBoth)
	if diff := cmp.Diff(t0.Add(-4*time.Minute-floorNear), floor(l, "a")); diff != "" {
		t.Errorf("a's floor after its key was handed on (-want +got):\n%s", diff)
	}
	f.gaveBack([]*lease.Delivery{{Row: db.ClaimRow{Queue: "a", NextAttemptAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}}})
	if l = f.begin(t0.Add(time.Second+40*time.Millisecond), readsBoth); l.floor("a") != nil {
		t.Errorf("a's floor after a row dated year 1: %v, want none", l.floor("a"))
	}

	// Rows due are swept every MaxFetchInterval; expired leases every
	// expiredEvery, each on its own clock; rows due after behind.
	if l = f.begin(t0.Add(every), readsExpired); l.sweepExpired || l.sweep {
		t.Errorf("a read of expired leases MaxFetchInterval after the first: %+v, want no sweep", l)
	}
	if l = f.begin(t0.Add(every), readsDue); !l.sweep {
		t.Errorf("a read of rows due MaxFetchInterval after the first: %+v, want a sweep", l)
	}
	f.took(l, map[string]time.Time{"a": t0}, true)
	if l = f.begin(t0.Add(expiredEvery), readsBoth); !l.sweepExpired || !l.sweep || l.expiredWithin != nil {
		t.Errorf("a claim expiredEvery after the first: %+v, want both swept", l)
	}
	f.took(l, map[string]time.Time{"a": t0}, true)
	if l = f.begin(t0.Add(expiredEvery+time.Second), readsBoth); l.sweep || l.sweepExpired {
		t.Errorf("a claim a second after both sweeps: %+v", l)
	}
	f.behind()
	if l = f.begin(t0.Add(expiredEvery+time.Second), readsBoth); !l.sweep || l.sweepExpired {
		t.Errorf("a claim after behind: %+v", l)
	}
}
