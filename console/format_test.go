package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

func TestFormatPayload(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", maxPayloadShown+10)
	for _, c := range []struct {
		in   string
		want payloadView
	}{
		{`{"a":[1,2]}`, payloadView{Kind: "json", Text: "{\n  \"a\": [\n    1,\n    2\n  ]\n}", Size: 11}},
		{"héllo\nworld", payloadView{Kind: "text", Text: "héllo\nworld", Size: 12}},
		{"\x00\x01", payloadView{Kind: "binary", Text: "00000000  00 01                                             |..|\n", Size: 2}},
		{"", payloadView{Kind: "text", Size: 0}},
		{long, payloadView{Kind: "text", Text: long[:maxPayloadShown], Size: len(long), Cut: true}},
		{"\xff", payloadView{Kind: "binary", Text: "00000000  ff                                                |.|\n", Size: 1}},
	} {
		if diff := cmp.Diff(c.want, formatPayload([]byte(c.in))); diff != "" {
			t.Errorf("formatPayload(%.20q) (-want +got):\n%s", c.in, diff)
		}
	}
}

func TestNumbersAndDurations(t *testing.T) {
	t.Parallel()
	got := []string{num(0), num(999), num(1000), num(-1234567), count(10, 10), count(9, 10), count(5, 0),
		dur(0), dur(400 * time.Microsecond), dur(850 * time.Millisecond), dur(12400 * time.Millisecond), dur(200 * time.Second),
		dur(125 * time.Minute), dur(99 * time.Hour), dur(-3 * time.Second), preview([]byte("a\n  b"), 10), clip("abcdef", 3),
		preview([]byte(`{"a": 1}`), 20), preview([]byte("\x00\x01"), 5), preview([]byte(strings.Repeat("ab ", 100)), 4),
		preview([]byte(strings.Repeat(" ", 50)+"x"), 2)}
	want := []string{"0", "999", "1,000", "-1,234,567", "≥ 10", "9", "5",
		"0.0 ms", "0.4 ms", "850 ms", "12.4 s", "3 m 20 s", "2 h 5 m", "4 d 3 h", "−3.0 s", "a b", "abc…",
		`{"a": 1}`, "(2 bytes of binary)", "ab a…", "…"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestHistoryKeepsOneSamplePerRefreshAndDrawsIt(t *testing.T) {
	t.Parallel()
	h := newHistory(3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := func(ready int64) []outbox.QueueDepth { return []outbox.QueueDepth{{Queue: "q", Ready: ready}} }
	if c := outboxChart(h.snapshot()); c.Empty == "" {
		t.Error("a chart without samples draws lines")
	}
	for i, at := range []time.Duration{0, time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second} {
		h.add(t0.Add(at), d(int64(i)), 5*time.Second)
	}
	var got []int64
	for _, s := range h.snapshot() {
		got = append(got, s.depths[0].Ready)
	}
	if diff := cmp.Diff([]int64{2, 3, 4}, got); diff != "" {
		t.Errorf("samples kept (-want +got):\n%s", diff)
	}
	cur := h.withCurrent(t0.Add(17*time.Second), d(9))
	if n := len(cur); n != 3 || cur[n-1].depths[0].Ready != 9 || cur[n-2].depths[0].Ready != 3 {
		t.Errorf("withCurrent does not end at the page's read: %+v", cur)
	}
	if kept := h.withCurrent(t0.Add(15*time.Second), d(4)); len(kept) != 3 || kept[2].depths[0].Ready != 4 {
		t.Errorf("withCurrent of the last sample changed it: %+v", kept)
	}
	c := queueChart(h.snapshot(), "q")
	if c.Empty != "" || len(c.Lines) != 5 || c.Lines[0].Points != "0.0,80.0 360.0,40.0 720.0,0.0" || c.Max != "4" || c.Span != "10.0 s" {
		t.Errorf("queue chart = %+v", c)
	}
}

func TestNewChecksItsConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{{}, {Pool: testPool(t), Path: "console"}, {Pool: testPool(t), Path: "/console/"}, {Pool: testPool(t), History: -1}, {Pool: testPool(t), Timeout: -time.Second},
		{Pool: testPool(t), AllowedHosts: []string{""}}, {Pool: testPool(t), AllowedHosts: []string{"https://console.example.com"}},
		{Pool: testPool(t), AllowedHosts: []string{"console.example.com:443"}}, {Pool: testPool(t), AllowedHosts: []string{"console.example.com/ops"}},
		{Pool: testPool(t), AllowedHosts: []string{"console example"}}, {Pool: testPool(t), AllowedHosts: []string{"*.example.com"}},
		{Pool: testPool(t), AllowedHosts: []string{"console.example.com."}}, {Pool: testPool(t), AllowedHosts: []string{"[::1]:80"}}} {
		_, err := New(cfg)
		if err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		} else if cfg.AllowedHosts != nil && !strings.Contains(err.Error(), "Config.AllowedHosts") {
			t.Errorf("New(%+v): %v does not name Config.AllowedHosts", cfg, err)
		}
	}
}

func TestConsoleMountedUnderAPath(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Path: "/ops/console"})
	s.fixture()
	overview := s.page("/ops/console/")
	for _, want := range []string{`href="/ops/console/static/console.css"`, `href="/ops/console/o/` + s.d.Schema + `/outbox/"`} {
		if !strings.Contains(overview, want) {
			t.Errorf("the overview lacks %s", want)
		}
	}
	if q := s.page(s.base + "/"); !strings.Contains(q, `href="/ops/console/o/`+s.d.Schema+`/outbox/queue?q=orders"`) {
		t.Error("the outbox page links its queues outside the mount path")
	}
	if css := s.page("/ops/console/static/console.css"); !strings.Contains(css, "svg.chart") {
		t.Error("the style sheet is not served under the mount path")
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	h := BasicAuth("ops", "pw", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("in")) }))
	for _, c := range []struct {
		user, password string
		set            bool
		want           int
	}{{"", "", false, 401}, {"ops", "", true, 401}, {"ops", "pwx", true, 401}, {"op", "pw", true, 401}, {"ops", "pw", true, 200}} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if c.set {
			r.SetBasicAuth(c.user, c.password)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%q/%q: %d, want %d", c.user, c.password, w.Code, c.want)
		}
		if c.want == 401 && !strings.Contains(w.Header().Get("WWW-Authenticate"), "Basic realm=") {
			t.Error("a refusal carries no challenge")
		}
	}
}

