#!/usr/bin/env bash
# Compile time of idem against the bare crates of its ecosystem, side by side in one sitting.
#
# Makes fixture crates in a temp dir, each a one-tool binary with the dependencies it names:
#
#   bare       serde (derive) + serde_json + schemars + tokio (rt, macros), a hand-written tool
#   idem       idem-rs, default features, one #[tool(write)]
#   rmcp       rmcp (server, macros, transport-io), one #[tool], served over stdio
#   rmcp-http  the same plus transport-streamable-http-server (the transports of idem's `mcp`)
#   idem-mcp   idem-rs with `mcp`, the same tool served over stdio
#
# and times a clean debug build of each in a fresh target dir (`cargo build --timings`, the
# reports kept under $OUT), RUNS times, interleaved. Then the 100-tool pair: 100 `#[tool]` fns
# vs the same 100 tools as hand-written trait impls (same args types, bodies and registry),
# their dependencies built once: a clean build of the crate alone, and a rebuild after a
# one-line edit of one tool's body (incremental, as `cargo build` does by default).
#
# Prints wall and CPU (user+sys) seconds, medians over RUNS, the crates compiled, and the
# ratios against the targets. Fetches from crates.io once (cargo fetch), then builds offline.
#
#   scripts/compile_time.sh                 # RUNS=2 N=100; FIXTURES="bare idem" to pick
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-100}"
RUNS="${RUNS:-2}"
FIXTURES="${FIXTURES:-bare idem rmcp rmcp-http idem-mcp tools}"
OUT="${OUT:-$ROOT/target/compile-time}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
# The repository's toolchain (rust-toolchain.toml, copied into each fixture); users' defaults: incremental debug builds of their own crate, nothing shared between runs.
unset CARGO_INCREMENTAL CARGO_TARGET_DIR RUSTFLAGS
mkdir -p "$OUT"

manifest() { # name, dependency lines
  cat <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$2
TOML
}

IDEM_DEP="idem = { package = \"idem-rs\", path = \"$ROOT\""
SERDE_DEP='serde = { version = "1", features = ["derive"] }
serde_json = "1"
schemars = "1"'
TOKIO_DEP='tokio = { version = "1", features = ["rt", "macros"] }'
RMCP_DEP='rmcp = { version = "3.11", default-features = false, features = ["server", "macros", "transport-io"'

fixture() { # name -> $WORK/$name with Cargo.toml, Cargo.lock and src/main.rs
  local dir="$WORK/$1"
  mkdir -p "$dir/src"
  case "$1" in
    bare)
      manifest fixture-bare "$SERDE_DEP
$TOKIO_DEP" > "$dir/Cargo.toml"
      cat > "$dir/src/main.rs" <<'RS'
use serde::{Deserialize, Serialize};

/// Arguments of `charge`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

/// Charge a card.
async fn charge(args: ChargeArgs) -> Result<String, String> {
    Ok(format!("{}:{}", args.customer, args.cents))
}

/// The tool by hand: its definition, and a call from JSON to JSON.
async fn call(name: &str, args: serde_json::Value) -> serde_json::Value {
    match name {
        "charge" => match serde_json::from_value::<ChargeArgs>(args) {
            Ok(args) => match charge(args).await {
                Ok(out) => serde_json::json!({ "ok": out }),
                Err(e) => serde_json::json!({ "error": e }),
            },
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        },
        _ => serde_json::json!({ "error": "unknown tool" }),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let schema = schemars::schema_for!(ChargeArgs);
    println!("{}", serde_json::json!({ "name": "charge", "parameters": schema }));
    let args = serde_json::json!({ "customer": "cus_1", "cents": 100 });
    println!("{}", call("charge", args).await);
}
RS
      ;;
    idem)
      manifest fixture-idem "$IDEM_DEP }
$SERDE_DEP
$TOKIO_DEP" > "$dir/Cargo.toml"
      cat > "$dir/src/main.rs" <<'RS'
use idem::{tool, Format, Registry, ToolCall, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

/// Arguments of `charge`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

/// Charge a card.
#[tool(write)]
async fn charge(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}:{}", args.customer, args.cents))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    println!("{}", serde_json::to_string(&registry.definitions(Format::OpenAi))?);
    let args = serde_json::json!({ "customer": "cus_1", "cents": 100 });
    println!("{}", registry.call(ToolCall::new("run-1", "charge", args)).await.text());
    Ok(())
}
RS
      ;;
    rmcp | rmcp-http)
      local transports='] }'
      [ "$1" = rmcp-http ] && transports=', "transport-streamable-http-server"] }'
      manifest "fixture-$1" "$RMCP_DEP$transports
