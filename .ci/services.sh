# Services the backend tests need: Redis and PostgreSQL 15, private to this run.
#
# Sourced by .ci/run. `idem_services_start` installs what is missing (Debian packages),
# starts redis-server and a throw-away PostgreSQL cluster on free ports bound to 127.0.0.1,
# exports IDEM_REDIS_URL and IDEM_POSTGRES_URL (and IDEM_REDIS_CLUSTER_URLS, below), and
# registers `idem_services_stop` to run on exit, so nothing outlives the run. Nothing here
# touches a system-wide server.
#
# A second PostgreSQL cluster serves TLS only (ssl=on, a certificate for 127.0.0.1 signed by
# a CA made at start with openssl; every key 0600 in the run's private directory; clear-text
# connections rejected by pg_hba): it exports IDEM_POSTGRES_TLS_URL (no sslmode: the test
# picks one), IDEM_POSTGRES_TLS_CA (the CA certificate, to verify the server with) and
# IDEM_POSTGRES_TLS_OTHER_CA (a CA that did not sign it). Its database idem_mtls also
# requires a client certificate (IDEM_POSTGRES_TLS_MTLS_URL; IDEM_POSTGRES_TLS_CLIENT_CERT
# and _KEY are one the CA signed). The main cluster stays clear text, so every other test
# connects as it always did.
#
# A Redis Cluster of three masters (no replicas), each its own cluster-enabled redis-server
# on a free loopback port with its own directory and the same persistence as the single
# Redis (AOF, fsync always): it exports IDEM_REDIS_CLUSTER_URLS, the nodes' URLs separated
# by commas, once `cluster info` says the cluster is ok.
#
# A second Redis Cluster of three masters serves TLS only, with client certificates
# required (`--tls-auth-clients yes`, Redis's own default) and TLS on the cluster bus too:
# it exports IDEM_REDIS_TLS_CLUSTER_URLS (rediss:// URLs), IDEM_REDIS_TLS_URL (a lone
# TLS-only, client-certificate-only redis-server), IDEM_REDIS_TLS_CA (the CA that signed the
# servers' and the client's certificates), IDEM_REDIS_TLS_OTHER_CA (a CA that signed nothing
# here), and IDEM_REDIS_TLS_CLIENT_CERT / IDEM_REDIS_TLS_CLIENT_KEY (a client certificate the
# servers accept). The CA is never put in the system's trust store: a test must name it.
#
# A primary and its replica (two plain redis-servers, the replica started with `--replicaof`
# the primary, no persistence: they exist to be failed over) for the failover test, which
# stalls the replica (SIGSTOP), kills the primary and promotes the replica: nothing else may
# use them. Exported once the replica reports `master_link_status:up`: IDEM_REDIS_PRIMARY_URL,
# IDEM_REDIS_REPLICA_URL, and IDEM_REDIS_PRIMARY_PID / IDEM_REDIS_REPLICA_PID (the servers'
# pids, to signal).
#
# Knobs (environment):
#   IDEM_SERVICES=0      start nothing (the backend tests then skip, saying why; otherwise
#                        .ci/run sets IDEM_REQUIRE_BACKENDS=1 and a skip is a failure)
#   IDEM_NO_INSTALL=1    never apt-get install; a missing service is not started (and the
#                        backend tests then fail under .ci/run)

IDEM_SVC_DIR=""
IDEM_REDIS_PID=""
IDEM_REDIS_CLUSTER_PIDS=""
IDEM_REDIS_TLS_PIDS=""
IDEM_REDIS_TLS_PID=""
IDEM_REDIS_PAIR_PIDS=""
IDEM_PG_DATA=""
IDEM_PG_BIN=""
IDEM_PG_USER=""
IDEM_PG_TLS_DATA=""

idem_log() { echo "[services] $*" >&2; }

# A TCP port on 127.0.0.1 that nothing listens on (checked by connecting to it).
idem_free_port() {
    local port tries=0
    while [ $tries -lt 200 ]; do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
        tries=$((tries + 1))
    done
    return 1
}

