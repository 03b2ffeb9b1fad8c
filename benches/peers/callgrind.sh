#!/usr/bin/env bash
# Instructions per call of each peers case under callgrind: every case is run twice (LO and
# HI calls, untimed) and the difference in instructions is divided by HI - LO, so setup
# (stores, priming) cancels. Building a batch's inputs (run ids, the `ToolCall`s, keys) still
# counts; `Registry::call`'s own inclusive share is printed for the idem cases.
#
#   benches/peers/callgrind.sh [CASE…]        # default: the floors, idem and idempotent cases
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/tmp-peers-target}
cargo build --release --manifest-path "$here/Cargo.toml" --bin peers >&2
bin="$CARGO_TARGET_DIR/release/peers"
out=${CG_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/idem-peers-cg.XXXXXX")}
LO=${LO:-2000}
HI=${HI:-12000}
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(value_floor text_floor idempotent_fresh idempotent_replay
    idem_text_fresh idem_text_replay idem_value_fresh idem_value_replay)
total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
inclusive() { # inclusive Ir of Registry::call's future
    callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
        awk '/Registry::call::\{\{closure\}\}/ {gsub(",", "", $1); print $1; exit}'
}
printf '| case | instructions/call | of which inside `Registry::call` |\n|---|---|---|\n'
for c in "${cases[@]}"; do
    for n in "$LO" "$HI"; do
        valgrind --tool=callgrind --callgrind-out-file="$out/$c.$n.out" "$bin" profile "$c" "$n" \
            >/dev/null 2>&1
    done
    lo=$(total "$out/$c.$LO.out"); hi=$(total "$out/$c.$HI.out")
    per=$(( (hi - lo) / (HI - LO) ))
    ilo=$(inclusive "$out/$c.$LO.out"); ihi=$(inclusive "$out/$c.$HI.out")
    if [ -n "$ilo" ] && [ -n "$ihi" ]; then inner=$(( (ihi - ilo) / (HI - LO) )); else inner="—"; fi
    printf '| %s | %s | %s |\n' "$c" "$per" "$inner"
done
echo "callgrind files: $out" >&2
