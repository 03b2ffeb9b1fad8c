//! idem's MCP endpoint inside an axum app of its own: the app keeps its routes (`/health`
//! here) and mounts the streamable HTTP service with `nest_service("/mcp", …)`. The service
//! brings its guard along (a foreign `Origin` is `403`, a request without a token `401`,
//! before any session exists), and the caller the guard names scopes the calls, so a client
//! that re-sends `charge` on a new session, or after the app restarts on a durable store,
//! gets the saved result and one charge.
//!
//! ```text
//! IDEM_MCP_TOKENS=alice-token=alice cargo run --example mcp_axum --features mcp
//! # then, with the MCP client of your choice: http://127.0.0.1:8000/mcp,
//! # header `Authorization: Bearer alice-token`
//! ```
//!
//! `IDEM_MCP_TOKENS` lists `token=principal` pairs (comma-separated); without it the app
//! serves a single caller, whoever reaches its loopback port.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use idem::mcp::rmcp::transport::StreamableHttpServerConfig;
use idem::mcp::{McpCaller, McpHttpGuard, McpServer};
use idem::{toolbox, Reconciler, Registry, ToolError, WriteCtx};
use serde_json::{json, Value};

/// Arguments of `charge`.
#[idem::args]
pub struct ChargeArgs {
    /// The customer to charge.
    pub customer: String,
    /// Amount in cents.
    pub cents: u64,
}

/// The billing side: every charge made.
#[derive(Default)]
pub struct Billing {
    /// `(customer, cents)` of each charge made.
    pub charges: Mutex<Vec<(String, u64)>>,
}

#[toolbox]
impl Billing {
    /// Charge a customer's card. Safe to repeat: the same charge by the same caller is made
    /// once.
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        self.charges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((args.customer.clone(), args.cents));
        Ok(json!({"charged": args.cents, "customer": args.customer}))
    }
}

/// The guard in front of the MCP service: bearer tokens from `tokens` (`token=principal`
/// pairs), each naming its caller; `None` when there are none to check.
pub fn bearer_guard(tokens: &str) -> Option<McpHttpGuard> {
    let tokens: Vec<(String, String)> = tokens
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(token, principal)| (format!("Bearer {}", token.trim()), principal.trim().into()))
        .collect();
    if tokens.is_empty() {
        return None;
    }
    Some(McpHttpGuard::new().authenticate(move |head| {
        let sent = head
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        tokens
            .iter()
            .find(|(token, _)| Some(token.as_str()) == sent)
            .map(|(_, principal)| McpCaller::default().principal(principal.clone()))
            .ok_or_else(|| "a bearer token is required".to_owned())
    }))
}

/// The app: its own routes, and idem's MCP service at `/mcp` behind `guard` (a single
/// caller without one).
pub fn app(registry: Registry, guard: Option<McpHttpGuard>) -> axum::Router {
    let server = McpServer::new(registry);
    let (server, guard) = match guard {
        Some(guard) => (server, guard),
        None => (server.single_caller(), McpHttpGuard::new()),
    };
    let mcp = server.http_service(guard, StreamableHttpServerConfig::default());
    axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .nest_service("/mcp", mcp)
}

/// A registry over `billing` (in memory; `shared_store` puts it on a durable store).
pub fn registry(billing: Arc<Billing>) -> Result<Registry, Box<dyn std::error::Error>> {
    Ok(Registry::builder().toolbox(billing).build()?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = registry(Arc::new(Billing::default()))?;
    // A reconciler (never the model) settles what a write left unknown or pending.
    let _reconciler = Reconciler::new(&registry).spawn(Duration::from_secs(30));
    let guard = bearer_guard(&std::env::var("IDEM_MCP_TOKENS").unwrap_or_default());
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app(registry, guard)).await?;
    Ok(())
}
