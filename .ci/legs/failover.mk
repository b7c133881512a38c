# The failover leg: a streaming standby promoted mid-drain while
# publishers and subscribers run through a multi-host DSN, with
# synchronous and with asynchronous replication (internal/failover,
# docs/failover.md). Its clusters use the machine's PostgreSQL server
# binaries, on ports FAILOVER_PORTS (primary, standby), in a temporary
# directory removed afterwards. FAILOVER_ARGS passes further flags, e.g.
# FAILOVER_ARGS="-runs 3" for medians, "-modes async", "-outage 15s".
FAILOVER_PORTS ?= 5441 5442
FAILOVER_ARGS  ?=

.PHONY: leg-failover
leg-failover: ## Fail an outbox over to a promoted standby mid-drain (sync and async replication) and count every message
	bash .ci/legs/failover.sh $(FAILOVER_PORTS) $(FAILOVER_ARGS)
