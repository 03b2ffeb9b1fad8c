//! An rmcp server of its own — its own `ServerHandler`, a prompt and a plain tool — that
//! adds idem's tools to its `ToolRouter`: `charge` is exactly-once (a re-sent call, on any
//! connection, is one charge), `echo` is the host's and runs every time.
//!
//! ```text
//! cargo run --example mcp_router --features mcp                             # stdio
//! cargo run --example mcp_router --features mcp -- --http 127.0.0.1:8000    # http://127.0.0.1:8000/mcp
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::mcp::rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use idem::mcp::rmcp::handler::server::tool::ToolCallContext;
use idem::mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InitializeResult,
    ListPromptsResult, ListToolsResult, PaginatedRequestParams, Prompt, ServerCapabilities, Tool,
};
use idem::mcp::rmcp::service::{RequestContext, RoleServer};
use idem::mcp::rmcp::{ErrorData, ServerHandler, ServiceExt};
use idem::mcp::{JoinError, McpServer};
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
    /// The customers charged, one entry per charge.
    pub charges: Mutex<Vec<String>>,
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
            .push(args.customer.clone());
        Ok(json!({"charged": args.cents, "customer": args.customer}))
    }
}

/// The host's own server: a router of its plain tools and idem's, and a prompt.
#[derive(Clone)]
pub struct Desk {
    router: ToolRouter<Desk>,
}

/// The host's own tools: `echo`, run on every call.
pub fn plain_tools() -> ToolRouter<Desk> {
    let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
    let schema = schema.as_object().cloned().unwrap_or_default();
    ToolRouter::new().with_route(ToolRoute::new_dyn(
        Tool::new("echo", "Say it back.", schema),
        |context: ToolCallContext<'_, Desk>| {
            let text = context
                .arguments
                .as_ref()
                .and_then(|a| a.get("text"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Box::pin(
                async move { Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into()) },
            )
        },
    ))
}

impl Desk {
    /// The desk over `registry`'s tools, joined to its plain ones (an error names a tool both
    /// define). One caller: whoever started it, or whoever reaches its loopback port.
    pub fn new(registry: Registry) -> Result<Desk, JoinError> {
        let idem = McpServer::new(registry).single_caller();
        Ok(Desk {
            router: idem.join_router(plain_tools())?,
        })
    }
}

impl ServerHandler for Desk {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .build();
        InitializeResult::new(capabilities)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.router.list_all()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let prompt = Prompt::new("bill", Some("Bill a customer once."), None);
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }
}

/// A registry over `billing`.
pub fn registry(billing: Arc<Billing>) -> Result<Registry, Box<dyn std::error::Error>> {
    Ok(Registry::builder().toolbox(billing).build()?)
}

// `pub`: the tests run this very `main` as a server.
#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = registry(Arc::new(Billing::default()))?;
    // A reconciler (never the model) settles what a write left unknown or pending.
    let _reconciler = Reconciler::new(&registry).spawn(Duration::from_secs(30));
    let desk = Desk::new(registry)?;
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (None, _) => {
            desk.serve(idem::mcp::rmcp::transport::stdio())
                .await?
                .waiting()
                .await?;
        }
        (Some("--http"), Some(addr)) => {
            use idem::mcp::rmcp::transport::StreamableHttpServerConfig;
            // idem's guard (Origin checked, live sessions capped) in front of this handler.
            let service = idem::mcp::McpHttpGuard::new().serve_handler(
                move || Ok(desk.clone()),
                StreamableHttpServerConfig::default(),
            );
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            eprintln!("listening on http://{}/mcp", listener.local_addr()?);
            loop {
                let (stream, _) = listener.accept().await?;
                let service = service.clone();
                tokio::spawn(async move {
                    let route = hyper::service::service_fn(move |request| {
                        let service = service.clone();
                        async move { Ok::<_, std::convert::Infallible>(service.handle(request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), route)
                        .await;
                });
            }
        }
        _ => return Err("usage: mcp_router [--http ADDR]".into()),
    }
    Ok(())
}