$SERDE_DEP
tokio = { version = \"1\", features = [\"rt\", \"macros\", \"io-std\"] }" > "$dir/Cargo.toml"
      cat > "$dir/src/main.rs" <<'RS'
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

/// Arguments of `charge`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

#[derive(Clone)]
struct Billing {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Billing {
    /// Charge a card.
    #[tool(description = "Charge a card.")]
    fn charge(&self, Parameters(args): Parameters<ChargeArgs>) -> String {
        format!("{}:{}", args.customer, args.cents)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Billing {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let billing = Billing { tool_router: Billing::tool_router() };
    billing.serve(rmcp::transport::stdio()).await?.waiting().await?;
    Ok(())
}
RS
      ;;
    idem-mcp)
      manifest fixture-idem-mcp "$IDEM_DEP, features = [\"mcp\"] }
$SERDE_DEP
$TOKIO_DEP" > "$dir/Cargo.toml"
      cat > "$dir/src/main.rs" <<'RS'
use idem::mcp::McpServer;
use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

/// Arguments of `charge`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

/// Charge a card.
#[tool(write)]
async fn charge(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}:{}", args.customer, args.cents))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    McpServer::new(registry).single_caller().serve_stdio().await?;
    Ok(())
}
RS
      ;;
  esac
  cp "$ROOT/Cargo.lock" "$dir/Cargo.lock"
  cp "$ROOT/rust-toolchain.toml" "$dir/"
}

# Runs a build; appends "wall cpu crates" to $WORK/$label.times, keeps the timings report.
timed() { # label, dir, cargo args…
  local label="$1" dir="$2"
  shift 2
  (cd "$dir" && /usr/bin/time -f "%e %U %S" -o "$WORK/time" cargo build --offline "$@" 2> "$WORK/log") ||
    { cat "$WORK/log" >&2; exit 1; }
  local crates
  crates=$(grep -c '^ *Compiling ' "$WORK/log" || true)
  read -r wall user sys < "$WORK/time"
  echo "$wall $(echo "$user + $sys" | bc) $crates" >> "$WORK/$label.times"
  if [ -d "$dir/target/cargo-timings" ]; then
    cp "$dir/target/cargo-timings/cargo-timing.html" "$OUT/$label.html" 2>/dev/null || true
  fi
  echo "  $label: $(tail -1 "$WORK/$label.times") (wall s, cpu s, crates)" >&2
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
col() { awk -v c="$2" '{print $c}' "$WORK/$1.times" | median; }

one_tool=()
for f in $FIXTURES; do
  [ "$f" = tools ] && continue
  fixture "$f"
  one_tool+=("$f")
  (cd "$WORK/$f" && cargo fetch --quiet)
done
for run in $(seq 1 "$RUNS"); do
  echo "run $run of $RUNS" >&2
  for f in "${one_tool[@]}"; do
    rm -rf "$WORK/$f/target"
    timed "$f" "$WORK/$f" --timings
  done
done

if [[ " $FIXTURES " == *" tools "* ]]; then
  mkdir -p "$WORK/tools/annotated/src" "$WORK/tools/manual/src"
  cat > "$WORK/tools/Cargo.toml" <<TOML
[workspace]
members = ["annotated", "manual"]
resolver = "2"
TOML
  for crate in annotated manual; do
    manifest "tools-$crate" "$IDEM_DEP }
serde = { version = \"1\", features = [\"derive\"] }
schemars = \"1\"" > "$WORK/tools/$crate/Cargo.toml"
  done
  cp "$ROOT/Cargo.lock" "$WORK/tools/Cargo.lock"
  cp "$ROOT/rust-toolchain.toml" "$WORK/tools/"

  header='use idem::{ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};
'
  # Tool 1's body is the line the edit case changes (`+ 0` to `+ <run>`).
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
    Ok(args.id + ctx.key().as_str().len() as u64 + 0)
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
  } > "$WORK/tools/annotated/src/lib.rs"

  {
    echo "$header"
    echo "use idem::tool::{ReadTool, ToolSpec, WriteTool};"
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
        Ok(args.id + ctx.key().as_str().len() as u64 + 0)
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
  } > "$WORK/tools/manual/src/lib.rs"

  echo "100 tools: building dependencies once…" >&2
  (cd "$WORK/tools" && cargo fetch --quiet && cargo build --offline --quiet --workspace)
  for run in $(seq 1 "$RUNS"); do
    for crate in annotated manual; do
      (cd "$WORK/tools" && cargo clean --offline --quiet -p "tools-$crate")
      timed "tools-$crate-clean" "$WORK/tools" -p "tools-$crate"
      sed -i -E "0,/ \\+ [0-9]+\\)$/s/ \\+ [0-9]+\\)$/ + $run)/" "$WORK/tools/$crate/src/lib.rs"
      timed "tools-$crate-edit" "$WORK/tools" -p "tools-$crate"
    done
  done
fi

row() { # label, description
  [ -f "$WORK/$1.times" ] || return 0
  printf '| %-22s | %7.1f | %7.1f | %6s | %s\n' "$1" "$(col "$1" 1)" "$(col "$1" 2)" "$(col "$1" 3)" "$2"
}
ratio() { # label, numerator, denominator, target
  [ -f "$WORK/$2.times" ] && [ -f "$WORK/$3.times" ] || return 0
  local w c
  w=$(echo "$(col "$2" 1) / $(col "$3" 1)" | bc -l)
  c=$(echo "$(col "$2" 2) / $(col "$3" 2)" | bc -l)
  printf '%-34s wall %.2f×  cpu %.2f×  (target ≤ %s×)\n' "$1" "$w" "$c" "$4"
}

echo
printf 'clean debug builds, median of %d, %s, %d cores, load %s\n' "$RUNS" "$(cd "$ROOT" && rustc --version)" \
  "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-22s | %7s | %7s | %6s |\n' fixture "wall s" "cpu s" crates
row bare "serde + serde_json + schemars + tokio, a hand-written tool"
row idem "idem-rs default, one #[tool(write)]"
row rmcp "rmcp server + macros + transport-io, one #[tool]"
row rmcp-http "rmcp with transport-streamable-http-server too"
row idem-mcp "idem-rs with mcp, served over stdio"
row tools-annotated-clean "$N #[tool] fns, the crate alone"
row tools-manual-clean "$N hand-written tools, the crate alone"
row tools-annotated-edit "$N #[tool] fns, one-line edit"
row tools-manual-edit "$N hand-written tools, one-line edit"
echo
ratio "idem default / bare" idem bare 1.6
ratio "idem mcp / rmcp same transports" idem-mcp rmcp-http 1.15
ratio "$N tools clean, #[tool] / by hand" tools-annotated-clean tools-manual-clean 1.2
ratio "$N tools edit, #[tool] / by hand" tools-annotated-edit tools-manual-edit 1.2
echo "timings reports: $OUT/*.html"