# The directory holding PostgreSQL 15's initdb/pg_ctl, preferring Debian's layout.
idem_find_pg_bin() {
    local d
    for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

idem_install_missing() {
    local need=()
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    idem_find_pg_bin >/dev/null || need+=(postgresql-15)
    command -v openssl >/dev/null 2>&1 || need+=(openssl)
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "${IDEM_NO_INSTALL:-0}" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        idem_log "not installing ${need[*]} (IDEM_NO_INSTALL, not root, or no apt-get)"
        return 0
    fi
    idem_log "installing ${need[*]} from the Debian archive"
    # Package scripts must not start system-wide services: we start our own.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
    fi
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    local rc=$?
    [ $created_policy = 1 ] && rm -f "$policy"
    return $rc
}

idem_start_redis() {
    if ! command -v redis-server >/dev/null 2>&1; then
        idem_log "redis-server not found: the Redis tests will skip"
        return 0
    fi
    local port dir
    port=$(idem_free_port) || { idem_log "no free port for Redis"; return 1; }
    dir="$IDEM_SVC_DIR/redis"
    mkdir -p "$dir"
    # Durable like production should be: AOF, fsync on every write.
    redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --daemonize no \
        --dir "$dir" --save '' --appendonly yes --appendfsync always \
        --logfile "$dir/redis.log" &
    IDEM_REDIS_PID=$!
    local i
    for i in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            export IDEM_REDIS_URL="redis://127.0.0.1:$port/"
            idem_log "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port (pid $IDEM_REDIS_PID)"
            return 0
        fi
        kill -0 "$IDEM_REDIS_PID" 2>/dev/null || break
        sleep 0.1
    done
    idem_log "redis-server did not start; log:"
    cat "$dir/redis.log" >&2 || true
    return 1
}

# A port for a cluster node: free, its cluster bus port (port + 10000) free too, and not one
# of the ports given as arguments (chosen already but maybe not listening yet).
idem_free_cluster_port() {
    local port tries=0 taken
    while [ $tries -lt 200 ]; do
        tries=$((tries + 1))
        port=$((20000 + RANDOM % 35000))
        for taken in "$@"; do
            [ "$taken" = "$port" ] || [ "$taken" = $((port + 10000)) ] \
                || [ $((taken + 10000)) = "$port" ] && continue 2
        done
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null && continue
        echo "$port"
        return 0
    done
    return 1
}

# Three cluster-enabled redis-servers joined into one cluster (see the top of this file).
# $1: `plain`, or `tls` for the TLS-only cluster (its certificates made beforehand in
# $IDEM_SVC_DIR/redis-tls-certs by idem_start_redis_tls).
idem_start_redis_cluster() {
    local kind=${1:-plain}
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        idem_log "redis-server or redis-cli not found: the Redis Cluster tests will skip"
        return 0
    fi
    # A port checked free can be taken by someone else before the server binds it (other
    # runs share this machine): a node that does not come up means a fresh try on new ports.
    local try
    for try in 1 2 3; do
        idem_try_redis_cluster "$kind" "$try" && return 0
        idem_stop_redis_cluster "$kind"
    done
    idem_log "the Redis Cluster ($kind) did not start in 3 tries"
    return 1
}

# Stops the nodes of one cluster ($1: plain or tls).
idem_stop_redis_cluster() {
    local pid pids
    if [ "$1" = tls ]; then pids=$IDEM_REDIS_TLS_PIDS; else pids=$IDEM_REDIS_CLUSTER_PIDS; fi
    for pid in $pids; do
        kill "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
    done
    if [ "$1" = tls ]; then IDEM_REDIS_TLS_PIDS=""; else IDEM_REDIS_CLUSTER_PIDS=""; fi
}

# What redis-server and redis-cli need to serve and speak TLS with client certificates
# required, from the certificates in $1.
idem_redis_tls_args() {
    local c=$1
    IDEM_REDIS_TLS_SERVER_ARGS=(--tls-cert-file "$c/server.pem" --tls-key-file "$c/server.key"
        --tls-ca-cert-file "$c/ca.pem" --tls-auth-clients yes)
    IDEM_REDIS_TLS_CLI_ARGS=(--tls --cacert "$c/ca.pem" --cert "$c/client.pem"
        --key "$c/client.key")
}

# One try at idem_start_redis_cluster, in directories of its own ($1: plain or tls; $2
# numbers the try).
idem_try_redis_cluster() {
    local kind=$1 ports=() addrs=() urls=() port dir i n up
    local serve=() cli=() scheme=redis
    if [ "$kind" = tls ]; then
        idem_redis_tls_args "$IDEM_SVC_DIR/redis-tls-certs"
        serve=("${IDEM_REDIS_TLS_SERVER_ARGS[@]}" --tls-cluster yes)
        cli=("${IDEM_REDIS_TLS_CLI_ARGS[@]}")
        scheme=rediss
    fi
    for n in 1 2 3; do
        port=$(idem_free_cluster_port "${ports[@]}") || {
            idem_log "no free port for Redis Cluster"
            return 1
        }
        dir="$IDEM_SVC_DIR/redis-cluster-$kind-$2-$n"
        mkdir -p "$dir"
        if [ "$kind" = tls ]; then
            # TLS or nothing: no clear-text port at all, and TLS on the cluster bus too.
            redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" --protected-mode yes \
                --daemonize no --dir "$dir" --save '' --appendonly no "${serve[@]}" \
                --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
                --cluster-node-timeout 5000 --logfile "$dir/redis.log" &
            IDEM_REDIS_TLS_PIDS="$IDEM_REDIS_TLS_PIDS $!"
        else
            redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --daemonize no \
                --dir "$dir" --save '' --appendonly yes --appendfsync always \
                --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
                --cluster-node-timeout 5000 --logfile "$dir/redis.log" &
            IDEM_REDIS_CLUSTER_PIDS="$IDEM_REDIS_CLUSTER_PIDS $!"
        fi
        ports+=("$port")
        addrs+=("127.0.0.1:$port")
        urls+=("$scheme://127.0.0.1:$port/")
    done
    n=0
    for port in "${ports[@]}"; do
        n=$((n + 1))
        up=0
        for i in $(seq 1 300); do
            redis-cli "${cli[@]}" -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG \
                && { up=1; break; }
            sleep 0.1
        done
        if [ $up != 1 ]; then
            idem_log "Redis Cluster ($kind) node on port $port did not come up; log:"
            tail -5 "$IDEM_SVC_DIR/redis-cluster-$kind-$2-$n/redis.log" >&2 || true
            return 1
        fi
    done
    if ! redis-cli "${cli[@]}" --cluster create "${addrs[@]}" --cluster-replicas 0 \
        --cluster-yes >"$IDEM_SVC_DIR/redis-cluster-create-$kind-$2.log" 2>&1; then
        idem_log "redis-cli --cluster create ($kind) failed; log:"
        cat "$IDEM_SVC_DIR/redis-cluster-create-$kind-$2.log" >&2
        return 1
    fi
    local ok=0
    for i in $(seq 1 300); do
        ok=1
        for port in "${ports[@]}"; do
            redis-cli "${cli[@]}" -h 127.0.0.1 -p "$port" cluster info 2>/dev/null \
                | grep -q '^cluster_state:ok' || ok=0
        done
        [ $ok = 1 ] && break
        sleep 0.1
    done
    if [ $ok != 1 ]; then
        idem_log "the Redis Cluster ($kind) did not reach cluster_state:ok"
        return 1
    fi
    if [ "$kind" = tls ]; then
        export IDEM_REDIS_TLS_CLUSTER_URLS
        IDEM_REDIS_TLS_CLUSTER_URLS=$(IFS=,; echo "${urls[*]}")
        idem_log "Redis Cluster of 3 TLS-only masters on ${addrs[*]} (pids$IDEM_REDIS_TLS_PIDS)"
    else
        export IDEM_REDIS_CLUSTER_URLS
        IDEM_REDIS_CLUSTER_URLS=$(IFS=,; echo "${urls[*]}")
        idem_log "Redis Cluster of 3 masters on ${addrs[*]} (pids$IDEM_REDIS_CLUSTER_PIDS)"
    fi
}

# The TLS-only Redis services (see the top of this file): certificates, one lone server
# and a cluster of three, all requiring a client certificate.
idem_start_redis_tls() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
        idem_log "redis-server or openssl not found: the Redis TLS tests will skip"
        return 0
    fi
    local certs="$IDEM_SVC_DIR/redis-tls-certs" port dir i
    mkdir -p "$certs"
    chmod 700 "$certs"
    idem_make_certificates "$certs" || {
        idem_log "making the Redis TLS certificates failed; log:"
        cat "$certs/openssl.log" >&2
        return 1
    }
    idem_redis_tls_args "$certs"
    # A port checked free can still be taken when the server binds it (another run, or an
    # outgoing connection's local port): a server that does not come up gets new ports.
    local try up=0
    for try in 1 2 3; do
        port=$(idem_free_port) || { idem_log "no free port for Redis (TLS)"; return 1; }
        dir="$IDEM_SVC_DIR/redis-tls-$try"
        mkdir -p "$dir"
        redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" --protected-mode yes \
            --daemonize no --dir "$dir" --save '' --appendonly no \
            "${IDEM_REDIS_TLS_SERVER_ARGS[@]}" --logfile "$dir/redis.log" &
        IDEM_REDIS_TLS_PID=$!
        for i in $(seq 1 300); do
            redis-cli "${IDEM_REDIS_TLS_CLI_ARGS[@]}" -h 127.0.0.1 -p "$port" ping 2>/dev/null \
                | grep -q PONG && { up=1; break; }
            kill -0 "$IDEM_REDIS_TLS_PID" 2>/dev/null || break
            sleep 0.1
        done
        [ $up = 1 ] && break
        idem_log "redis-server (TLS) did not start on port $port (try $try); log:"
        tail -3 "$dir/redis.log" >&2 || true
        kill "$IDEM_REDIS_TLS_PID" 2>/dev/null && { wait "$IDEM_REDIS_TLS_PID" 2>/dev/null || true; }
        IDEM_REDIS_TLS_PID=""
    done
    if [ $up != 1 ]; then
        idem_log "redis-server (TLS) did not start in 3 tries"
        return 1
    fi
    export IDEM_REDIS_TLS_URL="rediss://127.0.0.1:$port/"
    export IDEM_REDIS_TLS_CA="$certs/ca.pem"
    export IDEM_REDIS_TLS_OTHER_CA="$certs/other-ca.pem"
    export IDEM_REDIS_TLS_CLIENT_CERT="$certs/client.pem"
    export IDEM_REDIS_TLS_CLIENT_KEY="$certs/client.key"
    idem_log "redis-server with TLS only (client certificates required) on 127.0.0.1:$port"
    idem_start_redis_cluster tls
}

