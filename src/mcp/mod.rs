//! Serve a [`Registry`](crate::Registry) as an MCP server (feature `mcp`, built on rmcp).
//!
//! ```no_run
//! use idem::mcp::McpServer;
//! # async fn run(registry: idem::Registry) -> std::io::Result<()> {
//! // stdio: what an MCP host starts as a subprocess.
//! McpServer::new(registry.clone()).serve_stdio().await?;
//!
//! // Streamable HTTP on loopback, at http://127.0.0.1:8000/mcp, for one caller.
//! McpServer::new(registry)
//!     .single_caller()
//!     .bind_http(idem::mcp::DEFAULT_HTTP_ADDR)
//!     .await?
//!     .serve()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # What a client sees
//!
//! - `tools/list`: the registry's [`Format::Mcp`](crate::Format::Mcp) definitions. The
//!   hints hold because the executor enforces them: `readOnlyHint` for reads,
//!   `destructiveHint` as the tool declares it, and `idempotentHint: true` on writes only
//!   where a repeat after a reconnect or a restart reaches the saved record: the store
//!   outlives the process ([`IdemStore::durability`](crate::IdemStore::durability)) and the
//!   server can scope the write to its caller (below). Elsewhere the hint is left out, since
//!   clients read it when deciding that re-sending an unanswered call is safe.
//! - `tools/call`: carried out by [`Registry::call`](crate::Registry::call). The result's
//!   text is [`ToolResult::text`](crate::ToolResult::text); `isError` is set for every call
//!   that did not complete — refused, rejected, failed, pending, unknown, escalated — so an
//!   unknown outcome never reads as success. A tool whose output type has a JSON Schema is
//!   listed with an `outputSchema` ([`mcp_output_schema`](crate::definitions::mcp_output_schema):
//!   an output that is not a JSON object is wrapped as `{"result": …}`), and its completed
//!   calls carry the output as `structuredContent` valid against it
//!   ([`mcp_structured_content`](crate::definitions::mcp_structured_content)); a tool without
//!   one still sends an object output as `structuredContent`. No other outcome carries
//!   structured content. Every output is checked against the outputSchema before it is
//!   sent (one a person recorded or a read-back settled need not match it); one that does not
//!   match is sent with `isError` and a text saying the call completed. The check knows the
//!   JSON Schema schemars emits and fails closed on the rest: for a schema with a keyword it
//!   does not evaluate (`pattern`, `patternProperties`, a remote `$ref`, …) only the
//!   handler's own fresh output is structured content, and a replay is sent as that error
//!   (with a warning when the schema is compiled: once per tool when the server is built). The result's `_meta` has the outcome class
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
//! # Which calls are one operation
//!
//! The key of a write is derived from its **caller** (tenant, principal), its tool and its
//! arguments (or an intent id), never from the connection or the session: a client that
//! re-sends a write after reconnecting — to the same process, or to another one on the same
//! durable store — gets the saved result. Equal-argument writes by one caller are one
//! operation for as long as the record is kept (the result 24 h, its tombstone 30 days by
//! default); a tool author keeps deliberate repeats apart with what tells them apart in the
//! arguments (a `key(..)` field: an order id, a date), a client with an idempotency key.
//! A write that has claimed its key runs to its end even when nobody awaits its answer any
//! more (the client hung up or cancelled, a host's own deadline passed and it dropped the
//! call): it settles its record, and the retry gets what it did.
//!
//! **The caller** is the host's to name, never the client's:
//!
//! - [`McpServer::caller`]: a hook that reads it from the HTTP request's head (or names it
//!   for stdio); an `Err` refuses the call.
//! - [`McpHttpGuard::authenticate`]: the HTTP service answers `401` before any session
//!   unless the hook names the caller, which then scopes the request's calls.
//! - [`McpServer::single_caller`]: everyone who reaches the endpoint is one caller.
//! - Otherwise a stdio (or in-process) server serves one caller, whoever started it; an
//!   HTTP server cannot tell callers apart, so it runs reads and refuses writes with a text
//!   saying how to identify callers. Both protocol revisions are served the same way (with
//!   sessions, and the sessionless 2026-07-28).
//!
//! **What a client may send** (none of it is needed for a repeat to replay):
//!
//! - an idempotency key, as an intent id scoped by the caller: the `Idempotency-Key` HTTP
//!   header of a `tools/call` POST ([`IDEMPOTENCY_KEY_HEADER`]), `_meta["idempotencyKey"]`
//!   ([`IDEMPOTENCY_KEY_META`]) or `_meta["idem/intent"]` ([`INTENT_KEY`]); at most
//!   [`MAX_INTENT_BYTES`]. The key comes from it instead of the arguments, so two actions
//!   with equal arguments stay two and the same key with other arguments is refused. Two
//!   spellings that disagree are refused with nothing run.
//! - `_meta["idem/run"]` ([`RUN_KEY`], at most [`MAX_RUN_BYTES`]), only where the host
//!   turned [`McpServer::client_runs`] on (refused elsewhere): a run the client names lives
//!   in a namespace of its own, apart from the run of unnamed calls, and within the
//!   caller's scope, so naming another caller's run reaches nothing of theirs.
//!
//! Oversized values, and JSON-RPC ids over [`MAX_CALL_ID_BYTES`], are refused before they
//! reach a span or a log.
//!
//! ```json
//! {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
//!   "name": "charge", "arguments": {"customer": "acme", "cents": 4900},
//!   "_meta": {"idempotencyKey": "order-1234-charge"}}}
//! ```
//!
//! # Over HTTP
//!
//! [`McpServer::http_service`] is a `tower::Service` (mount it with axum's `nest_service`)
//! behind an [`McpHttpGuard`]: `Origin` checked (`403`, no session, for a page not on this
//! machine unless listed), authentication (`401` before `initialize`), a cap on live
//! sessions. [`McpServer::bind_http`] serves it from idem's own accept loop, which adds a
//! header-read timeout and a cap on connections.
//!
//! # Inside an existing rmcp server
//!
//! [`McpServer::join_router`] adds the registry's tools to a host's own rmcp `ToolRouter`, so
//! the host keeps its `ServerHandler` (prompts, resources, plain tools), with the same
//! promise; a tool name both define is a [`JoinError`], not a silent replacement.
//! [`McpHttpGuard::serve_handler`] puts such a handler behind the same guard.

mod http;
mod meta;
mod output_schema;
mod router;
mod run_to_end;
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
    /// socket), with a handler of its own (its calls are still scoped to their caller, not
    /// to the connection). Completes once the client has
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
