#!/usr/bin/env bash
# Runs the `backends` harness (src/bin/backends.rs) against private servers on 127.0.0.1:
# PostgreSQL from .ci/services.sh, and a Redis started here with persistence off (the
# services' Redis fsyncs every write, which would measure the disk, not the store).
# Everything started here is stopped on exit. Arguments go to the harness (sections:
# redis cluster sqlite postgres memory); `cluster` runs on the services' 3-master Redis
# Cluster, its AOF turned off here for the same reason. Environment: BENCH_SECS (per cell,
# default 3), BENCH_PAIRS, BENCH_PG_STATS=1 (preload pg_stat_statements on the PostgreSQL
# cluster, restarting it, so the postgres section also prints the server's time and WAL per
# statement), BENCH_BEFORE (the path of another build of the harness, e.g. one built at an
# earlier commit and copied aside: it and this build then run alternately against the same
# servers, BENCH_ROUNDS times, default 3, each run headed "[backends] round N: before|after").
#
#   benches/peers/backends.sh                 # every section
#   BENCH_SECS=5 benches/peers/backends.sh redis
#   BENCH_PG_STATS=1 benches/peers/backends.sh postgres
#   BENCH_PG_STATS=1 BENCH_BEFORE=/tmp/backends-before benches/peers/backends.sh postgres sqlite
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/tmp-peers-target}
cargo build --release --manifest-path "$here/Cargo.toml" --bin backends

# shellcheck source=../../.ci/services.sh
source "$root/.ci/services.sh"
idem_services_start
if [ "${BENCH_PG_STATS:-0}" = 1 ]; then
    # The cluster is this run's own (services.sh made it); the setting dies with it.
    psql "$IDEM_POSTGRES_URL" -qc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
    idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$IDEM_PG_DATA" -w restart >/dev/null
    psql "$IDEM_POSTGRES_URL" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
    echo "[backends] pg_stat_statements loaded" >&2
fi

port=$(idem_free_port)
rdir=$(mktemp -d "${TMPDIR:-/tmp}/idem-peers-redis.XXXXXX")
redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --daemonize no \
    --dir "$rdir" --save '' --appendonly no --logfile "$rdir/redis.log" &
redis_pid=$!
stop_own_redis() {
    kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$rdir"
    idem_services_stop
}
trap stop_own_redis EXIT
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
export IDEM_REDIS_URL="redis://127.0.0.1:$port/"
for url in ${IDEM_REDIS_CLUSTER_URLS//,/ }; do
    node=${url#redis://}
    node=${node%/}
    redis-cli -h "${node%:*}" -p "${node#*:}" config set appendonly no >/dev/null
done
echo "[backends] $(redis-server --version | cut -d' ' -f1-3), persistence off, on 127.0.0.1:$port" >&2
if [ -z "${BENCH_BEFORE:-}" ]; then
    "$CARGO_TARGET_DIR/release/backends" "$@"
    exit
fi
for round in $(seq 1 "${BENCH_ROUNDS:-3}"); do
    echo "[backends] round $round: before ($BENCH_BEFORE)"
    "$BENCH_BEFORE" "$@"
    echo "[backends] round $round: after"
    "$CARGO_TARGET_DIR/release/backends" "$@"
done
