//! The rmcp [`ServerHandler`] that serves a [`Registry`]: `tools/list` from its MCP
//! definitions, `tools/call` through [`Registry::call`].

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, MetaObject, PaginatedRequestParams, ServerCapabilities,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;

use super::meta::{self, CallMeta};
use super::output_schema::Validator;
use super::run_to_end::RunToEnd;
use crate::definitions::{into_mcp_structured_content, mcp_output_schema};
use crate::store::Durability;
use crate::{
    definitions::DefinitionOptions,
    tool::{ToolKind, ToolSpec},
    CallError, Format, Outcome, OutcomeClass, Registry, ToolCall, ToolResult,
};

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
/// JSON-RPC id, the same arguments) gets the saved result, not a second effect, across
/// reconnects and server restarts on a durable store. The scope of a call is its caller
/// ([`McpServer::caller`], [`McpServer::single_caller`]), never the connection or the
/// session; see the [module docs](crate::mcp).
#[derive(Clone, Debug)]
pub struct McpServer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    registry: Registry,
    /// The registry's `Format::Mcp` definitions, converted once, with `idempotentHint` on
    /// writes (listed where the hint holds) and without it (an `Err` names the tool whose
    /// definition rmcp could not read; `tools/list` reports it).
    tools: Listing,
    /// Each tool's outputSchema, compiled once, by tool name.
    output_schemas: HashMap<String, OutputSchema>,
    info: Implementation,
    instructions: Option<String>,
    callers: Callers,
    client_runs: bool,
}

/// The tool listings a server may send.
#[derive(Clone, Debug)]
struct Listing {
    /// Writes advertised with `idempotentHint: true`: only over a durable store.
    hinted: Result<Vec<Tool>, String>,
    /// Writes without the hint.
    plain: Result<Vec<Tool>, String>,
}

/// How a server tells its callers apart.
#[derive(Clone, Debug)]
enum Callers {
    /// Nothing said: stdio serves whoever started it; over HTTP, writes are refused unless
    /// an authentication layer named the caller.
    Unnamed,
    /// The host declared that every call comes from one caller.
    Single,
    /// The host's hook names the caller of each request.
    Hook(CallerHook),
}

/// Who is calling, as the server established it (an `Authorization` header, a client
/// certificate, the process that started a stdio server): the tenant and principal the
/// keys of their calls are scoped to ([`McpServer::caller`]).
///
/// An authentication layer in front of the HTTP service
/// ([`McpHttpGuard::authenticate`](super::McpHttpGuard::authenticate)) puts the caller it
/// established in the request's extensions; the server uses it when no
/// [`McpServer::caller`] hook is set, and a hook may read it there.
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

fn listing(registry: &Registry, hint: bool) -> Result<Vec<Tool>, String> {
    let options = DefinitionOptions::default().idempotent_hint(hint);
    registry
        .definitions_with(Format::Mcp, &options)
        .into_iter()
        .map(|def| {
            let name = def.get("name").cloned().unwrap_or_default();
            serde_json::from_value::<Tool>(def)
                .map_err(|e| format!("tool {name}: its definition is not an MCP Tool: {e}"))
        })
        .collect()
}

