//! An MCP server over an idem registry: a `charge` write against an in-process ledger, a
//! `ledger` read that reports it and a `customers` read that lists who was charged. Repeat a
//! `tools/call` as often as you like: one charge. Each tool's output type derives
//! `JsonSchema` (through `#[idem::args]`), so each is listed with an `outputSchema` and
//! answers with `structuredContent`; `customers` returns a list, which MCP carries wrapped
//! as `{"result": [...]}`.
//!
//! ```text
//! cargo run --example mcp_server --features mcp                             # stdio
//! cargo run --example mcp_server --features mcp -- --http 127.0.0.1:8000    # http://127.0.0.1:8000/mcp
//! ```
//!
//! Environment:
//! - `IDEM_MCP_LEDGER=PATH`: also append each charge to this file, one JSON line each (two
//!   servers given one file show every charge made);
//! - `IDEM_STORE_URL`: the idempotency store, `sqlite://PATH` (feature `sqlite`),
//!   `redis://…` (`redis`) or `postgres://…` (`postgres`); default: in memory. Servers that
//!   share a store share their claims: behind a load balancer, one call is one charge;
//! - `IDEM_STORE_NAMESPACE`: the Redis key prefix or Postgres schema (default: the store's);
//! - `IDEM_MCP_TOKENS=alice:TOKEN_A,bob:TOKEN_B` (HTTP): require `Authorization: Bearer
//!   TOKEN` on every request (`401` otherwise, before any session), each token's caller a
//!   principal of its own. Without it the demo declares a single caller: whoever can reach
//!   its loopback port (or started it over stdio) is the one caller, so a call re-sent
//!   after a reconnect or a restart (on a durable store) is one charge.
//!
//! Browsers' requests from pages not on this machine are refused (`Origin` checked).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::mcp::{McpCaller, McpHttpGuard, McpServer};
use idem::{toolbox, IdemStore, ReadCtx, Reconciler, Registry, ToolError, WriteCtx};

/// Arguments of `charge`.
#[idem::args]
struct ChargeArgs {
    /// The customer to charge.
    customer: String,
    /// Amount in cents.
    cents: u64,
    /// What the charge is for.
    memo: Option<String>,
}

/// One charge the billing side made.
#[idem::args]
#[derive(Clone)]
struct Charge {
    /// The charge's id.
    id: String,
    /// Who paid.
    customer: String,
    /// How much, in cents.
    cents: u64,
    /// The idempotency key it was made under.
    key: String,
}

/// What `ledger` reports.
#[idem::args]
struct LedgerReport {
    /// How many charges this server made.
    count: usize,
    /// The charges, oldest first.
    charges: Vec<Charge>,
}

/// The billing side: an in-process ledger, mirrored to a file when one is given.
struct Billing {
    charges: Mutex<Vec<Charge>>,
    file: Option<PathBuf>,
}

#[toolbox]
impl Billing {
    /// Charge a customer's card. Safe to repeat: the same charge by the same caller is made
    /// once, across reconnects and, on a durable store, restarts.
    // Keyed by who pays and how much, never by the free-text memo: a repeat whose memo the
    // model re-worded is the same charge (refused as changed parameters, not made twice).
    #[tool(write, key(customer, cents), timeout = "10s")]
    async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        let mut charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        let charge = Charge {
            id: format!("ch_{:04}", charges.len() + 1),
            customer: args.customer,
            cents: args.cents,
            key: ctx.key().as_str().to_owned(),
        };
        if let Some(path) = &self.file {
            // Rejected, not unknown: a failed append provably charged nothing.
            let line =
                serde_json::to_string(&charge).map_err(|e| ToolError::rejected(e.to_string()))?;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{line}"))
                .map_err(|e| ToolError::rejected(format!("ledger file: {e}")))?;
        }
        charges.push(charge.clone());
        Ok(charge)
    }

    /// List the charges this server has made.
    #[tool(read)]
    async fn ledger(&self, _ctx: ReadCtx) -> Result<LedgerReport, ToolError> {
        let charges = self
            .charges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(LedgerReport {
            count: charges.len(),
            charges,
        })
    }

    /// The customers charged so far, each once, in order of their first charge.
    #[tool(read)]
    async fn customers(&self, _ctx: ReadCtx) -> Result<Vec<String>, ToolError> {
        let mut names: Vec<String> = Vec::new();
        for charge in self
            .charges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if !names.contains(&charge.customer) {
                names.push(charge.customer.clone());
            }
        }
        Ok(names)
    }
}

