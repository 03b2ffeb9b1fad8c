//! Serve a [`Registry`](crate::Registry) as an MCP server (feature `mcp`, built on rmcp).
//!
//! ```no_run
//! use idem::mcp::McpServer;
//! # async fn run(registry: idem::Registry) -> std::io::Result<()> {
//! // stdio: what an MCP host starts as a subprocess.
//! McpServer::new(registry.clone()).serve_stdio().await?;
//!
//! // Streamable HTTP on loopback, at http://127.0.0.1:8000/mcp.
//! McpServer::new(registry).bind_http(idem::mcp::DEFAULT_HTTP_ADDR).await?.serve().await?;
//! # Ok(()) }
//! ```
//!
//! # What a client sees
//!
//! - `tools/list`: the registry's [`Format::Mcp`](crate::Format::Mcp) definitions. The
//!   hints hold because the executor enforces them: `readOnlyHint` for reads,
//!   `idempotentHint: true` for every write (a repeat replays), `destructiveHint` as the
//!   tool declares it.
//! - `tools/call`: carried out by [`Registry::call`](crate::Registry::call). The result's
//!   text is [`ToolResult::text`](crate::ToolResult::text); `isError` is set for every call
//!   that did not complete — refused, rejected, failed, pending, unknown, escalated — so an
//!   unknown outcome never reads as success. A tool whose output type has a JSON Schema is
//!   listed with an `outputSchema` ([`mcp_output_schema`](crate::definitions::mcp_output_schema):
//!   an output that is not a JSON object is wrapped as `{"result": …}`), and its completed
//!   calls carry the output as `structuredContent` valid against it
//!   ([`mcp_structured_content`](crate::definitions::mcp_structured_content)); a tool without
//!   one still sends an object output as `structuredContent`. No other outcome carries
//!   structured content. The result's `_meta` has the outcome class
//!   ([`OUTCOME_KEY`]), the idempotency key ([`KEY_KEY`]) and whether it was replayed
//!   ([`REPLAYED_KEY`]).
//! - An unknown tool, or a malformed `_meta` field of ours, is a JSON-RPC error
//!   (`-32602`); arguments of the wrong type or shape, or over the registry's size limit,
//!   are a tool result with `isError`, so the model can correct them. Nothing runs for any
//!   of them.
//! - Malformed JSON-RPC is rmcp's to answer: a message that is JSON but no JSON-RPC gets
//!   `-32600`; a stdio line that is not JSON at all is dropped unanswered (it has no id to
//!   answer, as in the other official SDKs); over HTTP either is a `4xx`. A request before
//!   `initialize` gets a JSON-RPC error (stdio) or a `4xx` (HTTP). The connection stays up.
//!
//! # Which run a call belongs to
//!
//! The key of a write is derived from its run, its tool and its arguments (or intent id), so
//! the run decides which calls are repeats of one another. In order:
//!
//! 1. `_meta["idem/run"]` ([`RUN_KEY`]) on the request, when the client sends one: the
//!    agent run's own id, which outlives a session (a resumed run, a second server behind a
//!    load balancer).
//! 2. The MCP session: the streamable HTTP session (its `Mcp-Session-Id`, hashed), or the
//!    connection for stdio and other session-less transports.
//! 3. Outside any session over HTTP (stateless mode, or the per-request protocol revision):
//!    [`McpServer::sessionless_run`] when set; otherwise a write is refused with a text that
//!    asks for `idem/run` (a read runs).
//!
//! A run names calls, not callers: on a server shared by several tenants or users, scope
//! every call to who is calling with [`McpServer::caller`] (from the HTTP request's head,
//! or fixed for a stdio server), so that two callers naming one run never share a key or a
//! saved result.
//!
//! `_meta["idem/intent"]` ([`INTENT_KEY`]) sets an explicit intent id: the key comes from
//! it instead of the arguments, so the same intent sent again with other arguments is
//! refused.
//!
//! ```json
//! {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
//!   "name": "charge", "arguments": {"customer": "acme", "cents": 4900},
//!   "_meta": {"idem/run": "run-2026-11-30-17", "idem/intent": "order-1234-charge"}}}
//! ```

mod http;
mod meta;
mod router;
mod server;

use std::io;

use rmcp::service::{RoleServer, RunningService, ServerInitializeError};
use rmcp::transport::IntoTransport;
use rmcp::ServiceExt;

pub use http::{
    McpHttp, McpHttpGuard, McpHttpResponse, McpHttpService, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_HTTP_ADDR, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_SESSIONS, MCP_PATH,
};
pub use meta::{
    IDEMPOTENCY_KEY_HEADER, IDEMPOTENCY_KEY_META, INTENT_KEY, KEY_KEY, MAX_CALL_ID_BYTES,
    MAX_INTENT_BYTES, MAX_RUN_BYTES, OUTCOME_KEY, REPLAYED_KEY, RUN_KEY,
};
pub use router::JoinError;
pub use server::{to_call_tool_result, McpCaller, McpHandler, McpServer};

/// The rmcp idem is built with, for transports and types beyond these helpers.
pub use rmcp;

impl McpServer {
    /// Serves one client over stdin/stdout until it closes them.
    pub async fn serve_stdio(self) -> io::Result<()> {
        let running = self.serve(rmcp::transport::stdio()).await?;
        running.waiting().await.map_err(io::Error::other)?;
        Ok(())
    }

    /// Serves one connection over any rmcp transport (e.g. a `tokio::io::duplex` pair, a
    /// socket), with a handler (and so a run) of its own. Completes once the client has
    /// initialized; the returned service runs until the transport closes.
    pub async fn serve<T, E, A>(
        &self,
        transport: T,
    ) -> io::Result<RunningService<RoleServer, McpHandler>>
    where
        T: IntoTransport<RoleServer, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.handler()
            .serve(transport)
            .await
            .map_err(|e: ServerInitializeError| io::Error::other(e))
    }
}
