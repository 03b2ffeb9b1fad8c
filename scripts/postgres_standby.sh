#!/usr/bin/env bash
# What a PostgreSQL failover that forgets no claim costs: the median claim + settle of
# `PostgresStore` (benches/stores.rs) against a primary with a streaming standby on loopback,
# under each `synchronous_commit` setting, side by side in one sitting.
#
#   bash scripts/postgres_standby.sh            # 2 passes, 5 s of measurement per setting
#   PASSES=3 MEASURE=10 bash scripts/postgres_standby.sh
#
# Settings, applied on the primary with ALTER SYSTEM and a reload between runs:
#   async        synchronous_commit = on, no synchronous standby: the commit waits for the
#                primary's fsync only; a failover can forget the last claims
#   sync-flush   synchronous_standby_names = standby, synchronous_commit = on: every commit
#                also waits for the standby to flush it (a failover forgets nothing)
#   sync-apply   the same with remote_apply: the standby has also applied it (reads there see it)
#   sync-write   the same with remote_write: received by the standby's OS, not flushed
#   local-off    synchronous_commit = off: no wait at all; a crash loses the last commits
#                (shown for scale only; idem's durability needs at least `on`)
#
# It needs PostgreSQL's server binaries (Debian's postgresql); it starts its own two clusters
# on free loopback ports and stops them at the end. Prints one table of medians (ms) per pass
# and the ratio of each setting to `async` in the same pass.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=../.ci/services.sh
source .ci/services.sh

PASSES=${PASSES:-2}
MEASURE=${MEASURE:-5}
SETTINGS=(async sync-flush sync-apply sync-write local-off)

IDEM_PG_BIN=$(idem_find_pg_bin) || { echo "PostgreSQL's server binaries not found" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg-standby.XXXXXX")
if [ "$(id -u)" = 0 ]; then
    IDEM_PG_USER=nobody
    chown "$IDEM_PG_USER" "$work"
fi
primary="$work/primary"
standby="$work/standby"
pport=$(idem_free_port)
sport=$(idem_free_port)

stop_all() {
    local -
    set +e
    idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$standby" -m immediate stop >/dev/null 2>&1
    idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$primary" -m fast stop >/dev/null 2>&1
    rm -rf "$work"
}
trap stop_all EXIT

idem_as_pg_user "$IDEM_PG_BIN/initdb" -D "$primary" -U idem --auth=trust --encoding=UTF8 \
    --locale=C >"$work/initdb.log" 2>&1
cat >>"$primary/postgresql.conf" <<EOF
wal_level = replica
max_wal_senders = 4
listen_addresses = '127.0.0.1'
port = $pport
unix_socket_directories = '$work'
EOF
echo "host replication idem 127.0.0.1/32 trust" >>"$primary/pg_hba.conf"
idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$primary" -l "$work/primary.log" -w -t 60 start >/dev/null

idem_as_pg_user "$IDEM_PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$pport" -U idem -D "$standby" \
    -R -X stream >/dev/null
echo "port = $sport" >>"$standby/postgresql.conf"
# pg_basebackup -R wrote a primary_conninfo into postgresql.auto.conf, which wins over
# postgresql.conf; a later line there names the standby for synchronous_standby_names.
echo "primary_conninfo = 'host=127.0.0.1 port=$pport user=idem application_name=standby'" \
    >>"$standby/postgresql.auto.conf"
idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$standby" -l "$work/standby.log" -w -t 60 start >/dev/null

psql_primary() {
    "$IDEM_PG_BIN/psql" -X -q -t -A -h 127.0.0.1 -p "$pport" -U idem -d postgres -c "$1"
}

apply_setting() {
    case $1 in
        async) psql_primary "ALTER SYSTEM SET synchronous_standby_names = ''" ;
               psql_primary "ALTER SYSTEM SET synchronous_commit = 'on'" ;;
        sync-flush) psql_primary "ALTER SYSTEM SET synchronous_standby_names = 'standby'" ;
               psql_primary "ALTER SYSTEM SET synchronous_commit = 'on'" ;;
        sync-apply) psql_primary "ALTER SYSTEM SET synchronous_standby_names = 'standby'" ;
               psql_primary "ALTER SYSTEM SET synchronous_commit = 'remote_apply'" ;;
        sync-write) psql_primary "ALTER SYSTEM SET synchronous_standby_names = 'standby'" ;
               psql_primary "ALTER SYSTEM SET synchronous_commit = 'remote_write'" ;;
        local-off) psql_primary "ALTER SYSTEM SET synchronous_standby_names = ''" ;
               psql_primary "ALTER SYSTEM SET synchronous_commit = 'off'" ;;
    esac
    psql_primary "SELECT pg_reload_conf()" >/dev/null
    # The standby must be streaming (and, for the sync settings, chosen) before measuring.
    local want=async tries=0
    case $1 in sync-*) want=sync ;; esac
    until [ "$(psql_primary "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'")" = "$want" ]; do
        tries=$((tries + 1))
        [ $tries -lt 100 ] || { echo "the standby never became $want" >&2; exit 1; }
        sleep 0.1
    done
}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo bench -p idem-rs --features postgres --bench stores --no-run -q 2>/dev/null
median_ms() {
    python3 -c 'import json,sys; print("%.3f" % (json.load(open(sys.argv[1]))["median"]["point_estimate"] / 1e6))' \
        "$CARGO_TARGET_DIR/criterion/claim+settle_postgres/new/estimates.json"
}

echo "PostgreSQL $("$IDEM_PG_BIN/postgres" --version | awk '{print $3}'), primary 127.0.0.1:$pport, standby 127.0.0.1:$sport; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%F)"
for pass in $(seq 1 "$PASSES"); do
    echo
    echo "pass $pass: median claim + settle (ms), ratio to async"
    base=
    for setting in "${SETTINGS[@]}"; do
        apply_setting "$setting"
        IDEM_POSTGRES_URL="postgres://idem@127.0.0.1:$pport/postgres" \
            cargo bench -p idem-rs --features postgres --bench stores -q -- 'claim\+settle/postgres' \
            --warm-up-time 1 --measurement-time "$MEASURE" --noplot >/dev/null 2>&1
        ms=$(median_ms)
        [ -n "$base" ] || base=$ms
        printf '  %-11s %8s ms  %5.2fx\n' "$setting" "$ms" "$(python3 -c "print($ms / $base)")"
    done
done
