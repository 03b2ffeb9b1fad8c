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
# and, each against the bare crate of its own ecosystem (the bare fixture's crates plus that
# crate, the tool by hand on it):
#
#   idem-openai        idem-rs with `openai` + `anthropic`: a Chat Completions and a Messages
#                      turn answered (against `bare`: these providers are serde_json by hand)
#   async-openai       async-openai's type features (idem's), a chat turn answered by hand
#   idem-async-openai  idem-rs with `async-openai`, the same turn
#   rig                rig-core + rig-agent (no default features, as idem's), a DynamicTool
#   idem-rig           idem-rs with `rig`, the registry as rig tools
#   rusqlite           rusqlite (bundled), the tool writes its row by hand
#   idem-sqlite        idem-rs with `sqlite`, the tool on a SqliteStore
#   redis              redis (idem's features), the tool claims with SET NX by hand
#   idem-redis         idem-rs with `redis`, the tool on a RedisStore
#   tokio-postgres     tokio-postgres, the tool inserts its row by hand
#   idem-postgres      idem-rs with `postgres`, the tool on a PostgresStore
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
#   FIXTURES="bare ecosystems" scripts/compile_time.sh   # the ecosystem pairs (and bare)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-100}"
RUNS="${RUNS:-2}"
ECOSYSTEMS="idem-openai async-openai idem-async-openai rig idem-rig rusqlite idem-sqlite redis idem-redis tokio-postgres idem-postgres"
FIXTURES="${FIXTURES:-bare idem rmcp rmcp-http idem-mcp ecosystems tools}"
FIXTURES="${FIXTURES//ecosystems/$ECOSYSTEMS}"
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
BARE_DEPS="$SERDE_DEP
$TOKIO_DEP"
RMCP_DEP='rmcp = { version = "3.11", default-features = false, features = ["server", "macros", "transport-io"'

# The one tool every fixture has: its arguments, and the tool as idem's or by hand.
ARGS_RS='use serde::{Deserialize, Serialize};

/// Arguments of `charge`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer.
    customer: String,
    /// Amount in cents.
    cents: u64,
}
'
CHARGE_RS='/// Charge a card.
#[tool(write)]
async fn charge(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}:{}", args.customer, args.cents))
}
'
IDEM_TOOL_RS="use idem::{tool, Registry, ToolError, WriteCtx};

$CHARGE_RS"
# The by-hand tool of an ecosystem fixture: `claim` is its guard on that crate (a row, a key).
HAND_CHARGE_RS='/// Charge a card.
async fn charge(args: ChargeArgs) -> Result<String, String> {
    Ok(format!("{}:{}", args.customer, args.cents))
}
'
CALL_RS='async fn call(name: &str, args: serde_json::Value) -> serde_json::Value {
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
'
DEFINITION_RS='/// The tool by hand: its definition, and a call from JSON to JSON.
fn definition() -> serde_json::Value {
    serde_json::json!({ "name": "charge", "parameters": schemars::schema_for!(ChargeArgs) })
}
'
BARE_TOOL_RS="$HAND_CHARGE_RS
$DEFINITION_RS
$CALL_RS"
# Where the fixtures would find their servers; they are built, never run.
DB_RS='const DB: &str = "/tmp/fixture.sqlite3";
'
REDIS_RS='const REDIS: &str = "redis://127.0.0.1/";
'
POSTGRES_RS='const POSTGRES: &str = "postgres://postgres@127.0.0.1/postgres";
'

