//! The rmcp [`ServerHandler`] that serves a [`Registry`]: `tools/list` from its MCP
//! definitions, `tools/call` through [`Registry::call`].

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;

use super::meta::{self, CallMeta};
use crate::definitions::{mcp_output_schema, mcp_structured_content};
use crate::{CallError, Format, OutcomeClass, Registry, ToolCall, ToolKind, ToolResult, ToolSpec};

/// Serves a [`Registry`] as an MCP server.
///
/// ```no_run
/// # async fn run(registry: idem::Registry) -> std::io::Result<()> {
/// use idem::mcp::McpServer;
///
/// let server = McpServer::new(registry).named("billing", "1.0.0");
/// server.serve_stdio().await?;                  // until the client closes stdin
/// # Ok(()) }
/// ```
///
/// Every tool keeps the registry's guarantees: a client that re-sends a `tools/call` (a new
/// JSON-RPC id, the same arguments, the same run) gets the saved result, not a second
/// effect. The run is the MCP session unless the request's `_meta` names one
/// ([`meta::RUN_KEY`]); see the [module docs](crate::mcp).
#[derive(Clone, Debug)]
pub struct McpServer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    registry: Registry,
    /// The registry's `Format::Mcp` definitions, converted once (an `Err` names the tool
    /// whose definition rmcp could not read; `tools/list` reports it).
    tools: Result<Vec<Tool>, String>,
    /// Each tool's outputSchema, compiled once, by tool name.
    output_schemas: HashMap<String, OutputSchema>,
    info: Implementation,
    instructions: Option<String>,
    sessionless_run: Option<String>,
    caller: Option<CallerHook>,
}

/// Who is calling, as the server established it (an `Authorization` header, a client
/// certificate, the process that started a stdio server): the tenant and principal the
/// keys of their calls are scoped to ([`McpServer::caller`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpCaller {
    /// The tenant, when one server serves several ([`ToolCall::tenant`]).
    pub tenant: Option<String>,
    /// The principal (user, service account) within the tenant ([`ToolCall::principal`]).
    pub principal: Option<String>,
}

impl McpCaller {
    /// A caller of `tenant`.
    pub fn tenant(tenant: impl Into<String>) -> McpCaller {
        McpCaller {
            tenant: Some(tenant.into()),
            principal: None,
        }
    }

    /// The same caller, as `principal` within its tenant.
    pub fn principal(mut self, principal: impl Into<String>) -> McpCaller {
        self.principal = Some(principal.into());
        self
    }
}

/// The server's [`McpServer::caller`] hook, with a `Debug` that does not print a closure.
type Identify =
    dyn Fn(Option<&http::request::Parts>) -> Result<McpCaller, String> + Send + Sync + 'static;

#[derive(Clone)]
struct CallerHook(Arc<Identify>);

impl std::fmt::Debug for CallerHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallerHook")
    }
}

impl McpServer {
    /// A server for `registry`, named after this crate until [`McpServer::named`].
    pub fn new(registry: Registry) -> McpServer {
        let tools = registry
            .definitions(Format::Mcp)
            .into_iter()
            .map(|def| {
                let name = def.get("name").cloned().unwrap_or_default();
                serde_json::from_value::<Tool>(def)
                    .map_err(|e| format!("tool {name}: its definition is not an MCP Tool: {e}"))
            })
            .collect();
        let output_schemas = registry
            .tools()
            .filter_map(|tool| {
                let schema = OutputSchema::of(tool.spec())?;
                Some((tool.spec().name().to_owned(), schema))
            })
            .collect();
        McpServer {
            shared: Arc::new(Shared {
                registry,
                tools,
                output_schemas,
                info: Implementation::new("idem", env!("CARGO_PKG_VERSION")),
                instructions: None,
                sessionless_run: None,
                caller: None,
            }),
        }
    }

    /// The name and version the server gives in `initialize`.
    pub fn named(self, name: impl Into<String>, version: impl Into<String>) -> McpServer {
        self.with(|s| s.info = Implementation::new(name, version))
    }