impl McpServer {
    /// A server for `registry`, named after this crate until [`McpServer::named`].
    pub fn new(registry: Registry) -> McpServer {
        // A repeat after a restart reaches its record only if the store outlived the
        // process; otherwise the hint would tell clients a replay is safe when it is not.
        let durable = registry.store().durability() == Durability::Durable;
        let plain = listing(&registry, false);
        let hinted = if durable {
            listing(&registry, true)
        } else {
            plain.clone()
        };
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
                tools: Listing { hinted, plain },
                output_schemas,
                info: Implementation::new("idem", env!("CARGO_PKG_VERSION")),
                instructions: None,
                callers: Callers::Unnamed,
                client_runs: false,
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

    /// Declares that every call this server gets comes from one caller (a local demo, a
    /// sidecar serving one agent, an endpoint only one user can reach): over HTTP, writes
    /// run without a [`McpServer::caller`] hook, all in that one caller's scope, so a write
    /// re-sent on any session, before or after a restart, replays. A stdio server serves one
    /// caller without being told. Replaces a [`McpServer::caller`] hook.
    pub fn single_caller(self) -> McpServer {
        self.with(|s| s.callers = Callers::Single)
    }

    /// Lets clients name the run a call belongs to (`_meta["idem/run"]`,
    /// [`meta::RUN_KEY`]); off by default, when a call naming one is refused.
    ///
    /// A named run narrows what repeats one another: calls with equal arguments in two
    /// named runs are two operations. It stays within the caller's scope (a run another
    /// caller named reaches nothing of theirs) and in a namespace of its own, apart from the
    /// run the server gives unnamed calls. Turn it on for agent harnesses that checkpoint
    /// a run id and send it with every call.
    pub fn client_runs(self, on: bool) -> McpServer {
        self.with(|s| s.client_runs = on)
    }

    /// Scopes every call to the caller `identify` names, so that saved results never cross
    /// tenants or principals: two callers that send the same arguments are two operations,
    /// each replayed only to its own caller; one caller's repeats are one operation on any
    /// connection or session.
    ///
    /// `identify` gets the request's head over streamable HTTP (`http::request::Parts`: its
    /// headers, and what an authentication layer in front put in its extensions, such as
    /// the [`McpCaller`] of [`McpHttpGuard::authenticate`](super::McpHttpGuard::authenticate)),
    /// and `None` over stdio and other transports. An `Err(reason)` refuses the call before
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
        self.with(|s| s.callers = Callers::Hook(hook))
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> McpServer {
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| Shared {
            registry: shared.registry.clone(),
            tools: shared.tools.clone(),
            output_schemas: shared.output_schemas.clone(),
            info: shared.info.clone(),
            instructions: shared.instructions.clone(),
            callers: shared.callers.clone(),
            client_runs: shared.client_runs,
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

    /// A handler for one connection or session (rmcp's `serve` consumes it). Handlers hold
    /// no run of their own: every call's scope is its caller's.
    pub fn handler(&self) -> McpHandler {
        McpHandler {
            server: self.clone(),
        }
    }

    /// The tools as listed to the request of `context`: writes carry `idempotentHint` only
    /// over a durable store and where the server can scope them.
    pub(crate) fn tools_for(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Vec<Tool>, ErrorData> {
        let head = context.extensions.get::<http::request::Parts>();
        let listing = if self.scopes_writes(head) {
            &self.shared.tools.hinted
        } else {
            &self.shared.tools.plain
        };
        listing
            .clone()
            .map_err(|message| ErrorData::internal_error(message, None))
    }

    /// The tools as routes list them: one listing for every transport, so the hint only
    /// where every transport can scope writes.
    pub(crate) fn routed_tools(&self) -> Result<Vec<Tool>, String> {
        match self.shared.callers {
            Callers::Unnamed => self.shared.tools.plain.clone(),
            Callers::Single | Callers::Hook(_) => self.shared.tools.hinted.clone(),
        }
    }

    /// False where writes are refused for want of a caller: over HTTP, with no hook, no
    /// single caller declared and no caller an authentication layer named.
    fn scopes_writes(&self, head: Option<&http::request::Parts>) -> bool {
        match (&self.shared.callers, head) {
            (Callers::Unnamed, Some(head)) => head.extensions.get::<McpCaller>().is_some(),
            _ => true,
        }
    }

    /// The caller of a request: `Ok(None)` when the server cannot tell (writes are refused),
    /// `Err` when the hook refused it.
    fn caller_of(&self, head: Option<&http::request::Parts>) -> Result<Option<McpCaller>, String> {
        let authenticated = head.and_then(|h| h.extensions.get::<McpCaller>()).cloned();
        match &self.shared.callers {
            Callers::Hook(CallerHook(identify)) => identify(head).map(Some),
            Callers::Single => Ok(Some(authenticated.unwrap_or_default())),
            // No head: stdio or an in-process transport, whose caller is whoever started it.
            Callers::Unnamed if head.is_none() => Ok(Some(McpCaller::default())),
            Callers::Unnamed => Ok(authenticated),
        }
    }

    /// Carries out one `tools/call`: what [`McpHandler`] and the routes of
    /// [`McpServer::join_router`] answer.
    pub(crate) async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        // Bounded before anything reaches a span or a log: the id becomes the call id.
        let call_id = format!("jsonrpc:{}", context.id);
        if call_id.len() > meta::MAX_CALL_ID_BYTES + "jsonrpc:".len() {
            return Err(ErrorData::invalid_request(
                format!(
                    "the request id is longer than {} bytes; nothing was run",
                    meta::MAX_CALL_ID_BYTES
                ),
                None,
            ));
        }
        // rmcp moves the request's `_meta` into the context; read both in case a caller
        // builds the params by hand.
        let merged;
        let fields = match &request.meta {
            None => &context.meta.0 .0,
            Some(m) => {
                let mut both = m.0 .0.clone();
                both.extend(context.meta.0 .0.clone());
                merged = both;
                &merged
            }
        };
        let head = context.extensions.get::<http::request::Parts>();
        // Who is calling comes first: a caller the host refuses learns nothing else.
        let caller = self
            .caller_of(head)
            .map_err(|reason| ErrorData::invalid_request(cut(&reason, 512), None))?;
        let header = head.and_then(|h| h.headers.get(meta::IDEMPOTENCY_KEY_HEADER));
        let asked = CallMeta::read(fields, header.map(|v| v.as_bytes()))
            .map_err(|m| ErrorData::invalid_params(m, None))?;
        if asked.run.is_some() && !self.shared.client_runs {
            return Err(ErrorData::invalid_params(
                format!(
                    "this server does not take client-named runs (_meta[\"{}\"]); nothing was \
                     run. Leave it out: repeats by one caller are one operation on any \
                     connection; send _meta[\"{}\"] to keep two equal calls apart.",
                    meta::RUN_KEY,
                    meta::IDEMPOTENCY_KEY_META
                ),
                None,
            ));
        }
        let registry = &self.shared.registry;
        // An unknown tool is a protocol error (the request names nothing this server has);
        // everything about the arguments is the model's to correct, so it is a tool result.
        let Some(tool) = registry.get(&request.name) else {
            let refused = CallError::UnknownTool {
                name: cut(&request.name, 64),
            };
            return Err(ErrorData::invalid_params(refused.to_string(), None));
        };
        let caller = match caller {
            Some(caller) => caller,
            // A read has no key: it answers for nobody in particular.
            None if tool.kind() == ToolKind::Read => McpCaller::default(),
            None => return Ok(unscoped_refusal()),
        };
        let run = match &asked.run {
            Some(name) => meta::client_run(name),
            None => meta::CALLER_RUN.to_owned(),
        };
        // `arguments` is optional in MCP: left out, it is an empty object (which a tool
        // without arguments takes too), not `null`, which a struct of optional fields refuses.
        let args = Value::Object(request.arguments.unwrap_or_default());
        let mut call = ToolCall::new(run, request.name.to_string(), args).call_id(call_id);
        if let Some(intent) = asked.intent {
            call = call.intent(intent);
        }
        if let Some(tenant) = caller.tenant {
            call = call.tenant(tenant);
        }
        if let Some(principal) = caller.principal {
            call = call.principal(principal);
        }
        // Polled here, on the transport's request task; if the transport drops this future
        // when the client goes away (cancels, hangs up), the call finishes on a task of its
        // own, so a claimed write runs to its end and settles its record: a retry gets what
        // it recorded.
        // The call owns a handle of its own (it may outlive this future); `tool` stays
        // borrowed from the server's.
        let registry = registry.clone();
        let result = RunToEnd::new(async move { registry.call(call).await }).await;
        let schema = self.shared.output_schemas.get(tool.spec().name());
        Ok(call_tool_result(tool.spec(), result, schema))
    }
}

/// The rmcp [`ServerHandler`] of one connection: made by [`McpServer::handler`], served by
/// rmcp (`rmcp::ServiceExt::serve` on any transport).
#[derive(Debug)]
pub struct McpHandler {
    server: McpServer,
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder().enable_tools().build();
        let shared = &self.server.shared;
        let mut info = InitializeResult::new(capabilities).with_server_info(shared.info.clone());
        if let Some(instructions) = &shared.instructions {
            info = info.with_instructions(instructions.clone());
        }
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.server.tools_for(&context)?,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self.server.call_tool(request, &context).await?.into())
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

/// A write over HTTP whose caller the server cannot tell.
fn unscoped_refusal() -> CallToolResult {
    let text = "refused: this server cannot tell its HTTP callers apart, so it cannot keep one \
                caller's repeats from another's; nothing was done. The server's host must \
                identify callers (McpServer::caller, or an authentication layer), or declare \
                that it serves one (McpServer::single_caller).";
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
/// ([`mcp_structured_content`](crate::definitions::mcp_structured_content): the output itself when it is a JSON object, `{"result": …}`
/// when the tool's output schema is wrapped), and what idem knows in `_meta`
/// ([`meta::OUTCOME_KEY`], [`meta::KEY_KEY`], [`meta::REPLAYED_KEY`]).
///
/// A tool with an `outputSchema` promises structured content with every success, and clients
/// hold it to that (the official Python SDK raises otherwise). So a completed call of such a
/// tool that has no structured content to give — its saved result expired ("already done;
/// result no longer kept") — is sent with `isError`, its text saying what happened. So is one
/// whose output does not validate against the outputSchema (checked before it is sent): one
/// a person recorded with only a downstream reference, or a read-back settled. For an
/// outputSchema the check cannot evaluate (see [the module](super#what-a-client-sees)), only
/// a fresh output, the handler's own, is sent as structured content, and a replay is that
/// error. The schema is compiled on each call here (and a warning logged each time for one
/// the check cannot evaluate); [`McpServer`] compiles each tool's once.
pub fn to_call_tool_result(spec: &ToolSpec, result: &ToolResult) -> CallToolResult {
    call_tool_result(spec, result.clone(), OutputSchema::of(spec).as_ref())
}

/// A tool's outputSchema, compiled, to check structured content against before it is sent
/// (`None` inside: the schema uses what [`Validator`] cannot check, so no output is judged
/// valid against it but the handler's own, fresh one; see [`super::output_schema`]).
#[derive(Clone, Debug)]
struct OutputSchema(Option<Arc<Validator>>);

impl OutputSchema {
    /// The compiled outputSchema of the tool `spec` describes; `None` without one.
    fn of(spec: &ToolSpec) -> Option<OutputSchema> {
        let schema = mcp_output_schema(spec)?;
        match Validator::compile(&schema) {
            Ok(v) => Some(OutputSchema(Some(Arc::new(v)))),
            Err(e) => {
                tracing::warn!(
                    tool = spec.name(),
                    reason = %e,
                    "outputSchema cannot be checked: a replayed output (one a person recorded or \
                     a read-back settled) is sent without structuredContent, as an error"
                );
                Some(OutputSchema(None))
            }
        }
    }

    /// True when `structured`, the structured content of a result (`replayed` or not), may
    /// be sent: it is valid against the schema, or, for a schema that cannot be checked, it
    /// is the handler's own output of this call (serialized from the type the schema
    /// describes), not a replay.
    fn admits(&self, structured: &Value, replayed: bool) -> bool {
        match &self.0 {
            Some(v) => v.is_valid(structured),
            None => !replayed,
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
    result: ToolResult,
    schema: Option<&OutputSchema>,
) -> CallToolResult {
    let content = vec![ContentBlock::text(result.text())];
    let succeeded = succeeded(&result);
    let replayed = result.replayed();
    let mut m = MetaObject::new();
    let outcome = result.class().map_or("refused", OutcomeClass::as_str);
    m.0.insert(meta::OUTCOME_KEY.to_owned(), Value::from(outcome));
    if let Some(key) = result.key() {
        m.0.insert(meta::KEY_KEY.to_owned(), Value::from(key.as_str()));
    }
    m.0.insert(meta::REPLAYED_KEY.to_owned(), Value::Bool(replayed));
    // The output moves into the structured content: the result is not needed past here.
    let structured = match result.into_result() {
        Ok(Outcome::Completed { output }) => into_mcp_structured_content(spec, output),
        _ => None,
    }
    .filter(|structured| schema.is_none_or(|s| s.admits(structured, replayed)));
    let mut out = match (succeeded, structured) {
        (true, Some(structured)) => {
            let mut ok = CallToolResult::success(content);
            ok.structured_content = Some(structured);
            ok
        }
        // A tool has a compiled schema exactly when it has an outputSchema.
        (true, None) if schema.is_none() => CallToolResult::success(content),
        _ => CallToolResult::error(content),
    };
    out.meta = Some(m);
    out
}