# A fixture's Cargo.toml and src/main.rs, in the `$dir` of `fixture` (its only caller):
# main.rs is the shared pieces, when given, a blank line, then the fixture's own code.
crate_files() { # package name, dependency lines, [shared pieces]; own code on stdin
  manifest "$1" "$2" > "$dir/Cargo.toml"
  { if [ $# -ge 3 ]; then echo "$3"; fi; cat; } > "$dir/src/main.rs"
}

fixture() { # name -> $WORK/$name with Cargo.toml, Cargo.lock and src/main.rs
  local dir="$WORK/$1"
  mkdir -p "$dir/src"
  case "$1" in
    bare)
      crate_files fixture-bare "$BARE_DEPS" "$ARGS_RS
$HAND_CHARGE_RS
/// The tool by hand: its definition, and a call from JSON to JSON.
$CALL_RS" <<'RS'
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
      crate_files fixture-idem "$IDEM_DEP }
$BARE_DEPS" "use idem::{tool, Format, Registry, ToolCall, ToolError, WriteCtx};
$ARGS_RS
$CHARGE_RS" <<'RS'
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
      crate_files "fixture-$1" "$RMCP_DEP$transports
$SERDE_DEP
tokio = { version = \"1\", features = [\"rt\", \"macros\", \"io-std\"] }" "use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
$ARGS_RS" <<'RS'
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
      crate_files fixture-idem-mcp "$IDEM_DEP, features = [\"mcp\"] }
$BARE_DEPS" "use idem::mcp::McpServer;
use idem::{tool, Registry, ToolError, WriteCtx};
$ARGS_RS
$CHARGE_RS" <<'RS'
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    McpServer::new(registry).single_caller().serve_stdio().await?;
    Ok(())
}
RS
      ;;
    idem-openai)
      crate_files fixture-idem-openai "$IDEM_DEP, features = [\"openai\", \"anthropic\"] }
$BARE_DEPS" "$ARGS_RS$IDEM_TOOL_RS" <<'RS'
use idem::providers::{anthropic, openai};
use idem::Scope;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    let scope = Scope::run("run-1");
    let chat: openai::ChatAssistantMessage = serde_json::from_str(
        r#"{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "charge", "arguments": "{\"customer\": \"cus_1\", \"cents\": 100}"}}]}"#,
    )?;
    let answers = openai::chat_tool_messages(&registry, &scope, &chat).await;
    println!("{}", serde_json::to_string(&answers)?);
    let message: anthropic::AssistantMessage = serde_json::from_str(
        r#"{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
            "name": "charge", "input": {"customer": "cus_1", "cents": 100}}]}"#,
    )?;
    let results = anthropic::tool_results(&registry, &scope, &message).await;
    println!("{}", serde_json::to_string(&results)?);
    Ok(())
}
RS
      ;;
    async-openai | idem-async-openai)
      local oai='async-openai = { version = "0.43", default-features = false, features = ["chat-completion-types", "response-types"] }'
      if [ "$1" = async-openai ]; then
        crate_files fixture-async-openai "$oai
$BARE_DEPS" "$ARGS_RS$BARE_TOOL_RS" <<'RS'
use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionResponseMessage,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("{}", definition());
    let message: ChatCompletionResponseMessage = serde_json::from_str(
        r#"{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "charge", "arguments": "{\"customer\": \"cus_1\", \"cents\": 100}"}}]}"#,
    )?;
    let mut answers = Vec::new();
    for item in message.tool_calls.iter().flatten() {
        if let ChatCompletionMessageToolCalls::Function(c) = item {
            let args = serde_json::from_str(&c.function.arguments).unwrap_or_default();
            let out = call(&c.function.name, args).await;
            answers.push(ChatCompletionRequestToolMessage {
                content: ChatCompletionRequestToolMessageContent::Text(out.to_string()),
                tool_call_id: c.id.clone(),
            });
        }
    }
    println!("{}", serde_json::to_string(&answers)?);
    Ok(())
}
RS
      else
        crate_files fixture-idem-async-openai "$IDEM_DEP, features = [\"async-openai\"] }