    /// Instructions for the client's model, sent in `initialize`.
    pub fn instructions(self, instructions: impl Into<String>) -> McpServer {
        let instructions = instructions.into();
        self.with(|s| s.instructions = Some(instructions))
    }

    /// The run of write calls that arrive outside any session and name no run in `_meta`:
    /// streamable HTTP in stateless mode, and clients of the sessionless protocol revision
    /// (2026-07-28) over HTTP. Without it such calls are refused (nothing runs): a run per
    /// request would make every retry a new operation. Set it only when one endpoint serves
    /// one agent run (a sidecar per agent); otherwise have clients send
    /// [`meta::RUN_KEY`].
    pub fn sessionless_run(self, run_id: impl Into<String>) -> McpServer {
        let run_id = run_id.into();
        self.with(|s| s.sessionless_run = Some(run_id))
    }

    /// Scopes every call to the caller `identify` names, so that saved results never cross
    /// tenants or principals: two callers that name one run (`_meta["idem/run"]`) and send
    /// the same arguments are two operations, each replayed only to its own caller.
    ///
    /// `identify` gets the request's head over streamable HTTP (`http::request::Parts`: its
    /// headers, and what an authentication layer in front put in its extensions), and
    /// `None` over stdio and other transports. An `Err(reason)` refuses the call before
    /// anything runs (a JSON-RPC error with `reason`); read tools are refused too, since
    /// they answer for a caller as well. Needed to serve a registry built with
    /// [`RegistryBuilder::require_tenant`](crate::RegistryBuilder::require_tenant).
    ///
    /// ```no_run
    /// use idem::mcp::{McpCaller, McpServer};
    /// # fn server(registry: idem::Registry) -> McpServer {
    /// McpServer::new(registry).caller(|head| {
    ///     // Whatever the gateway in front authenticated, e.g. a header it sets.
    ///     let tenant = head
    ///         .and_then(|h| h.headers.get("x-tenant"))
    ///         .and_then(|v| v.to_str().ok())
    ///         .ok_or("no tenant: this server serves authenticated callers only")?;
    ///     Ok(McpCaller::tenant(tenant))
    /// })
    /// # }
    /// ```
    pub fn caller(
        self,
        identify: impl Fn(Option<&http::request::Parts>) -> Result<McpCaller, String>
            + Send
            + Sync
            + 'static,
    ) -> McpServer {
        let hook = CallerHook(Arc::new(identify));
        self.with(|s| s.caller = Some(hook))
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> McpServer {
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| Shared {
            registry: shared.registry.clone(),
            tools: shared.tools.clone(),
            output_schemas: shared.output_schemas.clone(),
            info: shared.info.clone(),
            instructions: shared.instructions.clone(),
            sessionless_run: shared.sessionless_run.clone(),
            caller: shared.caller.clone(),
        });
        change(&mut shared);
        McpServer {
            shared: Arc::new(shared),
        }
    }

    /// The registry served.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// A handler for one connection or session, with a run of its own. Give each
    /// connection a new one (rmcp's `serve` consumes it).
    pub fn handler(&self) -> McpHandler {
        McpHandler {
            shared: self.shared.clone(),
            connection_run: meta::connection_run(),
        }
    }
}

/// The rmcp [`ServerHandler`] of one connection: made by [`McpServer::handler`], served by
/// rmcp (`rmcp::ServiceExt::serve` on any transport).
#[derive(Debug)]
pub struct McpHandler {
    shared: Arc<Shared>,
    /// The run of calls on this connection when neither `_meta` nor an HTTP session names
    /// one.
    connection_run: String,
}

/// Where a call's run comes from.
enum Run {
    /// Named by the call, a session, the connection or the server.
    Known(String),
    /// A request over HTTP outside any session, with no run named anywhere.
    Sessionless,
}

impl McpHandler {
    /// The run of calls on this connection that name none (stdio and in-memory transports).
    pub fn connection_run(&self) -> &str {
        &self.connection_run
    }