# The primary and replica the failover test fails over (see the top of this file).
idem_start_redis_pair() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        idem_log "redis-server or redis-cli not found: the Redis failover test will skip"
        return 0
    fi
    local try primary replica dir pp rp i up
    for try in 1 2 3; do
        primary=$(idem_free_port) || { idem_log "no free port for the Redis pair"; return 1; }
        replica=$(idem_free_port) || { idem_log "no free port for the Redis pair"; return 1; }
        [ "$primary" = "$replica" ] && continue
        dir="$IDEM_SVC_DIR/redis-pair-$try"
        mkdir -p "$dir/primary" "$dir/replica"
        redis-server --bind 127.0.0.1 --port "$primary" --protected-mode yes --daemonize no \
            --dir "$dir/primary" --save '' --appendonly no --logfile "$dir/primary/redis.log" &
        pp=$!
        redis-server --bind 127.0.0.1 --port "$replica" --protected-mode yes --daemonize no \
            --dir "$dir/replica" --save '' --appendonly no --replicaof 127.0.0.1 "$primary" \
            --logfile "$dir/replica/redis.log" &
        rp=$!
        IDEM_REDIS_PAIR_PIDS="$pp $rp"
        up=0
        for i in $(seq 1 300); do
            redis-cli -h 127.0.0.1 -p "$replica" info replication 2>/dev/null \
                | grep -q '^master_link_status:up' && { up=1; break; }
            kill -0 "$pp" 2>/dev/null && kill -0 "$rp" 2>/dev/null || break
            sleep 0.1
        done
        if [ $up = 1 ]; then
            export IDEM_REDIS_PRIMARY_URL="redis://127.0.0.1:$primary/"
            export IDEM_REDIS_REPLICA_URL="redis://127.0.0.1:$replica/"
            export IDEM_REDIS_PRIMARY_PID=$pp IDEM_REDIS_REPLICA_PID=$rp
            idem_log "Redis primary on 127.0.0.1:$primary (pid $pp), its replica on 127.0.0.1:$replica (pid $rp)"
            return 0
        fi
        idem_log "the Redis pair did not come up on ports $primary/$replica (try $try)"
        idem_stop_redis_pair
    done
    return 1
}