async fn store_from_env() -> Result<Option<Arc<dyn IdemStore>>, Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("IDEM_STORE_URL") else {
        return Ok(None);
    };
    #[cfg(feature = "sqlite")]
    if let Some(path) = url.strip_prefix("sqlite://") {
        return Ok(Some(Arc::new(idem::SqliteStore::open(path).await?)));
    }
    let namespace = std::env::var("IDEM_STORE_NAMESPACE").ok();
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") {
        let mut store = idem::RedisStore::builder(url.as_str());
        if let Some(prefix) = &namespace {
            store = store.prefix(prefix.as_str());
        }
        return Ok(Some(Arc::new(store.connect().await?)));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut store = idem::PostgresStore::builder(url.as_str());
        if let Some(schema) = &namespace {
            store = store.schema(schema.as_str());
        }
        return Ok(Some(Arc::new(store.connect().await?)));
    }
    let _ = namespace;
    Err(format!("IDEM_STORE_URL={url}: unsupported (or its store's feature is off)").into())
}

/// A principal and the bearer token that authenticates it.
type Token = (String, String);

/// `IDEM_MCP_TOKENS` as (principal, token) pairs.
fn tokens_from_env() -> Result<Option<Vec<Token>>, Box<dyn std::error::Error>> {
    let Ok(spec) = std::env::var("IDEM_MCP_TOKENS") else {
        return Ok(None);
    };
    let mut tokens = Vec::new();
    for pair in spec.split(',').filter(|p| !p.is_empty()) {
        let (who, token) = pair
            .split_once(':')
            .filter(|(w, t)| !w.is_empty() && !t.is_empty())
            .ok_or("IDEM_MCP_TOKENS: expected principal:token[,principal:token...]")?;
        tokens.push((who.to_owned(), token.to_owned()));
    }
    Ok(Some(tokens))
}

// `pub`: the tests run this very `main` as their server (`tests/mcp_clients/`).
#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let http = match (args.next().as_deref(), args.next()) {
        (None, _) => None,
        (Some("--http"), Some(addr)) => Some(addr),
        _ => return Err("usage: mcp_server [--http ADDR]   (e.g. --http 127.0.0.1:8000)".into()),
    };
    let billing = Arc::new(Billing {
        charges: Mutex::new(Vec::new()),
        file: std::env::var_os("IDEM_MCP_LEDGER").map(PathBuf::from),
    });
    let mut builder = Registry::builder().toolbox(billing);
    if let Some(store) = store_from_env().await? {
        builder = builder.shared_store(store);
    }
    let registry = builder.build()?;
    // A reconciler (never the model) settles what a charge left unknown or pending: a
    // charge cut off by a crash, a client gone mid-call.
    let _reconciler = Reconciler::new(&registry).spawn(Duration::from_secs(30));
    let server = McpServer::new(registry).named("idem-billing-demo", env!("CARGO_PKG_VERSION"));
    let tokens = tokens_from_env()?;
    match http {
        None => server.serve_stdio().await?,
        Some(addr) => {
            // Without tokens, a local demo: one caller, whoever reaches the port.
            let guard = tokens.map(|tokens| {
                McpHttpGuard::new().authenticate(move |head| {
                    let token = head
                        .headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "));
                    tokens
                        .iter()
                        .find(|(_, t)| Some(t.as_str()) == token)
                        .map(|(who, _)| McpCaller::default().principal(who.clone()))
                        .ok_or_else(|| "send Authorization: Bearer <token>".to_owned())
                })
            });
            let server = if guard.is_some() {
                server
            } else {
                server.single_caller()
            };
            let mut endpoint = server.bind_http(addr).await?;
            if let Some(guard) = guard {
                endpoint = endpoint.guard(guard);
            }
            // On stderr, so a supervisor (or a test) can read the port picked for `:0`.
            eprintln!("listening on http://{}/mcp", endpoint.local_addr()?);
            endpoint.serve().await?;
        }
    }
    Ok(())
}