// Lines whose peaks are far apart are drawn on a logarithmic axis, so
// that a small queue's line is not flat under a large one's; lines of
// like size stay on a linear one.
func TestChartOfQueuesFarApartIsLogarithmic(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	samples := func(big int64) []sample {
		var out []sample
		for i := range int64(3) {
			out = append(out, sample{at: t0.Add(time.Duration(i) * time.Second),
				depths: []outbox.QueueDepth{{Queue: "big", Ready: big}, {Queue: "small", Ready: 10 + 10*i}}})
		}
		return out
	}
	c := outboxChart(samples(100_000))
	if !c.Log || len(c.Lines) != 2 || c.Lines[1].Label != "small" {
		t.Fatalf("chart of 100,000 and 10-30 rows = %+v; want a logarithmic axis", c)
	}
	// ln(1+30)/ln(1+100,000) of the height: the small line climbs to
	// about 30% of it, where a linear axis would keep it at 0.05%.
	if diff := cmp.Diff("0.0,126.7 360.0,117.7 720.0,112.3", c.Lines[1].Points); diff != "" {
		t.Errorf("the small queue's line (-want +got):\n%s", diff)
	}
	if c := outboxChart(samples(100)); c.Log {
		t.Errorf("chart of 100 and 10-30 rows drawn on a logarithmic axis")
	}
}

// A count at the cap shows its estimate, never below the count itself;
// one under the cap, or without an estimate, shows none.
func TestEstimatedShowsAnEstimateOnlyPastTheCap(t *testing.T) {
	t.Parallel()
	e := &outbox.DepthEstimate{Ready: 1_234_567, Leased: 3}
	got := []string{estimated(5000, 5000, e, "ready"), estimated(5000, 5000, e, "leased"), estimated(4999, 5000, e, "ready"),
		estimated(5000, 5000, nil, "ready")}
	want := []string{" ≈ 1,234,567 (estimated)", " ≈ 5,000 (estimated)", "", ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
