#!/usr/bin/env bash
# The failover leg: internal/failover in both replication modes, on the
# machine's newest PostgreSQL server binaries (FAILOVER_PG_BIN to choose),
# with the primary and the standby on the ports given first. Its last
# line names the environment, and says whether the leg passed.
#
#   bash .ci/legs/failover.sh 5441 5442 [harness flags]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
primary="${1:?usage: failover.sh PRIMARY_PORT STANDBY_PORT [flags]}"
standby="${2:?usage: failover.sh PRIMARY_PORT STANDBY_PORT [flags]}"
shift 2
# shellcheck disable=SC2012 # the directories are versions
bin="${FAILOVER_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
version="$("$bin/postgres" --version 2>/dev/null | sed -E 's/^postgres \(PostgreSQL\) ([^ ]+).*/PostgreSQL \1/')"
env="${version:-no PostgreSQL server binaries} ($bin), primary 127.0.0.1:$primary, standby 127.0.0.1:$standby, synchronous and asynchronous replication${*:+, flags $*}"
if ! go run -race ./internal/failover -bin "$bin" -primary-port "$primary" -standby-port "$standby" "$@"; then
    echo "leg failover FAILED: $env"
    exit 1
fi
echo "leg failover ok: $env"