# Stops the pair (either may be stopped with SIGSTOP, or dead already).
idem_stop_redis_pair() {
    local pid
    for pid in $IDEM_REDIS_PAIR_PIDS; do
        kill -CONT "$pid" 2>/dev/null
        kill "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
    done
    IDEM_REDIS_PAIR_PIDS=""
}

# Runs a command as the unprivileged cluster owner (PostgreSQL refuses to run as root).
idem_as_pg_user() {
    if [ -n "$IDEM_PG_USER" ]; then
        runuser -u "$IDEM_PG_USER" -- "$@"
    else
        "$@"
    fi
}

idem_start_postgres() {
    IDEM_PG_BIN=$(idem_find_pg_bin) || {
        idem_log "PostgreSQL not found: the Postgres tests will skip"
        return 0
    }
    local port dir
    port=$(idem_free_port) || { idem_log "no free port for PostgreSQL"; return 1; }
    dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg.XXXXXX")
    if [ "$(id -u)" = 0 ]; then
        IDEM_PG_USER=nobody
        chown "$IDEM_PG_USER" "$dir"
    fi
    IDEM_PG_DATA="$dir/data"
    idem_as_pg_user "$IDEM_PG_BIN/initdb" -D "$IDEM_PG_DATA" -U idem --auth=trust \
        --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1 || {
        idem_log "initdb failed; log:"
        cat "$dir/initdb.log" >&2
        return 1
    }
    # Sockets in the private directory only; TCP on loopback only.
    idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$IDEM_PG_DATA" -l "$dir/postgres.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null || {
        idem_log "PostgreSQL did not start; log:"
        cat "$dir/postgres.log" >&2
        return 1
    }
    export IDEM_POSTGRES_URL="postgres://idem@127.0.0.1:$port/postgres"
    idem_log "PostgreSQL $("$IDEM_PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data $IDEM_PG_DATA)"
}

