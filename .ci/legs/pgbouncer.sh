#!/usr/bin/env bash
# Leg pgbouncer: the outbox through PgBouncer in transaction or session mode.
#
#   .ci/legs/pgbouncer.sh transaction|session
#
# Starts a PgBouncer of its own (Debian's package; installed when missing
# and this runs as root) on 127.0.0.1:6432 (transaction) or :6433
# (session), in front of the PostgreSQL that PGBOUNCER_SERVER_URL names
# (default: 127.0.0.1:5432, database test, user postgres, trust auth).
# Then, with TEST_DATABASE_URL at PgBouncer:
#
#  1. the outbox package's publisher, subscriber and pooler tests (the
#     regex below), with the pgx settings docs/poolers.md gives for the
#     mode, and the CLI's health test of a listener behind the pooler;
#  2. make chaos for CHAOS_DURATION (20s) with DATABASE_URL at PgBouncer:
#     backend terminations and, in transaction mode, the workers' LISTEN
#     connections go to the server directly.
#
# PgBouncer and its files are removed at the end. A failure prints the
# environment on the last line. PGBOUNCER_TESTS=regex runs only those
# tests of the outbox package through it, -count=PGBOUNCER_COUNT (1) times.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=${1:-}
case $mode in
transaction) port=${PGBOUNCER_TRANSACTION_PORT:-6432} ;;
session) port=${PGBOUNCER_SESSION_PORT:-6433} ;;
*)
    echo "usage: $0 transaction|session" >&2
    exit 2
    ;;
esac
server=${PGBOUNCER_SERVER_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
duration=${CHAOS_DURATION:-20s}

# What the leg proves through the pooler (docs/poolers.md, "The leg"):
# publishing and its errors, subscribers (claims by lease and by lock,
# outcomes, heartbeats, retries, dead letters, stops, crashes), per-key
# order, transactional handlers, the NOTIFY triggers and the pooler's own
# tests (exec modes, ListenDSN, health). Left out: tests that pass
# settings as startup parameters (PgBouncer 1.18 passes on only a few),
# that count or kill the test's own backends by application_name, that
# start clusters of their own, that measure costs or read query plans,
# and the examples (their pools set search_path).
tests='^Test(Publish([^e]|erTakes)|NewPublisher|NilPayload|BadInput|Codecs|Timer|CancelTimer|Subscriber(Whose|sWith|sDeliver|Completes|Handles|OfAnother|SleepRecord)|NewSubscriber|RunTwice|RunReturns|GracefulStop|WedgedHandler|SlowOrPanicking|StopReleases|Claim(Takes|Skips|Reclaims|Limit|Respects|Promise|Shares|OfARow|sWrite|Whose|After)|ConcurrentClaims|Lease|Heartbeat|SlowHandler|BatchedFlush|Redelivery|Outcomes|Delete|MarkPending|ExtendLeases|DeadLetter|Retry|MaxDeliveries|Undecodable|TerminalRows|Locked|HandlerOutliving|AbortedLocked|StalledLocked|RowOfAClaim|LockQueue|OnlyTheHead|BatchedClaim|DeadLetteredHead|RetryingHead|ScheduledHead|AnyDelete|ConcurrentPublishers|IDsOfAKey|PlainSQL|HandOver|SnapshotIsolation|OrderingKeyAndQueue|FailingHead|KeyedOutcomes|TxHandler|NewTxSubscriber|TxSubscriber|PerKeyOrder|NotifyOnCommit|NotifyOncePer|NotifySkips|NotifyForRows|Writers|MigrateUpDownUp|MigrationStatus|ConcurrentMigrate|MigrateAfterAnotherTool|MigrateUpgradesWhatAnotherTool|PgBouncer|ARowWhoseClaimDied|AClaimWhoseTransactionEnded)'
# In session mode each client keeps its server connection, as on a direct
# one: the publisher's, the subscribers' (with their LISTEN through the
# pooler), the transactional subscriber's, the migrations' and the pooler
# tests are enough there.
session_tests='^Test(Publish([^e]|erTakes)|NewPublisher|Subscriber(Whose|sWith|sDeliver|Completes|Handles|OfAnother|SleepRecord)|NewSubscriber|RunReturns|GracefulStop|TxHandler|NewTxSubscriber|TxSubscriber|NotifyOnCommit|NotifyOncePer|NotifySkips|NotifyForRows|MigrateUpDownUp|ConcurrentMigrate|PgBouncer|ARowWhoseClaimDied|AClaimWhoseTransactionEnded)'
if [ "$mode" = session ]; then tests=$session_tests; fi
# Tests the regexes take that never reach the database (configuration
# checks, against a pool that connects nowhere): no pooler changes them.
skip='^Test(RetryStrategies|ZeroRetryFieldsTakeTheirDocumentedDefaults|SubscriberSettingsCopyEveryField|RetrySettingsAreValidated|SubscriberConfigShowsExponentialRetryDefaults|HeartbeatIntervalIsAtMostHalfTheLease|NewPublisherRejectsBadConfig|NewSubscriberRejectsBadConfig)$'
# The CLI's: health names the pooler and the fix.
clitests='^TestHealthThroughPgBouncer$'

log() { printf '== leg pgbouncer-%s: %s\n' "$mode" "$*"; }

if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "pgbouncer is not installed (apt-get install pgbouncer)" >&2
        exit 1
    fi
    log "installing Debian's pgbouncer"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
    # The package's own service listens on 6432 when its init system
    # starts it: this leg runs instances of its own.
    service pgbouncer stop >/dev/null 2>&1 || true
fi
PATH=$PATH:/usr/sbin
version=$(pgbouncer --version | sed -n 's/^PgBouncer //p')

dir=$(mktemp -d /tmp/leg-pgbouncer-"$mode".XXXXXX)
chmod 755 "$dir"
pid=
environment() {
    local pg
    pg=$(psql -XAtqc 'SHOW server_version' "$server" 2>/dev/null || echo '?')
    echo "PgBouncer $version, pool_mode=$mode on 127.0.0.1:$port, in front of PostgreSQL $pg at ${server%%\?*}"
}
finish() {
    local rc=$?
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ "$rc" != 0 ] && [ -f "$dir/pgbouncer.log" ]; then
        echo "-- the last lines of PgBouncer's log:"
        tail -n 20 "$dir/pgbouncer.log"
    fi
    rm -rf "$dir"
    if [ "$rc" != 0 ]; then
        echo "leg pgbouncer-$mode FAILED: $(environment)"
    fi
    exit "$rc"
}
trap finish EXIT

