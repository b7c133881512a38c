package lease

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// TestHandlersStartedInAScopeEndAsTheirBatchEnds checks the contexts a
// worker's Scope gives its handlers: a handler's own cancellation ends
// only its context, its batch's lease running out ends every one with
// ErrLeaseLost, a forced stop ends them with the stop's cause, and a
// scope that moves to another batch or closes lets go of the last.
func TestHandlersStartedInAScopeEndAsTheirBatchEnds(t *testing.T) {
	t.Parallel()
	l := NewTracker(time.Minute)
	stop, stopped := context.WithCancelCause(context.Background())
	rows := []db.ClaimRow{{ID: 1}, {ID: 2}, {ID: 3}}
	first := l.Add(stop, rows, pgtype.UUID{}, time.Now())
	second := l.Add(stop, rows[:1], pgtype.UUID{}, time.Now())

	var scope Scope
	for _, d := range first {
		if !l.StartIn(d, scope.In(d.Batch)) {
			t.Fatalf("row %d did not start", d.Row.ID)
		}
	}
	first[0].Cancel(ErrLeaseLost)
	if err := first[1].Ctx.Err(); err != nil {
		t.Fatalf("one handler's cancellation ended another's context: %v", err)
	}
	inFirst := scope.In(first[0].Batch)
	if !l.StartIn(second[0], scope.In(second[0].Batch)) {
		t.Fatal("a row of the scope's next batch did not start")
	}
	if inFirst.Err() == nil {
		t.Error("the scope kept its context in the batch it moved on from")
	}
	if err := first[1].Ctx.Err(); err == nil {
		t.Error("a handler of the batch the scope moved on from kept a live context after its scope's release")
	}

	// The batch's lease runs out: its handlers end with ErrLeaseLost.
	b := second[0].Batch
	b.Cancel(ErrLeaseLost)
	if got := context.Cause(second[0].Ctx); !errors.Is(got, ErrLeaseLost) {
		t.Errorf("a handler of a batch whose lease ran out ended with %v, want ErrLeaseLost", got)
	}

	// A forced stop reaches the handlers of a new batch with its cause.
	third := l.Add(stop, rows[:1], pgtype.UUID{}, time.Now())
	if !l.StartIn(third[0], scope.In(third[0].Batch)) {
		t.Fatal("a row of a third batch did not start")
	}
	cause := errors.New("forced stop")
	stopped(cause)
	if got := context.Cause(third[0].Ctx); !errors.Is(got, cause) {
		t.Errorf("a handler ended by the forced stop has cause %v, want %v", got, cause)
	}
	scope.Close()
	scope.Close()
	if scope.In(third[0].Batch) == nil {
		t.Error("a closed scope gave no context")
	}
	scope.Close()
}

// TestAnIdleScopeHoldsNoBatch checks that a worker whose last batch has
// ended holds none of its rows: its scope keeps no path to the batch.
func TestAnIdleScopeHoldsNoBatch(t *testing.T) {
	t.Parallel()
	l := NewTracker(time.Minute)
	var scope Scope
	defer scope.Close()
	batch := func() weak.Pointer[Batch] {
		ds := l.Add(context.Background(), []db.ClaimRow{{ID: 1, Payload: make([]byte, 1<<20)}}, pgtype.UUID{}, time.Now())
		if !l.StartIn(ds[0], scope.In(ds[0].Batch)) {
			t.Fatal("the row did not start")
		}
		l.Remove(ds[0])
		return weak.Make(ds[0].Batch)
	}()
	runtime.GC()
	if batch.Value() != nil {
		t.Error("an idle worker's scope keeps its ended batch, and every row of it, from being collected")
	}
}