# A CA, a server certificate for 127.0.0.1 and a client certificate signed by it, plus a
# second CA that signed nothing (for the "wrong CA" case), all in $1. Keys are created 0600.
idem_make_certificates() {
    local dir=$1
    (
        umask 077
        cd "$dir" || exit 1
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.pem \
            -subj "/CN=idem test CA" &&
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout other-ca.key \
            -out other-ca.pem -subj "/CN=idem other CA" &&
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
            -subj "/CN=127.0.0.1" &&
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >ext.cnf &&
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -out server.pem -extfile ext.cnf &&
        openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr \
            -subj "/CN=idem test client" &&
        printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >client-ext.cnf &&
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -out client.pem -extfile client-ext.cnf
    ) >"$dir/openssl.log" 2>&1
}

# The TLS-only cluster (see the top of this file).
idem_start_postgres_tls() {
    [ -n "$IDEM_PG_BIN" ] || return 0
    if ! command -v openssl >/dev/null 2>&1; then
        idem_log "openssl not found: the Postgres TLS test will skip"
        return 0
    fi
    local port dir
    port=$(idem_free_port) || { idem_log "no free port for PostgreSQL (TLS)"; return 1; }
    dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg-tls.XXXXXX")
    chmod 700 "$dir"
    mkdir -p "$dir/certs"
    idem_make_certificates "$dir/certs" || {
        idem_log "making the TLS certificates failed; log:"
        cat "$dir/certs/openssl.log" >&2
        return 1
    }
    # The server reads its key as the cluster owner, and refuses a key others can read.
    cp "$dir/certs/server.pem" "$dir/certs/server.key" "$dir/certs/ca.pem" "$dir/"
    chmod 600 "$dir/server.key" "$dir/server.pem" "$dir/ca.pem"
    if [ "$(id -u)" = 0 ]; then
        chown "$IDEM_PG_USER" "$dir" "$dir/server.key" "$dir/server.pem" "$dir/ca.pem"
    fi
    IDEM_PG_TLS_DATA="$dir/data"
    idem_as_pg_user "$IDEM_PG_BIN/initdb" -D "$IDEM_PG_TLS_DATA" -U idem --auth=trust \
        --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1 || {
        idem_log "initdb (TLS) failed; log:"
        cat "$dir/initdb.log" >&2
        return 1
    }
    # TLS or nothing: a clear-text connection from anywhere is rejected. The database
    # idem_mtls also wants a client certificate signed by the CA.
    printf '%s\n' \
        "local     all       all               trust" \
        "hostnossl all       all 0.0.0.0/0     reject" \
        "hostnossl all       all ::/0          reject" \
        "hostssl   idem_mtls all 127.0.0.1/32  trust clientcert=verify-ca" \
        "hostssl   all       all 127.0.0.1/32  trust" >"$IDEM_PG_TLS_DATA/pg_hba.conf"
    idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$IDEM_PG_TLS_DATA" -l "$dir/postgres.log" -w \
        -t 60 -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=50 -c ssl=on \
        -c ssl_cert_file=$dir/server.pem -c ssl_key_file=$dir/server.key \
        -c ssl_ca_file=$dir/ca.pem" start >/dev/null || {
        idem_log "PostgreSQL (TLS) did not start; log:"
        cat "$dir/postgres.log" >&2
        return 1
    }
    idem_as_pg_user "$IDEM_PG_BIN/createdb" -h "$dir" -p "$port" -U idem idem_mtls || {
        idem_log "createdb idem_mtls (TLS) failed"
        return 1
    }
    export IDEM_POSTGRES_TLS_URL="postgres://idem@127.0.0.1:$port/postgres"
    export IDEM_POSTGRES_TLS_CA="$dir/certs/ca.pem"
    export IDEM_POSTGRES_TLS_OTHER_CA="$dir/certs/other-ca.pem"
    export IDEM_POSTGRES_TLS_MTLS_URL="postgres://idem@127.0.0.1:$port/idem_mtls"
    export IDEM_POSTGRES_TLS_CLIENT_CERT="$dir/certs/client.pem"
    export IDEM_POSTGRES_TLS_CLIENT_KEY="$dir/certs/client.key"
    idem_log "PostgreSQL with TLS only on 127.0.0.1:$port (CA $IDEM_POSTGRES_TLS_CA)"
}