    fn run_of(&self, named: Option<String>, context: &RequestContext<RoleServer>) -> Run {
        if let Some(run) = named {
            return Run::Known(run);
        }
        // Over streamable HTTP rmcp hands over the request's head. One handler may serve a
        // session that moved between server instances, so the session id, not the handler,
        // names the run.
        match context.extensions.get::<http::request::Parts>() {
            None => Run::Known(self.connection_run.clone()),
            Some(parts) => match parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                Some(session) => Run::Known(meta::session_run(session)),
                None => match &self.shared.sessionless_run {
                    Some(run) => Run::Known(run.clone()),
                    None => Run::Sessionless,
                },
            },
        }
    }
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder().enable_tools().build();
        let mut info =
            InitializeResult::new(capabilities).with_server_info(self.shared.info.clone());
        if let Some(instructions) = &self.shared.instructions {
            info = info.with_instructions(instructions.clone());
        }
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        match &self.shared.tools {
            Ok(tools) => Ok(ListToolsResult::with_all_items(tools.clone())),
            Err(message) => Err(ErrorData::internal_error(message.clone(), None)),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp moves the request's `_meta` into the context; read both in case a caller
        // builds the params by hand.
        let mut fields = JsonObject::new();
        if let Some(m) = &request.meta {
            fields.extend(m.0 .0.clone());
        }
        fields.extend(context.meta.0 .0.clone());
        let asked = CallMeta::read(&fields).map_err(|m| ErrorData::invalid_params(m, None))?;

        let caller = match &self.shared.caller {
            None => McpCaller::default(),
            Some(CallerHook(identify)) => {
                identify(context.extensions.get::<http::request::Parts>())
                    .map_err(|reason| ErrorData::invalid_request(cut(&reason, 512), None))?
            }
        };
        let registry = &self.shared.registry;
        // An unknown tool is a protocol error (the request names nothing this server has);
        // everything about the arguments is the model's to correct, so it is a tool result.
        let Some(tool) = registry.get(&request.name) else {
            let refused = CallError::UnknownTool {
                name: cut(&request.name, 64),
            };
            return Err(ErrorData::invalid_params(refused.to_string(), None));
        };
        let run = match self.run_of(asked.run, &context) {
            Run::Known(run) => run,
            // A read has no key: any run will do.
            Run::Sessionless if tool.kind() == ToolKind::Read => meta::connection_run(),
            Run::Sessionless => return Ok(sessionless_refusal().into()),
        };
        // `arguments` is optional in MCP: left out, it is an empty object (which a tool
        // without arguments takes too), not `null`, which a struct of optional fields refuses.
        let args = Value::Object(request.arguments.unwrap_or_default());
        let mut call = ToolCall::new(run, request.name.to_string(), args)
            .call_id(cut(&format!("jsonrpc:{}", context.id), 128));
        if let Some(intent) = asked.intent {
            call = call.intent(intent);
        }
        if let Some(tenant) = caller.tenant {
            call = call.tenant(tenant);
        }
        if let Some(principal) = caller.principal {
            call = call.principal(principal);
        }
        // On a task of its own, so that whatever a transport does with this request's future
        // when the client goes away (cancels it, drops it), a claimed write runs to its end and
        // settles its record; a retry gets what it recorded.
        let registry = registry.clone();
        // Cheap (`Arc`s): the spec, its output schema included, is not copied.
        let tool = tool.clone();
        let result = tokio::spawn(async move { registry.call(call).await })
            .await
            .map_err(|e| ErrorData::internal_error(format!("the call's task failed: {e}"), None))?;
        let schema = self.shared.output_schemas.get(tool.spec().name());
        Ok(call_tool_result(tool.spec(), &result, schema).into())
    }
}

/// `text` cut to at most `max` bytes (at a character boundary, `…` added), so a client's
/// runaway tool name or request id is not echoed or logged in full.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn sessionless_refusal() -> CallToolResult {
    let text = format!(
        "refused: this request belongs to no MCP session and names no run; nothing was done. \
         Send the agent run's id in the request's _meta as \"{}\".",
        meta::RUN_KEY
    );
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    let mut m = MetaObject::new();
    m.0.insert(meta::OUTCOME_KEY.to_owned(), Value::from("refused"));
    result.meta = Some(m);
    result
}

