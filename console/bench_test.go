package console

import "testing"

// BenchmarkPages measures the server time of each page (the handler's
// ServeHTTP into a recorder: reads and rendering, no network) on the
// outbox of TestConsoleQueriesAreIndexBounded: 1,000,000 rows and 100,000
// dead letters, built once for all the sub-benchmarks and their counts.
// The bar is 100 ms a page:
//
//	go test -run '^$' -bench BenchmarkPages -benchtime=20x -count=5 ./console
func BenchmarkPages(b *testing.B) {
	fx := newFixture(b)
	h, err := New(Config{Pool: fx.db.Pool})
	if err != nil {
		b.Fatal(err)
	}
	pages := fx.pages(b, h)
	// Every page once, as an operator's first look does: the list of
	// outboxes is read and the connections prepare their statements.
	for _, p := range pages {
		get(b, h, p.URL, p.Want)
	}
	for _, p := range pages {
		b.Run(p.Name, func(b *testing.B) {
			for b.Loop() {
				get(b, h, p.URL, p.Want)
			}
		})
	}
}
