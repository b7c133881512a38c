# The roles leg: the outbox package's publisher, subscriber, transactional
# handler, inspection, health and dead-letter tests, then the chaos
# harness, with the code under test connected as least-privileged roles
# (TEST_ROLES=1:
# a migrator owns the outbox; publishers and subscribers have only what
# `outboxgen grants` gives them). Fixtures and checks run as the role of
# TEST_DATABASE_URL, which must be able to create roles.
.PHONY: leg-roles
leg-roles: ## Leg: the outbox tests and chaos as a migrator, a publisher and a subscriber role (never superuser)
	@TEST_ROLES=1 $(GO) test -race -count=1 -run '$(ROLES_TESTS)' -skip '$(ROLES_SKIP)' ./outbox || { echo "leg roles FAILED: the outbox tests as least-privileged roles on $$TEST_DATABASE_URL"; exit 1; }
	@$(GO) run -race ./internal/chaos -duration $(CHAOS_LEG_DURATION) -roles || { echo "leg roles FAILED: chaos as least-privileged roles on $$DATABASE_URL"; exit 1; }

CHAOS_LEG_DURATION ?= 20s
# The tests the roles leg runs (every test of the package passes as the
# roles too: ROLES_TESTS=. runs them all).
ROLES_TESTS ?= Publish|Subscri|TxHandler|TxEffects|DeadLetter|Replay|Queue|Depth|Health|Backlog|Unprocessed|Timer|Role|Privilege|Owners|SkipTheKeys|ClaimPromise|PerKeyOrder|Retry
# Tests the regex takes that never reach the database (configuration
# checks, against a pool that connects nowhere): the main run proves them,
# and no role changes them.
ROLES_SKIP ?= ^Test(RetryStrategies|ZeroRetryFieldsTakeTheirDocumentedDefaults|SubscriberSettingsCopyEveryField|RetrySettingsAreValidated|SubscriberConfigShowsExponentialRetryDefaults|HeartbeatIntervalIsAtMostHalfTheLease|NewPublisherRejectsBadConfig|NewSubscriberRejectsBadConfig)$
