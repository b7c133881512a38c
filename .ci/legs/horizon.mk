# The held vacuum horizon (docs/operations.md, "A held vacuum horizon"):
# the soak (internal/soak) on a private cluster it starts itself, with
# fsync on and autovacuum visiting every second, while a REPEATABLE READ
# transaction holds a snapshot open. HORIZON_PORT is the cluster's port
# (0: a free one); HORIZON_ARGS passes further flags to the soak.
HORIZON_PORT ?= 0
HORIZON_ARGS ?=

.PHONY: leg-horizon
leg-horizon: ## CI leg: 90 s of steady load, a snapshot held 70 s of it; fails when a message is lost or the drain does not finish
	@HORIZON_PORT="$(HORIZON_PORT)" GO="$(GO)" bash .ci/legs/horizon.sh ci $(HORIZON_ARGS)

.PHONY: horizon
horizon: ## The held horizon's figures: 10 min at 1,000 msgs/s, a snapshot held from minute 1 to 9, against the same 10 min without (about 25 min)
	@HORIZON_PORT="$(HORIZON_PORT)" GO="$(GO)" bash .ci/legs/horizon.sh full $(HORIZON_ARGS)
