//! idem tools inside [rig](https://docs.rs/rig-core) agents (feature `rig`).
//!
//! [`tools`] turns every tool of a [`Registry`] into a rig [`DynamicTool`]: the definition
//! rig sends the model (name, description, JSON Schema) is idem's, and every call goes
//! through [`Registry::call`], so a rig agent that repeats a write causes one effect.
//!
//! The key's scope is the agent *run*: rig hands each tool call the run's
//! [`ToolContext`], and the tools read the run's [`Scope`] from it ([`IdemRun`]). Bind it per
//! run with [`AgentRunnerExt::idem_run`] (or [`run_context`] for a context of your own):
//!
//! ```no_run
//! # async fn run(model: rig_agent::core::DynModel<rig_agent::core::operation::Completion>, registry: idem::Registry) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::rig::AgentRunnerExt;
//! use idem::Scope;
//!
//! let agent = rig_agent::AgentBuilder::new(model)
//!     .default_max_turns(8)
//!     .dynamic_tools(idem::rig::tools(&registry))
//!     .build();
//! // Saved results never cross runs: "run-7" is the scope of every key this run derives.
//! let reply = agent.prompt("Charge cus_42 for in_7").idem_run(Scope::run("run-7")).await?;
//! # let _ = reply; Ok(()) }
//! ```
//!
//! A rig conversation can be the run: [`AgentRunnerExt::idem_conversation`] sets the run's
//! conversation id (rig's `AgentRunner::conversation`, which conversation memory loads and
//! saves under) and binds the same id as the idem run, so every run of one conversation
//! shares its saved results and another conversation has its own:
//!
//! ```no_run
//! # async fn run(agent: rig_agent::Agent) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::rig::AgentRunnerExt;
//!
//! // A second prompt in "thread-9" that repeats the charge replays it.
//! let reply = agent.prompt("Charge cus_42 for in_7").idem_conversation("thread-9").await?;
//! # let _ = reply; Ok(()) }
//! ```
//!
//! rig-agent 0.44 does not show a run's conversation id to its tools: it keeps it in the
//! agent's configuration (crate-private, with no getter) for conversation memory only, and a
//! tool call gets the runner's [`ToolContext`] alone. So the conversation becomes the run
//! through this one method, which sets both; a conversation set with rig's own
//! `conversation(..)` is not seen, and a call in it is refused as below.
//!
//! A call without a bound run is refused (nothing runs) rather than given a run id the
//! caller did not choose: a guessed scope would merge, or split, operations silently.
//!
//! What the model sees: a completed call's output (a replay says so); every other outcome
//! is a tool error carrying idem's text for the model, marked not retryable, since the
//! executor — not rig, not the model — decides whether anything is sent again.

use rig_core::message::ToolName;
use rig_core::tool::{ContextValue, DynamicTool, ToolContext, ToolExecutionError, ToolOutput};
use rig_core::wasm_compat::WasmBoxedFuture;
use serde::{Deserialize, Serialize};

use crate::{CallError, Outcome, OutcomeClass, Registry, Scope, ToolCall, ToolResult};

/// The idem scope of one agent run, as it travels in rig's [`ToolContext`] (key `idem.run`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRun(pub Scope);

impl ContextValue for IdemRun {
    const KEY: &'static str = "idem.run";
}

/// A tool context holding `scope`, for `AgentRunner::tool_context` (insert your own
/// values next to it).
pub fn run_context(scope: Scope) -> ToolContext {
    let mut context = ToolContext::new();
    // A `Scope` is plain strings: encoding it cannot fail.
    let _ = context.insert(IdemRun(scope));
    context
}

/// Binds an idem run to a rig agent run.
pub trait AgentRunnerExt: Sized {
    /// Sets the run's tool context to one holding `scope` ([`run_context`]); it replaces a
    /// context set before.
    fn idem_run(self, scope: Scope) -> Self;

