package console_test

import (
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/console"
)

// operator is the service's own check that a request comes from an
// operator, and who it is.
func operator(r *http.Request) (string, bool) {
	return r.Header.Get("X-Operator"), r.Header.Get("X-Operator") != ""
}

// Mount the console in a service, behind the service's own check of who
// may see it.
func Example_mount() {
	var pool *pgxpool.Pool // the service's pool
	mux := http.NewServeMux()

	// readme:begin console-mount
	c, err := console.New(console.Config{
		Pool:         pool,
		Path:         "/ops/outbox",               // where it is mounted: its links start there
		Actions:      true,                        // replay, delete, cancel, pause, resume; off by default
		AllowedHosts: []string{"ops.example.com"}, // the names it is reached by, besides localhost
		User: func(r *http.Request) string { // who, in the action log
			name, _ := operator(r)
			return name
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	onlyOperators := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := operator(r); !ok {
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	mux.Handle("/ops/outbox/", onlyOperators(http.StripPrefix("/ops/outbox", c)))
	// readme:end
}