if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "127.0.0.1:$port is taken by another program; this leg starts PgBouncer there" >&2
    exit 1
fi

# The server's address and the user PgBouncer looks roles up as.
read -r host sport user < <(psql -XAtqc \
    "SELECT coalesce(inet_server_addr()::text, '127.0.0.1'), current_setting('port'), current_user" \
    -F ' ' "$server")
host=${host%/*}

# Pool sizes: in transaction mode a server connection is held only while
# a transaction runs; in session mode for a client connection's life, so
# its pool holds every client connection of the chaos run (3 workers of
# 16 connections, their listeners, the coordinator). max_db_connections
# bounds what the leg takes of the server's max_connections; idle server
# connections of the tests' roles close after 10 s, or sooner when
# another pool needs the room.
if [ "$mode" = transaction ]; then size=30; else size=70; fi
printf '"%s" ""\n' "$user" >"$dir/userlist.txt"
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$sport

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = $mode
; The server trusts local connections: PgBouncer authenticates no one,
; and looks up roles it does not know (the tests make their own) as
; $user with auth_query.
auth_type = trust
auth_file = $dir/userlist.txt
auth_user = $user
max_client_conn = 500
default_pool_size = $size
max_db_connections = $size
server_idle_timeout = 10
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF

run=()
if [ "$(id -u)" = 0 ]; then
    # PgBouncer refuses to run as root.
    chown -R postgres "$dir"
    run=(runuser -u postgres --)
fi
"${run[@]}" pgbouncer -d "$dir/pgbouncer.ini"
for _ in $(seq 1 50); do
    [ -s "$dir/pgbouncer.pid" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
pid=$(cat "$dir/pgbouncer.pid")
log "$(environment)"

pooler="postgres://$user@127.0.0.1:$port/${server##*/}"
sep='?'
case $pooler in *\?*) sep='&' ;; esac
# In transaction mode, pgx's default (a named prepared statement per
# query) needs PgBouncer 1.21's max_prepared_statements: before it, the
# documented setting is default_query_exec_mode=exec. Session mode keeps
# pgx's defaults.
url=$pooler
if [ "$mode" = transaction ]; then
    url="$pooler${sep}default_query_exec_mode=exec"
    # ... and the tests LISTEN on the server directly (ListenDSN).
    export TEST_LISTEN_DATABASE_URL=$server
fi

export TEST_PGBOUNCER_URL=$pooler TEST_PGBOUNCER_MODE=$mode TEST_PGBOUNCER_SERVER_URL=$server
export TEST_DATABASE_URL=$url

began=$(date +%s)
if [ -n "${PGBOUNCER_TESTS:-}" ]; then
    log "go test ./outbox -run '$PGBOUNCER_TESTS'"
    go test -race -count="${PGBOUNCER_COUNT:-1}" -timeout 10m ./outbox -run "$PGBOUNCER_TESTS"
    exit
fi
log "go test ./outbox -run (publisher, subscriber and pooler tests)"
go test -race -count=1 -timeout 10m ./outbox -run "$tests" -skip "$skip"
log "go test ./cmd/outboxgen -run '$clitests'"
go test -race -count=1 -timeout 5m ./cmd/outboxgen -run "$clitests"
tested=$(date +%s)

log "make chaos CHAOS_DURATION=$duration through PgBouncer"
listen=()
if [ "$mode" = transaction ]; then
    listen=(OUTBOX_CHAOS_LISTEN_URL="$server")
fi
env DATABASE_URL="$url" OUTBOX_CHAOS_SERVER_URL="$server" "${listen[@]}" make --no-print-directory chaos CHAOS_DURATION="$duration"
ended=$(date +%s)
log "passed: tests $((tested - began)) s, chaos $((ended - tested)) s ($(environment))"
