#!/usr/bin/env bash
# Build time of 100 `#[tool]` fns vs the same 100 tools as hand-written trait impls.
#
# Generates two crates in a temp dir (same args types, same bodies, same registry), builds
# their dependencies once, then times clean debug builds of each crate alone, interleaved,
# RUNS times (default 3), and prints the medians.
#
#   scripts/compile_time.sh            # RUNS=5 N=200 scripts/compile_time.sh to vary
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-100}"
RUNS="${RUNS:-3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="$WORK/target"

mkdir -p "$WORK/annotated/src" "$WORK/manual/src"
cat > "$WORK/Cargo.toml" <<TOML
[workspace]
members = ["annotated", "manual"]
resolver = "2"
TOML
for crate in annotated manual; do
  cat > "$WORK/$crate/Cargo.toml" <<TOML
[package]
name = "tools-$crate"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
idem = { path = "$ROOT" }
serde = { version = "1", features = ["derive"] }
schemars = "1"
TOML
done
cp "$ROOT/Cargo.lock" "$WORK/Cargo.lock"

header='use idem::{ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};
'
{
  echo "$header"
  echo "use idem::tool;"
  for i in $(seq 1 "$N"); do
    cat <<RS
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct Args$i { pub id: u64, pub note: String }
RS
    if (( i % 2 )); then
      cat <<RS
/// Tool $i.
#[tool(write, key(id), timeout = "10s")]
pub async fn tool_$i(ctx: WriteCtx, args: Args$i) -> Result<u64, ToolError> {
    Ok(args.id + ctx.key().as_str().len() as u64)
}
RS
    else
      cat <<RS
/// Tool $i.
#[tool(read)]
pub async fn tool_$i(ctx: ReadCtx, args: Args$i) -> Result<u64, ToolError> {
    Ok(args.id + ctx.attempt() as u64)
}
RS
    fi
  done
  echo "pub fn registry() -> Registry {"
  echo "    Registry::builder()"
  for i in $(seq 1 "$N"); do echo "        .tool(tool_$i)"; done
  echo "        .build()"
  echo "        .expect(\"valid\")"
  echo "}"
} > "$WORK/annotated/src/lib.rs"

{
  echo "$header"
  echo "use idem::{ReadTool, ToolSpec, WriteTool};"
  for i in $(seq 1 "$N"); do
    cat <<RS
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct Args$i { pub id: u64, pub note: String }
/// Tool $i.
pub struct Tool$i;
RS
    if (( i % 2 )); then
      cat <<RS
impl WriteTool for Tool$i {
    type Args = Args$i;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("tool_$i")
            .description("Tool $i.")
            .timeout(std::time::Duration::from_secs(10))
            .key_fields(["id"])
    }
    async fn call(&self, ctx: WriteCtx, args: Args$i) -> Result<u64, ToolError> {
        Ok(args.id + ctx.key().as_str().len() as u64)
    }
}
RS
    else
      cat <<RS
impl ReadTool for Tool$i {
    type Args = Args$i;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("tool_$i").description("Tool $i.")
    }
    async fn call(&self, ctx: ReadCtx, args: Args$i) -> Result<u64, ToolError> {
        Ok(args.id + ctx.attempt() as u64)
    }
}
RS
    fi
  done
  echo "pub fn registry() -> Registry {"
  echo "    Registry::builder()"
  for i in $(seq 1 "$N"); do echo "        .tool(Tool$i)"; done
  echo "        .build()"
  echo "        .expect(\"valid\")"
  echo "}"
} > "$WORK/manual/src/lib.rs"

cd "$WORK"
echo "building dependencies once…" >&2
cargo build --offline --quiet --workspace

time_build() {
  cargo clean --offline --quiet -p "tools-$1"
  local start end
  start=$(date +%s.%N)
  cargo build --offline --quiet -p "tools-$1"
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

annotated=() manual=()
for run in $(seq 1 "$RUNS"); do
  annotated+=("$(time_build annotated)")
  manual+=("$(time_build manual)")
  echo "run $run: #[tool] ${annotated[-1]}s, hand-written ${manual[-1]}s" >&2
done
a=$(median "${annotated[@]}")
m=$(median "${manual[@]}")
printf '%d tools, clean debug build of the crate alone, median of %d:\n' "$N" "$RUNS"
printf '  #[tool]       %.2f s\n' "$a"
printf '  hand-written  %.2f s\n' "$m"
printf '  ratio         %.2f\n' "$(echo "$a / $m" | bc -l)"
