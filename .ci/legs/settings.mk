# The settings leg: publishers' and subscribers' promises under the
# server settings DBAs set (default isolation REPEATABLE READ and
# SERIALIZABLE, statement_timeout, idle_in_transaction_session_timeout,
# lock_timeout, synchronous_commit on and off), as database settings, on
# a throwaway PostgreSQL 15 with autovacuum on (.ci/legs/pg.sh).
.PHONY: leg-settings
leg-settings: ## Leg: the promise tests under the settings DBAs set, on a throwaway cluster with autovacuum on
	@bash .ci/legs/pg.sh -c "bash .ci/legs/settings.sh" 15 || { echo "leg settings FAILED (see the settings named above)"; exit 1; }
