# The PostgreSQL versions: the version-sensitive tests (.ci/legs/pg-tests)
# and a short chaos run on a throwaway cluster of each major's server from
# .ci/legs/pg-versions (the machine's own server covers 15); FULL=1 runs
# the whole make test and make chaos there instead. OUTBOX_PG_CACHE is
# where the binaries are kept (default /var/cache/outboxgen/pg); see
# .ci/legs/pg.sh and README.md.
PG      ?=
PG_LEGS ?= 14 16 17 18
FULL    ?=

.PHONY: leg-pg
leg-pg: ## Leg: the version-sensitive tests and chaos on a throwaway PostgreSQL of major PG (14 to 18), e.g. make leg-pg PG=14 (FULL=1: the whole make test)
	@if [ -z "$(PG)" ]; then echo "usage: make leg-pg PG=14 [FULL=1] (a major of .ci/legs/pg-versions)" >&2; exit 2; fi
	@OUTBOX_PG_FULL="$(FULL)" bash .ci/legs/pg.sh $(PG)

.PHONY: leg-pgs
leg-pgs: ## Leg: leg-pg for each of PG_LEGS (14 16 17 18: the majors besides the machine's own 15)
	@OUTBOX_PG_FULL="$(FULL)" bash .ci/legs/pg.sh $(PG_LEGS)
