//! idem's tools as rmcp routes, for a host that keeps its own [`ServerHandler`]: its
//! `#[tool_router]`, prompts, resources and plain tools.
//!
//! [`ServerHandler`]: rmcp::ServerHandler

use std::fmt;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::CallToolRequestParams;

use super::McpServer;

/// Why idem's tools could not join a router.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoinError {
    /// The router already has a tool of this name. rmcp's own `merge` (and `+`) would let
    /// the later route replace the earlier one without a word; idem refuses instead, so no
    /// call meant for one tool silently runs the other.
    NameClash {
        /// The tool both define.
        name: String,
    },
    /// A tool's MCP definition is not one rmcp can read.
    Definition {
        /// What was wrong, naming the tool.
        message: String,
    },
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::NameClash { name } => write!(
                f,
                "the router already has a tool named `{name}`; rename one of them"
            ),
            JoinError::Definition { message } => f.write_str(message),
        }
    }
}

impl std::error::Error for JoinError {}

impl McpServer {
    /// The registry's tools as routes of a host's [`ToolRouter`], for any handler type `S`.
    /// Each route keeps the promise of the standalone server: the call's scope is its caller
    /// ([`McpServer::caller`], [`McpServer::single_caller`], an authentication layer),
    /// intents and idempotency keys are honoured, a call keeps running to its end when the
    /// client goes away, and results carry the same `_meta`, `isError` and structured
    /// content.
    ///
    /// A router lists its tools once, for every transport, so writes are listed with
    /// `idempotentHint` only over a durable store on a server whose callers are named by
    /// its host (a hook or a single caller).
    pub fn tool_routes<S: Send + Sync + 'static>(&self) -> Result<ToolRouter<S>, JoinError> {
        let tools = self
            .routed_tools()
            .map_err(|message| JoinError::Definition { message })?;
        let mut router = ToolRouter::new();
        for tool in tools {
            let server = self.clone();
            router.add_route(ToolRoute::new_dyn(
                tool,
                move |context: ToolCallContext<'_, S>| {
                    let server = server.clone();
                    let mut request = CallToolRequestParams::new(context.name.clone());
                    request.arguments = context.arguments;
                    let request_context = context.request_context;
                    Box::pin(async move {
                        server
                            .call_tool(request, &request_context)
                            .await
                            .map(Into::into)
                    })
                },
            ));
        }
        Ok(router)
    }

    /// `router` with the registry's tools added ([`McpServer::tool_routes`]), or an error
    /// naming the first tool both define (nothing is replaced).
    ///
    /// ```no_run
    /// use idem::mcp::rmcp::handler::server::router::tool::ToolRouter;
    /// # struct Host;
    /// # fn host_router() -> ToolRouter<Host> { ToolRouter::new() }
    /// # fn run(registry: idem::Registry) -> Result<(), idem::mcp::JoinError> {
    /// let server = idem::mcp::McpServer::new(registry).single_caller();
    /// let router: ToolRouter<Host> = server.join_router(host_router())?;
    /// // The host's `ServerHandler` answers `tools/list` with `router.list_all()` and
    /// // `tools/call` with `router.call(..)`, as `#[tool_handler]` generates.
    /// # let _ = router; Ok(()) }
    /// ```
    pub fn join_router<S: Send + Sync + 'static>(
        &self,
        mut router: ToolRouter<S>,
    ) -> Result<ToolRouter<S>, JoinError> {
        let routes = self.tool_routes::<S>()?;
        let mut names: Vec<&str> = routes.map.keys().map(|n| n.as_ref()).collect();
        names.sort_unstable();
        // Disabled routes count: the host may enable them again.
        if let Some(name) = names.into_iter().find(|n| router.map.contains_key(*n)) {
            return Err(JoinError::NameClash {
                name: name.to_owned(),
            });
        }
        for route in routes {
            router.add_route(route);
        }
        Ok(router)
    }
}
