//! What idem adds to a `tools/call` over streamable HTTP: the same write — append a charge to
//! an in-memory ledger — as an idem tool (in-memory store, one caller) and as a plain rmcp
//! tool, each served on its own loopback port by the same accept loop and the same rmcp
//! transport (rmcp's defaults: sessions, so each reply comes on an event stream), called one
//! after another by one keep-alive client. Prints the median per call of each, their
//! difference and their ratio.
//!
//! ```text
//! cargo run --release --example mcp_overhead --features mcp [-- CALLS]
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::mcp::rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use idem::mcp::rmcp::handler::server::tool::ToolCallContext;
use idem::mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use idem::mcp::rmcp::service::{RequestContext, RoleServer};
use idem::mcp::rmcp::transport::StreamableHttpServerConfig;
use idem::mcp::rmcp::{ErrorData, ServerHandler};
use idem::mcp::{McpHttpGuard, McpHttpService, McpServer};
use idem::{toolbox, Reconciler, Registry, ToolError, WriteCtx};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Arguments of `charge`.
#[idem::args]
struct ChargeArgs {
    /// The customer to charge.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

/// The ledger both tools append to.
#[derive(Default)]
struct Ledger {
    charges: Mutex<Vec<(String, u64)>>,
}

impl Ledger {
    fn append(&self, customer: String, cents: u64) -> Value {
        let mut charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        charges.push((customer, cents));
        json!({"id": charges.len(), "cents": cents})
    }
}

#[toolbox]
impl Ledger {
    /// Charge a customer.
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        Ok(self.append(args.customer, args.cents))
    }
}

/// The plain rmcp server: the same `charge`, no idem.
#[derive(Clone)]
struct Plain {
    router: ToolRouter<Plain>,
}

impl Plain {
    fn new(ledger: Arc<Ledger>) -> Plain {
        let schema = json!({"type": "object", "properties": {
            "customer": {"type": "string"}, "cents": {"type": "integer"}}});
        let schema = schema.as_object().cloned().unwrap_or_default();
        let router = ToolRouter::new().with_route(ToolRoute::new_dyn(
            Tool::new("charge", "Charge a customer.", schema),
            move |context: ToolCallContext<'_, Plain>| {
                let ledger = ledger.clone();
                let args = context.arguments.unwrap_or_default();
                Box::pin(async move {
                    let customer = args.get("customer").and_then(Value::as_str).unwrap_or("");
                    let cents = args.get("cents").and_then(Value::as_u64).unwrap_or(0);
                    let out = ledger.append(customer.to_owned(), cents);
                    let mut result =
                        CallToolResult::success(vec![ContentBlock::text(out.to_string())]);
                    result.structured_content = Some(out);
                    Ok(result.into())
                })
            },
        ));
        Plain { router }
    }
}

impl ServerHandler for Plain {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
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
}

/// Serves `service` on a free loopback port with the accept loop both servers share.
async fn serve<H: ServerHandler + Send + 'static>(service: McpHttpService<H>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                let route = hyper::service::service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), route)
                    .await;
            });
        }
    });
    addr
}

/// A keep-alive HTTP/1.1 client of one endpoint, with its session.
struct Client {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
    session: Option<String>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream: BufReader::new(stream),
            addr,
            session: None,
        }
    }

    async fn post(&mut self, body: &Value) -> Value {
        let body = body.to_string();
        let mut request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.addr.port(),
            body.len()
        );
        if let Some(session) = &self.session {
            request.push_str(&format!(
                "Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
            ));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .expect("write");
        let mut length = 0;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.expect("read");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().expect("a length"),
                    "mcp-session-id" => self.session = Some(value.trim().to_owned()),
                    "transfer-encoding" => chunked = value.contains("chunked"),
                    _ => {}
                }
            }
        }
        let body = if chunked {
            self.read_chunks().await
        } else {
            let mut body = vec![0; length];
            self.stream.read_exact(&mut body).await.expect("body");
            body
        };
        serde_json::from_slice(&body).unwrap_or_else(|_| {
            // An event stream: the last `data:` line holding a reply.
            String::from_utf8_lossy(&body)
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .rfind(|v| v.get("id").is_some())
                .unwrap_or(Value::Null)
        })
    }

    async fn read_chunks(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            self.stream.read_line(&mut size).await.expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
            let mut chunk = vec![0; size + 2];
            self.stream.read_exact(&mut chunk).await.expect("chunk");
            if size == 0 {
                return body;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }

    async fn initialize(&mut self) {
        self.post(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "overhead", "version": "0"}}}),
        )
        .await;
        self.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// The time of each of `calls` distinct charges (distinct, so idem runs every one).
    async fn time_calls(&mut self, tag: &str, calls: usize) -> Vec<Duration> {
        let mut times = Vec::with_capacity(calls);
        for i in 0..calls {
            let call = json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {
                "name": "charge", "arguments": {"customer": format!("{tag}-{i}"), "cents": 100}}});
            let started = Instant::now();
            let reply = self.post(&call).await;
            times.push(started.elapsed());
            assert_eq!(reply["result"]["isError"], json!(false), "{reply}");
        }
        times
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls: usize = std::env::args().nth(1).map_or(Ok(5000), |n| n.parse())?;
    let config = StreamableHttpServerConfig::default;
    let idem_ledger = Arc::new(Ledger::default());
    let registry = Registry::builder().toolbox(idem_ledger.clone()).build()?;
    // As in production: a reconciler beside the server (its passes find nothing to settle
    // here, and run once a minute, outside the measured calls).
    let _reconciler = Reconciler::new(&registry).spawn(Duration::from_secs(60));
    let idem_addr = serve(
        McpServer::new(registry)
            .single_caller()
            .http_service(McpHttpGuard::new(), config()),
    )
    .await;
    let plain_ledger = Arc::new(Ledger::default());
    let plain = Plain::new(plain_ledger.clone());
    let plain_addr =
        serve(McpHttpGuard::new().serve_handler(move || Ok(plain.clone()), config())).await;

    let mut idem_client = Client::connect(idem_addr).await;
    let mut plain_client = Client::connect(plain_addr).await;
    idem_client.initialize().await;
    plain_client.initialize().await;
    // Warm both up, then alternate rounds so that drift on a shared machine hits both alike.
    idem_client.time_calls("warm", 500).await;
    plain_client.time_calls("warm", 500).await;
    let (mut idem_times, mut plain_times) = (Vec::new(), Vec::new());
    let rounds = 10;
    for round in 0..rounds {
        let tag = format!("r{round}");
        idem_times.extend(idem_client.time_calls(&tag, calls / rounds).await);
        plain_times.extend(plain_client.time_calls(&tag, calls / rounds).await);
    }
    let (idem, plain) = (median(idem_times), median(plain_times));
    println!("calls per server: {calls} (after 500 to warm up), streamable HTTP on loopback, replies on event streams");
    println!(
        "plain rmcp tool: median {:.1} us per tools/call",
        plain.as_secs_f64() * 1e6
    );
    println!(
        "idem tool (in-memory store): median {:.1} us per tools/call",
        idem.as_secs_f64() * 1e6
    );
    println!(
        "idem - plain: {:.1} us per tools/call",
        (idem.as_secs_f64() - plain.as_secs_f64()) * 1e6
    );
    println!(
        "ratio idem / plain: {:.3}",
        idem.as_secs_f64() / plain.as_secs_f64()
    );
    Ok(())
}
