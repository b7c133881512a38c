#!/usr/bin/env bash
# The held-horizon leg. "ci": one short held run that must lose nothing
# and drain; "full": the figures, ten minutes held against ten minutes
# without (docs/operations.md). Extra arguments go to the soak.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

mode="${1:-ci}"
shift || true
port="${HORIZON_PORT:-0}"
go="${GO:-go}"

case "$mode" in
ci)
    args=(-duration 90s -hold-at 10s -hold-for 70s -sample 10s -report 30s -drain 30s) ;;
full)
    args=(-compare -duration 10m -hold-at 1m -hold-for 8m -drain 1m) ;;
*)
    echo "usage: $0 ci|full [soak flags]" >&2
    exit 2 ;;
esac

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"$go" run ./internal/soak -cluster -port "$port" -hold-kind snapshot -writers 8 "${args[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
took=$(( $(date +%s) - start ))

server="$(sed -n 's/^soak: .* on \(PostgreSQL [0-9.]*\).*/\1/p' "$log" | head -n 1)"
env="${server:-PostgreSQL (did not start)}, a private cluster (fsync on, autovacuum_naptime 1s), REPEATABLE READ snapshot held, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), ${took}s"
if [ "$rc" -ne 0 ]; then
    echo "leg horizon FAILED ($mode): $env"
    exit "$rc"
fi
echo "leg horizon passed ($mode): $env"