$oai
$BARE_DEPS" "$ARGS_RS$IDEM_TOOL_RS" <<'RS'
use async_openai::types::chat::ChatCompletionResponseMessage;
use idem::providers::async_openai::{chat_tool_messages, chat_tools};
use idem::Scope;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    println!("{}", serde_json::to_string(&chat_tools(&registry))?);
    let message: ChatCompletionResponseMessage = serde_json::from_str(
        r#"{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "charge", "arguments": "{\"customer\": \"cus_1\", \"cents\": 100}"}}]}"#,
    )?;
    let answers = chat_tool_messages(&registry, &Scope::run("run-1"), &message).await;
    println!("{}", serde_json::to_string(&answers)?);
    Ok(())
}
RS
      fi
      ;;
    rig)
      crate_files fixture-rig 'rig-core = { version = "0.44", default-features = false }
rig-agent = { version = "0.44", default-features = false }'"
$BARE_DEPS" "$ARGS_RS$BARE_TOOL_RS" <<'RS'
use rig_core::message::ToolName;
use rig_core::tool::{DynamicTool, ToolExecutionError, ToolOutput};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tool = DynamicTool::new(
        ToolName::new("charge")?,
        "Charge a card.",
        definition()["parameters"].clone(),
        |args| {
            Box::pin(async move {
                let out = call("charge", args).await;
                match out.get("ok") {
                    Some(ok) => Ok(ToolOutput::json(ok.clone())),
                    None => Err(ToolExecutionError::other(out.to_string())),
                }
            })
        },
    );
    let _agent = agent as fn(_, _);
    drop(vec![tool]);
    Ok(())
}

/// The agent a model would run with the tool.
fn agent(model: rig_agent::core::DynModel<rig_agent::core::operation::Completion>, tools: Vec<DynamicTool>) {
    let _agent = rig_agent::AgentBuilder::new(model).dynamic_tools(tools).build();
}
RS
      ;;
    idem-rig)
      crate_files fixture-idem-rig "$IDEM_DEP, features = [\"rig\"] }
rig-core = { version = \"0.44\", default-features = false }
rig-agent = { version = \"0.44\", default-features = false }
$BARE_DEPS" "$ARGS_RS$IDEM_TOOL_RS" <<'RS'
use rig_core::tool::DynamicTool;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::builder().tool(charge).build()?;
    let _agent = agent as fn(_, _);
    drop(idem::rig::tools(&registry));
    let _run = idem::rig::run_context(idem::Scope::run("run-1"));
    Ok(())
}

/// The agent a model would run with the registry's tools.
fn agent(model: rig_agent::core::DynModel<rig_agent::core::operation::Completion>, tools: Vec<DynamicTool>) {
    let _agent = rig_agent::AgentBuilder::new(model).dynamic_tools(tools).build();
}
RS
      ;;
    rusqlite)
      crate_files fixture-rusqlite 'rusqlite = { version = "0.37", features = ["bundled"] }'"
$BARE_DEPS" "$ARGS_RS$BARE_TOOL_RS$DB_RS" <<'RS'
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = rusqlite::Connection::open(DB)?;
    db.execute("CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, result TEXT)", ())?;
    if db.execute("INSERT OR IGNORE INTO calls (id) VALUES (?1)", ["call_1"])? == 1 {
        let out = call("charge", serde_json::json!({ "customer": "cus_1", "cents": 100 })).await;
        db.execute("UPDATE calls SET result = ?1 WHERE id = ?2", (out.to_string(), "call_1"))?;
    }
    Ok(())
}
RS
      ;;
    redis)
      crate_files fixture-redis 'redis = { version = "0.32", default-features = false, features = ["tokio-comp", "connection-manager", "script", "cluster-async"] }'"
$BARE_DEPS" "$ARGS_RS$BARE_TOOL_RS$REDIS_RS" <<'RS'
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = redis::Client::open(REDIS)?;
    let mut con = redis::aio::ConnectionManager::new(client).await?;
    let claimed: bool = redis::cmd("SET").arg("call_1").arg("").arg("NX").query_async(&mut con).await?;
    if claimed {
        let out = call("charge", serde_json::json!({ "customer": "cus_1", "cents": 100 })).await;
        let () = redis::cmd("SET").arg("call_1").arg(out.to_string()).query_async(&mut con).await?;
    }
    Ok(())
}
RS
      ;;
    tokio-postgres)
      crate_files fixture-tokio-postgres 'tokio-postgres = "0.7.13"'"
