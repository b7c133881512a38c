package console

import (
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// TestConsoleAsTheSubscriberRole runs the console as docs/console.md says
// it may run: connected as the role outboxgen grants makes a subscriber,
// neither owner nor superuser. Every page reads, and every action acts.
func TestConsoleAsTheSubscriberRole(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	r := d.NewRoles(t)
	owner, err := outbox.New(d.PoolAs(t, r.Migrator), &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := owner.Grant(t.Context(), outbox.Roles{Publisher: r.Publisher, Subscriber: r.Subscriber}); err != nil {
		t.Fatal(err)
	}
	sub := d.PoolAs(t, r.Subscriber)
	c, err := New(Config{Pool: sub, Actions: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &site{t: t, d: d, ob: owner, srv: srv, client: &http.Client{Jar: jar}, base: "/o/" + d.Schema + "/outbox", log: &syncBuffer{}}
	s.fixture()
	for _, p := range []string{"/", s.base + "/", s.base + "/queue?q=orders", s.base + "/keys", s.base + "/dead",
		s.base + "/dead?q=orders&reason=retry_exhausted", s.base + "/dead/-3", s.base + "/row?id=-1",
		s.base + "/row?q=orders&timer=remind-7", s.base + "/health", s.base + "/dead?q=orders&reason=retry_exhausted&cause=payment+service+down",
		s.base + "/rows?q=orders&state=retrying&type=shop.Order&older=1h"} {
		s.page(p)
	}
	for _, a := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/dead/replay", url.Values{"scope": {"filter"}, "q": {"orders"}, "reason": {"retry_exhausted"}, "cause": {"payment service down"},
			"step": {"dry-run"}}, "Dry run: 1 row would go back"},
		{"/dead/replay", url.Values{"scope": {"selection"}, "id": {"-3"}, "step": {"dry-run"}}, "Dry run: 1 row would go back"},
		{"/dead/replay", url.Values{"scope": {"selection"}, "id": {"-3"}, "step": {"confirm"}}, "Replayed 1 dead letter"},
		{"/dead/delete", url.Values{"scope": {"filter"}, "q": {"mail"}, "step": {"confirm"}}, "Deleted 1 dead letter."},
		{"/timer/cancel", url.Values{"q": {"orders"}, "timer": {"remind-7"}, "step": {"confirm"}}, "Cancelled timer"},
	} {
		if code, body := s.post(s.base+a.path, a.form); code != http.StatusOK || !strings.Contains(body, a.want) {
			t.Errorf("%s %v as the subscriber role: %d %q", a.path, a.form, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("%d dead letters left, want the decode_error one", n)
	}
}