    /// Sets the run's rig conversation id (`AgentRunner::conversation`) and binds the same
    /// id as its idem run (`Scope::run(id)`, in a tool context that replaces one set before).
    /// For a run with a tenant or a principal, set rig's conversation and bind the scope
    /// yourself: `.conversation(id).idem_run(scope)`.
    ///
    /// ```no_run
    /// # async fn run(agent: rig_agent::Agent) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem::rig::AgentRunnerExt;
    /// let reply = agent.prompt("Refund in_7").idem_conversation("thread-9").await?;
    /// # let _ = reply; Ok(()) }
    /// ```
    fn idem_conversation(self, id: impl Into<String>) -> Self;
}

impl<O> AgentRunnerExt for rig_agent::AgentRunner<O> {
    fn idem_run(self, scope: Scope) -> Self {
        self.tool_context(run_context(scope))
    }

    fn idem_conversation(self, id: impl Into<String>) -> Self {
        let id = id.into();
        let scope = Scope::run(id.as_str());
        self.conversation(id).idem_run(scope)
    }
}

/// Every tool of `registry` as a rig [`DynamicTool`], in registration order. The run's
/// scope comes from each call's [`ToolContext`] ([`IdemRun`]).
pub fn tools(registry: &Registry) -> Vec<DynamicTool> {
    registry
        .tools()
        .filter_map(|tool| {
            let spec = tool.spec();
            // A registered name is 1–64 characters, never the empty name rig refuses.
            let name = ToolName::new(spec.name()).ok()?;
            let registry = registry.clone();
            let tool_name = spec.name().to_owned();
            Some(DynamicTool::new_with_context(
                name,
                spec.description_text(),
                tool.input_schema().clone(),
                move |context, args| call(&registry, &tool_name, context, args),
            ))
        })
        .collect()
}

/// One call of `tool` by a rig agent, in the scope its run's context holds.
fn call<'a>(
    registry: &Registry,
    tool: &str,
    context: &'a mut ToolContext,
    args: serde_json::Value,
) -> WasmBoxedFuture<'a, Result<ToolOutput, ToolExecutionError>> {
    let scope = context.get::<IdemRun>();
    let registry = registry.clone();
    let tool = tool.to_owned();
    Box::pin(async move {
        let Ok(Some(IdemRun(scope))) = scope else {
            return Err(no_run(&tool));
        };
        let call = ToolCall::new(scope.run_id(), tool, args).scope(scope);
        to_rig(registry.call(call).await)
    })
}

fn no_run(tool: &str) -> ToolExecutionError {
    ToolExecutionError::other(format!(
        "`{tool}` was called outside an idem run; nothing was done. Bind the agent run's \
         scope with idem::rig::AgentRunnerExt::idem_run (or idem::rig::run_context), or make \
         its rig conversation the run with AgentRunnerExt::idem_conversation (rig does not \
         show a conversation set otherwise to tools)"
    ))
    .with_retryable(false)
}

/// A fresh completion's output as JSON; a replay as idem's text (it says it was not sent
/// again); everything else a non-retryable tool error with idem's text for the model.
fn to_rig(result: ToolResult) -> Result<ToolOutput, ToolExecutionError> {
    let completed = matches!(
        result.outcome(),
        Some(
            Outcome::Completed { .. }
                | Outcome::ResultExpired {
                    was: OutcomeClass::Completed
                }
        )
    );
    if completed {
        return Ok(match result.output() {
            Some(output) if !result.replayed() => ToolOutput::json(output.clone()),
            _ => ToolOutput::text(result.text()),
        });
    }
    let text = result.text();
    let error = match result.error() {
        Some(
            CallError::MalformedJson { .. }
            | CallError::InvalidArgs { .. }
            | CallError::ArgsTooLarge { .. },
        ) => ToolExecutionError::invalid_args(text),
        Some(CallError::UnknownTool { .. }) => ToolExecutionError::not_found(text),
        Some(CallError::ChangedParams { .. }) => ToolExecutionError::refused(text),
        _ => match result.outcome() {
            Some(Outcome::Rejected { .. }) => ToolExecutionError::refused(text),
            _ => ToolExecutionError::other(text),
        },
    };
    Err(error.with_retryable(false))
}