$BARE_DEPS" "$ARGS_RS$BARE_TOOL_RS$POSTGRES_RS" <<'RS'
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (client, connection) = tokio_postgres::connect(POSTGRES, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client.batch_execute("CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, result TEXT)").await?;
    let claimed = client.execute("INSERT INTO calls (id) VALUES ($1) ON CONFLICT DO NOTHING", &[&"call_1"]).await?;
    if claimed == 1 {
        let out = call("charge", serde_json::json!({ "customer": "cus_1", "cents": 100 })).await;
        client.execute("UPDATE calls SET result = $1 WHERE id = $2", &[&out.to_string(), &"call_1"]).await?;
    }
    Ok(())
}
RS
      ;;
    idem-sqlite | idem-redis | idem-postgres)
      local backend="${1#idem-}" store url
      case "$backend" in
        sqlite) store='idem::SqliteStore::open(DB)' url="$DB_RS" ;;
        redis) store='idem::RedisStore::connect(REDIS)' url="$REDIS_RS" ;;
        postgres) store='idem::PostgresStore::connect(POSTGRES)' url="$POSTGRES_RS" ;;
      esac
      crate_files "fixture-$1" "$IDEM_DEP, features = [\"$backend\"] }
$BARE_DEPS" "$ARGS_RS$IDEM_TOOL_RS$url" <<RS
use idem::ToolCall;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = $store.await?;
    let registry = Registry::builder().tool(charge).store(store).build()?;
    let args = serde_json::json!({ "customer": "cus_1", "cents": 100 });
    println!("{}", registry.call(ToolCall::new("run-1", "charge", args)).await.text());
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
  registry_rs() { # the tools' name before their number
    echo "pub fn registry() -> Registry {"
    echo "    Registry::builder()"
    for i in $(seq 1 "$N"); do echo "        .tool($1$i)"; done
    echo "        .build()"
    echo "        .expect(\"valid\")"
    echo "}"
  }
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
    registry_rs tool_
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
    registry_rs Tool
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
row idem-openai "idem-rs with openai + anthropic, a turn of each"
row async-openai "async-openai types, a chat turn by hand"
row idem-async-openai "idem-rs with async-openai, the same turn"
row rig "rig-core + rig-agent, a DynamicTool by hand"
row idem-rig "idem-rs with rig, the registry as rig tools"
row rusqlite "rusqlite (bundled), the tool's row by hand"
row idem-sqlite "idem-rs with sqlite, a SqliteStore"
row redis "redis, SET NX by hand"
row idem-redis "idem-rs with redis, a RedisStore"
row tokio-postgres "tokio-postgres, the tool's row by hand"
row idem-postgres "idem-rs with postgres, a PostgresStore"
row tools-annotated-clean "$N #[tool] fns, the crate alone"
row tools-manual-clean "$N hand-written tools, the crate alone"
row tools-annotated-edit "$N #[tool] fns, one-line edit"
row tools-manual-edit "$N hand-written tools, one-line edit"
echo
ratio "idem default / bare" idem bare 1.6
ratio "idem mcp / rmcp same transports" idem-mcp rmcp-http 1.15
ratio "openai + anthropic / bare" idem-openai bare 1.6
ratio "async-openai: idem / by hand" idem-async-openai async-openai 1.5
ratio "rig: idem / by hand" idem-rig rig 1.5
ratio "sqlite: idem / rusqlite" idem-sqlite rusqlite 1.5
ratio "redis: idem / redis" idem-redis redis 1.5
ratio "postgres: idem / tokio-postgres" idem-postgres tokio-postgres 1.5
ratio "$N tools clean, #[tool] / by hand" tools-annotated-clean tools-manual-clean 1.2
ratio "$N tools edit, #[tool] / by hand" tools-annotated-edit tools-manual-edit 1.2
echo "timings reports: $OUT/*.html"
