# The commands the README gives. Tests need a PostgreSQL: TEST_DATABASE_URL
# when set, else a testcontainers container (Docker).

GO          ?= go
TOOL        := $(GO) tool -modfile=tools/go.mod
GOFILES      = $(shell git ls-files --cached --others --exclude-standard '*.go')

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: 10,000 orders through the outbox on $DATABASE_URL (or a testcontainers PostgreSQL)
	$(GO) run ./examples/orders

.PHONY: gen
gen: ## Regenerate db/ from sql/ with the pinned sqlc
	$(GO) generate .

.PHONY: verify
verify: ## Fail when db/ is stale, code is not gofmt-clean, or vet/staticcheck complain
	$(TOOL) sqlc diff
	@out="$$(gofmt -l $(GOFILES))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(TOOL) staticcheck ./...
	cd bench && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../tools/go.mod staticcheck ./...
	cd examples/bindings && $(GO) mod tidy -diff && $(GO) generate ./... && $(GO) vet ./...
	@out="$$(git status --porcelain -- examples/bindings)"; if [ -n "$$out" ]; then echo "go generate changed examples/bindings:"; echo "$$out"; git diff -- examples/bindings; exit 1; fi

.PHONY: golden
golden: ## Rewrite the CLI's golden files from the current output
	$(GO) test ./cmd/outboxgen -run Golden -update

.PHONY: test
test: ## Run every test with the race detector against PostgreSQL
	$(GO) test -race -count=1 ./...

# CHAOS_DURATION is how long faults are injected; CI runs the default.
CHAOS_DURATION ?= 60s

.PHONY: chaos
chaos: ## Break an outbox on purpose (kills, backend terminations, stalls, cuts) on $DATABASE_URL and check the accounting
	$(GO) run -race ./internal/chaos -duration $(CHAOS_DURATION)

# BENCH_ARGS passes flags to the benchmark, e.g. BENCH_ARGS="-suite batch -rounds 15".
BENCH_ARGS ?=

.PHONY: bench
bench: ## Benchmark against a bare INSERT, River and watermill-sql on $DATABASE_URL (medians, ratios)
	cd bench && $(GO) run . $(BENCH_ARGS)

# The soak is not run in CI: DURATION sets its length, SOAK_ARGS passes
# further flags, e.g. SOAK_ARGS="-rate 500 -hold-for 0". docs/reliability.md
# ("Soak") starts the PostgreSQL it runs against.
DURATION  ?= 10m
SOAK_ARGS ?=

.PHONY: soak
soak: ## Soak: steady publish and consume on $DATABASE_URL for DURATION (10m), an idle transaction midway; figures each minute
	DATABASE_URL="$(DATABASE_URL)" $(GO) run ./internal/soak -duration $(DURATION) $(SOAK_ARGS)
