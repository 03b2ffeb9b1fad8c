#!/usr/bin/env bash
# Reproduces the per-mode table of RELIABILITY.md: each fault mode alone (the model's
# reactions paired with the fault that provokes them), 50,000 simulated calls each.
# Usage: idem-sim/figures.sh [calls-per-mode]
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-50000}"
cargo build -q -p idem-sim --release
bin="${CARGO_TARGET_DIR:-target}/release/idem-sim"
modes=(
    lost-ack late-commit late-tail 5xx-before-commit 5xx-after-commit transient-503-429
    redelivery partial-batch store-error-before store-error-after store-latency
    sqlite:store-reopen worker-kill clock-skew worker-stall model-reissue model-changed-params
    model-concurrent-dups worker-kill,model-resume-crashed
    5xx-before-commit,model-call-after-unknown late-tail,model-call-after-unknown
)
for m in "${modes[@]}"; do
    store=memory
    if [[ $m == sqlite:* ]]; then store=sqlite; m=${m#sqlite:}; fi
    last=${m##*,}
    out=$("$bin" --store "$store" --seed 1 --calls "$calls" --faults "$m" 2>&1 || true)
    echo "$out" | grep -E "^\| $last \|" | sed "s/^| $last |/| $m ($store) |/"
    echo "$out" | grep -o "seeds with violations: [0-9]* ([0-9]* violations)" | grep -v ": 0 " || true
done
