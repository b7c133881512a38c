# Leg pgbouncer: the outbox through PgBouncer (docs/poolers.md).

# MODE is PgBouncer's pool_mode for leg-pgbouncer: transaction or session.
MODE ?= transaction

.PHONY: leg-pgbouncer
leg-pgbouncer: ## Leg: publisher, subscriber and pooler tests, then 20 s of chaos, through PgBouncer in MODE (transaction, session)
	bash .ci/legs/pgbouncer.sh $(MODE)

.PHONY: leg-pgbouncers
leg-pgbouncers: ## Leg: leg-pgbouncer in transaction mode, then in session mode
	bash .ci/legs/pgbouncer.sh transaction
	bash .ci/legs/pgbouncer.sh session
