# The ring leg: every test of the outbox package with the log tier's ring
# (internal/ring) beside each outbox table it migrates (TEST_RING=1), so
# that every subscriber claims through the ring's claimer, with the ring
# empty or not, on a throwaway PostgreSQL 15 with autovacuum on
# (.ci/legs/pg.sh); then the roles leg's tests with the ring, as the
# roles (the migrator makes the ring and gives the others what
# ring.Grants lists); then the chaos harness with the ring, as the roles:
# half of the messages written into the ring with plain SQL, the workers
# claiming from both tiers, every row accounted for. The tests of the
# migrations keep to the migrations' objects: the ring is not a
# migration yet.
#
# RING_SKIP: the held-snapshot plan test compares the outbox table's
# plans with and without statistics, which autovacuum gathers midway
# here; the ring changes none of the statements it measures but the key
# trigger, and the main run (autovacuum off) proves them.
# RING_PORT: its clusters' port, apart from the settings leg's PostgreSQL
# 15 (5415), which runs beside it.
RING_PORT ?= 5435
RING_SKIP ?= ^TestHotPathStatementsStepOverNoRowAHeldSnapshotKeeps$$
RING_PG = OUTBOX_PG_PORT=$(RING_PORT) bash .ci/legs/pg.sh
.PHONY: leg-ring
leg-ring: ## Leg: the outbox tests with the log tier's ring beside every outbox table, on throwaway clusters
	@$(RING_PG) -c "TEST_RING=1 $(GO) test -race -count=1 -timeout 20m -skip '$(RING_SKIP)' ./outbox" 15 || { echo "leg ring FAILED: the outbox tests with the ring beside every outbox table (TEST_RING=1)"; exit 1; }
	@$(RING_PG) -c "TEST_RING=1 TEST_ROLES=1 $(GO) test -race -count=1 -timeout 20m -run '$(ROLES_TESTS)' -skip '$(ROLES_SKIP)' ./outbox" 15 || { echo "leg ring FAILED: the roles leg's tests with the ring beside every outbox table, as the roles (TEST_RING=1 TEST_ROLES=1)"; exit 1; }
	@$(RING_PG) -c "$(GO) run -race ./internal/chaos -duration $(CHAOS_LEG_DURATION) -ring -roles" 15 || { echo "leg ring FAILED: chaos with the ring, as least-privileged roles (-ring -roles)"; exit 1; }