idem_services_stop() {
    # Runs as the EXIT trap, under the caller's `set -e`: a server that a test killed (the
    # failover test kills the Redis primary) makes `wait` report its signal, and that must
    # neither stop the cleanup half-way nor turn a passing run into a failing one.
    local -
    set +e
    if [ -n "$IDEM_REDIS_PID" ]; then
        kill "$IDEM_REDIS_PID" 2>/dev/null && { wait "$IDEM_REDIS_PID" 2>/dev/null || true; }
        IDEM_REDIS_PID=""
    fi
    idem_stop_redis_cluster plain
    idem_stop_redis_cluster tls
    idem_stop_redis_pair
    if [ -n "$IDEM_REDIS_TLS_PID" ]; then
        kill "$IDEM_REDIS_TLS_PID" 2>/dev/null && { wait "$IDEM_REDIS_TLS_PID" 2>/dev/null || true; }
        IDEM_REDIS_TLS_PID=""
    fi
    if [ -n "$IDEM_PG_DATA" ] && [ -f "$IDEM_PG_DATA/postmaster.pid" ]; then
        idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$IDEM_PG_DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "$IDEM_PG_DATA" ]; then
        rm -rf "$(dirname "$IDEM_PG_DATA")"
        IDEM_PG_DATA=""
    fi
    if [ -n "$IDEM_PG_TLS_DATA" ] && [ -f "$IDEM_PG_TLS_DATA/postmaster.pid" ]; then
        idem_as_pg_user "$IDEM_PG_BIN/pg_ctl" -D "$IDEM_PG_TLS_DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "$IDEM_PG_TLS_DATA" ]; then
        rm -rf "$(dirname "$IDEM_PG_TLS_DATA")"
        IDEM_PG_TLS_DATA=""
    fi
    if [ -n "$IDEM_SVC_DIR" ]; then
        rm -rf "$IDEM_SVC_DIR"
        IDEM_SVC_DIR=""
    fi
}

idem_services_start() {
    if [ "${IDEM_SERVICES:-1}" = 0 ]; then
        idem_log "IDEM_SERVICES=0: not starting Redis or PostgreSQL"
        return 0
    fi
    trap idem_services_stop EXIT
    # A signal must still run the EXIT trap, so the servers never outlive the run.
    trap 'exit 130' INT
    trap 'exit 143' TERM
    IDEM_SVC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-services.XXXXXX")
    idem_install_missing || idem_log "installing services failed; continuing with what is there"
    idem_start_redis
    idem_start_redis_cluster plain
    idem_start_redis_pair
    idem_start_redis_tls
    idem_start_postgres
    idem_start_postgres_tls
}
