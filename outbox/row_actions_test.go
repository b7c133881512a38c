package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// An operator retries a scheduled row now, cancels a key's head (its next
// row is delivered), and moves a row into the dead letters with a note;
// none acts on a leased row, and a note must be given. As the subscriber
// role in the roles leg.
func TestOperatorActsOnOneRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "q", nil)
	publish := func(payload string, opts *PublishOpts) int64 {
		t.Helper()
		id, err := pub.Publish(e.ctx, e.pubPool, payload, opts)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	later := publish("later", &PublishOpts{Delay: time.Hour})
	head := publish("head", &PublishOpts{OrderingKey: "k", Delay: time.Hour})
	next := publish("next", &PublishOpts{OrderingKey: "k"})
	doomed := publish("doomed", &PublishOpts{Delay: time.Hour})
	if ok, err := e.ob.RetryRowNow(e.ctx, next); err != nil || ok {
		t.Errorf("RetryRowNow of a row behind its key = %v, %v; want false", ok, err)
	}
	if ok, err := e.ob.RetryRowNow(e.ctx, later); err != nil || !ok {
		t.Fatalf("RetryRowNow = %v, %v", ok, err)
	}
	if ok, err := e.ob.CancelRow(e.ctx, head); err != nil || !ok {
		t.Fatalf("CancelRow = %v, %v", ok, err)
	}
	var ie *InputError
	if _, err := e.ob.DeadLetterRow(e.ctx, doomed, ""); !errors.As(err, &ie) {
		t.Errorf("DeadLetterRow without a note = %v; want an *InputError", err)
	}
	if ok, err := e.ob.DeadLetterRow(e.ctx, doomed, "by ops: the customer left"); err != nil || !ok {
		t.Fatalf("DeadLetterRow = %v, %v", ok, err)
	}
	dead, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, 0, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != doomed || dead[0].Reason != ReasonRejected || dead[0].LastError != "by ops: the customer left" {
		t.Fatalf("the dead letters = %+v, %v", dead, err)
	}
	// The retried row and the key's next row are delivered; the cancelled
	// and the dead-lettered ones are not.
	var log handledLog
	inHand, release := make(chan struct{}), make(chan struct{})
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.Payload == "held" {
			close(inHand)
			<-release
		}
		return log.handle(ctx, m)
	}, fastConfig[string](nil))
	eventually(t, "the retried and the next row handled", func() bool { return len(log.get()) == 2 })
	held := publish("held", nil)
	<-inHand
	for name, act := range map[string]func() (bool, error){
		"RetryRowNow":   func() (bool, error) { return e.ob.RetryRowNow(e.ctx, held) },
		"CancelRow":     func() (bool, error) { return e.ob.CancelRow(e.ctx, held) },
		"DeadLetterRow": func() (bool, error) { return e.ob.DeadLetterRow(e.ctx, held, "by ops") },
	} {
		if ok, err := act(); err != nil || ok {
			t.Errorf("%s of a leased row = %v, %v; want false", name, ok, err)
		}
	}
	close(release)
	eventually(t, "the held row handled", func() bool { return len(log.get()) == 3 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	got := log.get()
	if diff := cmp.Diff([]string{"held", "later", "next"}, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
	if n := e.countWhere("true"); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}
}
