# The commands the README gives. Tests need a PostgreSQL: TEST_DATABASE_URL
# when set, else what psql with no arguments reaches, else a throwaway
# cluster made with the machine's server binaries, else a testcontainers
# container (Docker; outbox/outboxtest/pgcontainer, which the demo links
# only with -tags container).

GO          ?= go
TOOL        := $(GO) tool -modfile=tools/go.mod
GOFILES      = $(shell git ls-files --cached --others --exclude-standard '*.go')

.DEFAULT_GOAL := help

# The CI legs: one environment each (PostgreSQL versions, roles, poolers,
# server settings, a held vacuum horizon, failover); see .ci/legs/README.md.
include $(sort $(wildcard .ci/legs/*.mk))

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: 10,000 orders through the outbox on $DATABASE_URL (or what psql reaches, a throwaway cluster)
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
	cd contrib/prometheus && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd contrib/otel && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd contrib/jetstream && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd contrib/gojson && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd contrib/protocodec && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd contrib/protocodec/testdata/shop && $(GO) mod tidy -diff && $(GO) generate ./... && $(GO) vet ./...
	cd contrib/protocodec/testdata/billing && $(GO) mod tidy -diff && $(GO) generate ./... && $(GO) vet ./...
	@out="$$(git status --porcelain -- contrib/protocodec/testdata)"; if [ -n "$$out" ]; then echo "go generate changed contrib/protocodec/testdata:"; echo "$$out"; git diff -- contrib/protocodec/testdata; exit 1; fi
	cd console/browser && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod staticcheck ./...
	cd examples/bindings && $(GO) mod tidy -diff && $(GO) generate ./... && $(GO) vet ./...
	@out="$$(git status --porcelain -- examples/bindings)"; if [ -n "$$out" ]; then echo "go generate changed examples/bindings:"; echo "$$out"; git diff -- examples/bindings; exit 1; fi

.PHONY: golden
golden: ## Rewrite the CLI's golden files from the current output
	$(GO) test ./cmd/outboxgen -run Golden -update

# make test runs go test in the repository's module and in the contrib
# modules', the console's browser tests' and the bindings example's at
# once (internal/testreport), prints what go test prints, and ends with
# the TEST_SLOWEST (10) slowest tests. TEST_PARALLEL is how many tests of
# one package run at once: most wait on the database, not the CPU.
# GOTESTFLAGS passes flags to every go test, e.g. GOTESTFLAGS=-v or
# GOTESTFLAGS="-run Publish"; TEST_JSON=FILE keeps go test's JSON events.
# The timeout is go test's 10m tripled: a package's tests, CPU-bound under
# the race detector, take several times longer on a busy machine.
GOTESTFLAGS   ?=
TEST_PARALLEL ?= 8
TEST_SLOWEST  ?= 10
TEST_JSON     ?=
# The repository's module lists its packages of the longest tests first:
# go test starts packages in the order it is given them.
TEST_MODULES   = .=./outbox,./cmd/outboxgen,./console,./outbox/outboxtest,./... \
                 contrib/prometheus contrib/otel contrib/jetstream contrib/gojson contrib/protocodec console/browser examples/bindings

.PHONY: test
test: ## Run every test with the race detector against PostgreSQL (the contrib modules' and the console's browser tests too), then list the slowest
	@$(GO) run ./internal/testreport $(addprefix -dir ,$(TEST_MODULES)) -slowest $(TEST_SLOWEST) \
		$(if $(TEST_JSON),-json $(TEST_JSON)) $(if $(filter -v,$(GOTESTFLAGS)),-v) \
		-- -race -count=1 -timeout 30m -parallel $(TEST_PARALLEL) $(GOTESTFLAGS)

# CHAOS_DURATION is how long faults are injected; CI runs the default.
# CHAOS_FLAGS are more of the harness's flags (-ring, -roles, -workers).
CHAOS_DURATION ?= 60s
CHAOS_FLAGS    ?=

.PHONY: chaos
chaos: ## Break an outbox on purpose (kills, backend terminations, stalls, cuts, half-open connections) on $DATABASE_URL and check the accounting
	$(GO) run -race ./internal/chaos -duration $(CHAOS_DURATION) $(CHAOS_FLAGS)

# FUZZTIME is how long each fuzz target runs; FUZZPARALLEL is its number
# of workers; FUZZMINIMIZETIME caps the minimising of each new input (go
# test's default, 60s, leaves short runs mostly minimising). go test -fuzz
# takes one target of one package at a time.
FUZZTIME         ?= 10s
FUZZPARALLEL     ?= 2
FUZZMINIMIZETIME ?= 5s
FUZZPKGS      = $(sort $(dir $(shell git grep -l '^func Fuzz' -- '*_test.go')))

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 10s); make test runs their seed corpora
	@set -e; log=$$(mktemp); trap 'rm -f $$log $$log.rc' EXIT; \
	for pkg in $(FUZZPKGS); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$pkg*_test.go); do \
			echo "== ./$$pkg $$target ($(FUZZTIME))"; \
			{ rc=0; (cd $$pkg && $(GO) test . -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) \
				-fuzzminimizetime $(FUZZMINIMIZETIME) -parallel $(FUZZPARALLEL)) 2>&1 || rc=$$?; echo $$rc > $$log.rc; } | tee $$log; \
			if [ "$$(cat $$log.rc)" != 0 ]; then \
				if grep -q 'context deadline exceeded' $$log && ! grep -q 'Failing input written' $$log; then \
					echo "(the fuzztime deadline raced a worker, go.dev/issue/75804: no input failed)"; \
				else exit 1; fi; \
			fi; \
		done; \
	done

# BENCH_ARGS passes flags to the benchmark, e.g. BENCH_ARGS="-suite batch -rounds 15".
BENCH_ARGS ?=

.PHONY: bench
bench: ## Benchmark against a bare INSERT, River, watermill-sql and watermill's SQL-to-NATS forwarder on $DATABASE_URL (medians, ratios)
	cd bench && $(GO) run . $(BENCH_ARGS)

# The soak is not run in CI: DURATION sets its length, SOAK_ARGS passes
# further flags, e.g. SOAK_ARGS="-rate 500 -hold-for 0". docs/reliability.md
# ("Soak") starts the PostgreSQL it runs against.
DURATION  ?= 10m
SOAK_ARGS ?=

.PHONY: soak
soak: ## Soak: steady publish and consume on $DATABASE_URL for DURATION (10m), an idle transaction midway; figures each minute
	DATABASE_URL="$(DATABASE_URL)" $(GO) run ./internal/soak -duration $(DURATION) $(SOAK_ARGS)
