# The ring leg: the chaos harness with the log tier's ring (schema 13) on
# a throwaway PostgreSQL 15 with autovacuum on (.ci/legs/pg.sh): half of
# the messages written into the ring (unkeyed ones with plain SQL, keyed
# ones by a Publisher into the ring; each key into one tier), the
# workers claiming from both tiers, every row accounted for;
# once as the superuser and once as least-privileged roles. Every other
# run migrates outboxes that have the ring, so their subscribers claim
# through the ring's claimer with it empty or not; the main run's tests
# of the ring write into it.
#
# RING_PORT: its clusters' port, apart from the settings leg's PostgreSQL
# 15 (5415), which runs beside it.
RING_PORT ?= 5435
RING_PG = OUTBOX_PG_PORT=$(RING_PORT) bash .ci/legs/pg.sh
.PHONY: leg-ring
leg-ring: ## Leg: the chaos harness with half of the messages written into the log tier's ring, as the superuser and as roles, on throwaway clusters
	@$(RING_PG) -c "$(GO) run -race ./internal/chaos -duration $(CHAOS_LEG_DURATION) -ring" 15 || { echo "leg ring FAILED: chaos with the ring (-ring)"; exit 1; }
	@$(RING_PG) -c "$(GO) run -race ./internal/chaos -duration $(CHAOS_LEG_DURATION) -ring -roles" 15 || { echo "leg ring FAILED: chaos with the ring, as least-privileged roles (-ring -roles)"; exit 1; }