/// True when the model may read the result as success: [`ToolResult::is_error`] is false (a
/// completed call, fresh or replayed, or one whose saved result has expired). The same rule
/// as the providers' `is_error`; everything else is an error to MCP clients.
fn succeeded(result: &ToolResult) -> bool {
    !result.is_error()
}

/// A [`ToolResult`] of the tool `spec` describes as MCP's `CallToolResult`: the model-facing
/// text, `isError` unless it completed, the output as structured content
/// ([`mcp_structured_content`]: the output itself when it is a JSON object, `{"result": …}`
/// when the tool's output schema is wrapped), and what idem knows in `_meta`
/// ([`meta::OUTCOME_KEY`], [`meta::KEY_KEY`], [`meta::REPLAYED_KEY`]).
///
/// A tool with an `outputSchema` promises structured content with every success, and clients
/// hold it to that (the official Python SDK raises otherwise). So a completed call of such a
/// tool that has no structured content to give — its saved result expired ("already done;
/// result no longer kept") — is sent with `isError`, its text saying what happened. So is one
/// whose output does not validate against the outputSchema (checked before it is sent): one
/// a person recorded with only a downstream reference, or a read-back settled.
pub fn to_call_tool_result(spec: &ToolSpec, result: &ToolResult) -> CallToolResult {
    call_tool_result(spec, result, OutputSchema::of(spec).as_ref())
}

/// A tool's outputSchema, compiled, to check structured content against before it is sent.
#[derive(Clone)]
struct OutputSchema(Arc<jsonschema::Validator>);

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputSchema")
    }
}

impl OutputSchema {
    /// The compiled outputSchema of the tool `spec` describes; `None` without one (or, never
    /// expected, one that does not compile: its content is then sent unchecked).
    fn of(spec: &ToolSpec) -> Option<OutputSchema> {
        let schema = mcp_output_schema(spec)?;
        match jsonschema::validator_for(&schema) {
            Ok(v) => Some(OutputSchema(Arc::new(v))),
            Err(e) => {
                tracing::warn!(tool = spec.name(), error = %e, "outputSchema does not compile");
                None
            }
        }
    }
}

/// [`to_call_tool_result`] with the tool's compiled outputSchema. A completed output that
/// does not meet it — one a person recorded (`resolve` with only a downstream reference) or
/// a read-back settled, not the handler's own — is sent like an expired result: as an error
/// whose text says it completed, since clients refuse structured content that breaks the
/// schema, and a tool with one must send structured content with every success.
fn call_tool_result(
    spec: &ToolSpec,
    result: &ToolResult,
    schema: Option<&OutputSchema>,
) -> CallToolResult {
    let content = vec![ContentBlock::text(result.text())];
    let structured = result
        .output()
        .and_then(|output| mcp_structured_content(spec, output))
        .filter(|structured| schema.is_none_or(|s| s.0.is_valid(structured)));
    let mut out = match (succeeded(result), structured) {
        (true, Some(structured)) => {
            let mut ok = CallToolResult::success(content);
            ok.structured_content = Some(structured);
            ok
        }
        (true, None) if mcp_output_schema(spec).is_none() => CallToolResult::success(content),
        _ => CallToolResult::error(content),
    };
    let mut m = MetaObject::new();
    let outcome = result.class().map_or("refused", OutcomeClass::as_str);
    m.0.insert(meta::OUTCOME_KEY.to_owned(), Value::from(outcome));
    if let Some(key) = result.key() {
        m.0.insert(meta::KEY_KEY.to_owned(), Value::from(key.as_str()));
    }
    m.0.insert(
        meta::REPLAYED_KEY.to_owned(),
        Value::Bool(result.replayed()),
    );
    out.meta = Some(m);
    out
}
