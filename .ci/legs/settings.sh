#!/usr/bin/env bash
# The settings leg: the promises of publishers and subscribers, proven
# through the public API under the server settings DBAs give databases
# and roles, on the server TEST_DATABASE_URL names (the leg's own cluster,
# with autovacuum on: see settings.mk). Each group of settings is set on
# a database of its own (ALTER DATABASE ... SET), which the tests then use.
# On failure the last line names the settings.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

: "${TEST_DATABASE_URL:?set TEST_DATABASE_URL to the server the leg runs on}"
psql() { env -u LD_LIBRARY_PATH psql -X -q -v ON_ERROR_STOP=1 "$@"; }

# The tests that prove a promise end to end through the public API (their
# fixtures and checks run at whatever the database's defaults are). At
# SERIALIZABLE an application retries what fails to serialize, Publish in
# autocommit included; the roles test and the handlers of the per-key test
# across processes (which record their calls in a table) do not, so they
# run at the other settings only (TestSubscribersKeepTheirPromisesUnder-
# TheSettingsDBAsSet holds per-key order at SERIALIZABLE).
promises='SubscribersKeepTheirPromisesUnderTheSettingsDBAsSet|SubscribersDeliverEveryRowExactlyOnce|SubscribersWithDifferentLeaseTTLsNeverShareARow|SubscriberSurvivesKilledBackends|SubscriberHandlesAKeyOneAtATimeInOrder|SubscriberWhoseListenerCannotHearPollsAndSaysSo|ClaimPromise|TxHandler|TxEffectsHappenOnceThroughKills|ReplayDeadLetters|DeadLetterListAndPurge|GracefulStopDrainsInFlight|HandlerOutlivingTheLockWindowFinishesUnderALease|HeartbeatKeepsASlowHandlersLease|PublishVisibilityFollowsTheCallersTransaction|PublishBatchOf10000|TimerDedupeAndCancel|NotifyWakesAnIdleSubscriber|PollingDeliversWhenListenIsImpossible|KilledListenerIsReplaced|RetryAfterIsDeliveredOnTime|StopReleasesClaimedButUnstartedRows|ClaimsDrainWhenThePoolDefaultsToSerializable|HandOversOfMoreKeysThanTheLockTableHoldsAreAllCompleted'
tests=("^Test($promises|RolesWithOnlyTheDocumentedGrantsPublishSubscribeAndOperate|PerKeyOrderAcrossProcesses)" "^Test($promises)")

# Each group: the settings, one per line, as name=value.
groups=(
"default_transaction_isolation=repeatable read
statement_timeout=5s
idle_in_transaction_session_timeout=5s
lock_timeout=2s
synchronous_commit=off"
"default_transaction_isolation=serializable
statement_timeout=5s
idle_in_transaction_session_timeout=5s
lock_timeout=2s
synchronous_commit=on
max_locks_per_transaction=default"
)

base=${TEST_DATABASE_URL%%\?*}
server=${base%/*}
failed=()
for i in "${!groups[@]}"; do
    db="outboxgen_settings_$i"
    desc=$(echo "${groups[$i]}" | paste -sd, -)
    echo "== settings: $desc"
    psql "$server/postgres?sslmode=disable" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" || exit 1
    while IFS='=' read -r name value; do
        # max_locks_per_transaction is the server's (its default here).
        [ "$value" = default ] && continue
        psql "$server/$db?sslmode=disable" -c "ALTER DATABASE $db SET $name = '$value'" || exit 1
    done <<<"${groups[$i]}"
    psql "$server/$db?sslmode=disable" -Atc "SELECT name || '=' || setting FROM pg_settings WHERE name IN
        ('default_transaction_isolation', 'statement_timeout', 'idle_in_transaction_session_timeout', 'lock_timeout',
         'synchronous_commit', 'max_locks_per_transaction', 'autovacuum') ORDER BY 1" | paste -sd' ' -
    if ! TEST_DATABASE_URL="$server/$db?sslmode=disable" go test -race -count=1 -run "${tests[$i]}" ./outbox; then
        failed+=("$desc")
    fi
    psql "$server/postgres?sslmode=disable" -c "DROP DATABASE $db WITH (FORCE)" || true
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "leg settings FAILED under: $(IFS=';'; echo "${failed[*]}")"
    exit 1
fi
