#!/usr/bin/env bash
# Reproduces the per-mode tables of RELIABILITY.md: each fault mode alone (the model's
# reactions paired with the fault that provokes them), N simulated calls each.
# Usage: idem-sim/figures.sh [calls-per-mode] [memory|redis|postgres]
#   memory (default): every mode over MemoryStore, `store-reopen` over SQLite.
#   redis, postgres: every mode over that store (`store-reopen` is a reconnect); needs the
#   server in IDEM_REDIS_URL / IDEM_POSTGRES_URL (`source .ci/services.sh &&
#   idem_services_start`).
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-50000}"
base="${2:-memory}"
features=()
case "$base" in
    memory) ;;
    redis | postgres) features=(--features redis,postgres) ;;
    *) echo "unknown store $base (memory, redis or postgres)" >&2; exit 2 ;;
esac
cargo build -q -p idem-sim --release "${features[@]}"
bin="${CARGO_TARGET_DIR:-target}/release/idem-sim"
modes=(
    lost-ack late-commit late-tail 5xx-before-commit 5xx-after-commit transient-503-429
    redelivery partial-batch store-error-before store-error-after store-latency
    sqlite:store-reopen worker-kill clock-skew worker-stall model-reissue model-changed-params
    model-concurrent-dups worker-kill,model-resume-crashed
    5xx-before-commit,model-call-after-unknown late-tail,model-call-after-unknown
)
for m in "${modes[@]}"; do
    store=$base
    if [[ $m == sqlite:* ]]; then
        m=${m#sqlite:}
        if [[ $base == memory ]]; then store=sqlite; fi
    fi
    last=${m##*,}
    out=$("$bin" --store "$store" --seed 1 --calls "$calls" --faults "$m" 2>&1 || true)
    echo "$out" | grep -E "^\| $last \|" | sed "s/^| $last |/| $m ($store) |/"
    echo "$out" | grep -o "seeds with violations: [0-9]* ([0-9]* violations)" | grep -v ": 0 " || true
done
