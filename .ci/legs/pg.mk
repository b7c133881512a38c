# The PostgreSQL versions: make test and a short chaos run on a throwaway
# cluster of each major's server from .ci/legs/pg-versions (the machine's
# own server covers 15). OUTBOX_PG_CACHE is where the binaries are kept
# (default /var/cache/outboxgen/pg); see .ci/legs/pg.sh.
PG      ?=
PG_LEGS ?= 14 16 17 18

.PHONY: leg-pg
leg-pg: ## Leg: make test and chaos on a throwaway PostgreSQL of major PG (14 to 18), e.g. make leg-pg PG=14
	@if [ -z "$(PG)" ]; then echo "usage: make leg-pg PG=14 (a major of .ci/legs/pg-versions)" >&2; exit 2; fi
	@bash .ci/legs/pg.sh $(PG)

.PHONY: leg-pgs
leg-pgs: ## Leg: leg-pg for each of PG_LEGS (14 16 17 18: the majors besides the machine's own 15)
	@bash .ci/legs/pg.sh $(PG_LEGS)
