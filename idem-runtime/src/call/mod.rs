//! A call as the agent loop makes it, and what it gets back.

mod error;

pub use error::CallError;

use serde_json::Value;

use crate::identity::{IdemKey, Scope};
use crate::outcome::{Outcome, OutcomeClass};

#[derive(Clone, Debug)]
pub(crate) enum CallArgs {
    Value(Value),
    Text(String),
}

/// One tool call: scope, tool name, arguments, and optionally the model's call id and an
/// explicit intent id.
///
/// **Scope.** The key is derived from the scope (run id, and the tenant and principal when
/// set), the tool and the arguments or intent id. [`ToolCall::new`] scopes by run id alone:
/// when one store serves several tenants and run ids are not unique across them, add the
/// tenant with [`ToolCall::tenant`], or two tenants' equal calls share one key and one
/// saved result. `RegistryBuilder::require_tenant(true)` makes the registry refuse calls
/// without one. The run id, tenant and principal come from the host, never from the model.
///
/// ```
/// # use idem_runtime::call::ToolCall;
/// # use serde_json::json;
/// let call = ToolCall::new("run-7", "charge_card", json!({"customer": "acme", "cents": 4900}))
///     .call_id("toolu_01A")          // the model's tool_use_id: logged, never part of the key
///     .intent("order-1234-charge");  // optional: an intent id minted before the first send
/// ```
#[derive(Clone, Debug)]
pub struct ToolCall {
    pub(crate) scope: Scope,
    pub(crate) tool: String,
    pub(crate) args: CallArgs,
    pub(crate) call_id: Option<String>,
    pub(crate) intent: Option<String>,
}

impl ToolCall {
    /// A call of `tool` in run `run_id` with JSON arguments, scoped by the run id alone (see
    /// the type's docs on tenants).
    pub fn new(run_id: impl Into<String>, tool: impl Into<String>, args: Value) -> Self {
        ToolCall {
            scope: Scope::run(run_id),
            tool: tool.into(),
            args: CallArgs::Value(args),
            call_id: None,
            intent: None,
        }
    }

    /// A call whose arguments are the model's raw JSON text (parsed, and size-checked, by the
    /// registry; malformed JSON is a [`CallError::MalformedJson`]).
    pub fn from_json(
        run_id: impl Into<String>,
        tool: impl Into<String>,
        args_json: impl Into<String>,
    ) -> Self {
        ToolCall {
            scope: Scope::run(run_id),
            tool: tool.into(),
            args: CallArgs::Text(args_json.into()),
            call_id: None,
            intent: None,
        }
    }

    /// Sets the model's id for this call (`tool_use_id` / `call_id`). Kept for logs; never
    /// part of the key, since the model mints a new one when it re-issues a call.
    pub fn call_id(mut self, call_id: impl Into<String>) -> Self {
        self.call_id = Some(call_id.into());
        self
    }

    /// Sets an explicit intent id: the key is derived from it instead of the arguments. Mint
    /// it (and store it) before the first send, e.g. one per order, so that two intended
    /// actions with equal arguments get two keys and a resumed run reuses the same one.
    pub fn intent(mut self, intent_id: impl Into<String>) -> Self {
        self.intent = Some(intent_id.into());
        self
    }

    /// Narrows the scope to a tenant.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.scope = self.scope.with_tenant(tenant);
        self
    }

    /// Narrows the scope to a principal.
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.scope = self.scope.with_principal(principal);
        self
    }

    /// Replaces the whole scope.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.tool
    }
}

/// What a call ended in: the structured outcome (or why it could not run) and a short text
/// for the model.
#[derive(Clone, Debug)]
pub struct ToolResult {
    pub(crate) tool: String,
    pub(crate) key: Option<IdemKey>,
    pub(crate) call_id: Option<String>,
    pub(crate) result: Result<Outcome, CallError>,
    pub(crate) replayed: bool,
    pub(crate) attempts: u32,
}

impl ToolResult {
    /// The result of a call refused before it reached a registry: nothing ran, no key was
    /// derived. For an integration that turns a model's call down itself, such as a streamed
    /// call whose arguments outgrew the registry's limit before they were complete (the
    /// text was dropped as it came, so there is nothing to hand the registry).
    ///
    /// ```
    /// # use idem_runtime::call::{CallError, ToolResult};
    /// let refused = ToolResult::refused(
    ///     "charge_card",
    ///     Some("call_7".into()),
    ///     CallError::ArgsTooLarge { size: 5 << 30, limit: 1 << 20 },
    /// );
    /// assert!(refused.is_error() && refused.attempts() == 0);
    /// assert_eq!(refused.call_id(), Some("call_7"));
    /// assert!(refused.text().contains("nothing was done"));
    /// ```
    pub fn refused(tool: impl Into<String>, call_id: Option<String>, error: CallError) -> Self {
        ToolResult {
            tool: tool.into(),
            key: None,
            call_id,
            result: Err(error),
            replayed: false,
            attempts: 0,
        }
    }

    /// The tool that was called.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The operation's key (writes that got far enough to derive one).
    pub fn key(&self) -> Option<&IdemKey> {
        self.key.as_ref()
    }

    /// The model's call id, as given.
    pub fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }

    /// The outcome, when the call was carried out (or replayed).
    pub fn outcome(&self) -> Option<&Outcome> {
        self.result.as_ref().ok()
    }

    /// Why the call could not be carried out.
    pub fn error(&self) -> Option<&CallError> {
        self.result.as_ref().err()
    }

    /// The outcome as a `Result`.
    pub fn as_result(&self) -> Result<&Outcome, &CallError> {
        self.result.as_ref()
    }

    /// Consumes the result into the outcome as a `Result`.
    pub fn into_result(self) -> Result<Outcome, CallError> {
        self.result
    }

    /// The outcome's class, when there is an outcome.
    pub fn class(&self) -> Option<OutcomeClass> {
        self.outcome().map(Outcome::class)
    }

    /// True for a completed outcome (fresh or replayed).
    pub fn is_completed(&self) -> bool {
        matches!(self.outcome(), Some(Outcome::Completed { .. }))
    }

    /// The output of a completed call.
    pub fn output(&self) -> Option<&Value> {
        match self.outcome() {
            Some(Outcome::Completed { output }) => Some(output),
            _ => None,
        }
    }

    /// True when this call did not run the handler but returned an earlier call's record.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// How many times this call ran the handler (0 for a replay or a refusal).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The short text for the model's `tool_result`. It reports the state; the executor, not
    /// this text, enforces it.
    pub fn text(&self) -> String {
        match &self.result {
            Ok(outcome) => outcome.model_text(self.replayed),
            Err(e) => e.model_text(),
        }
    }

    /// True when the model should see this as an error (`is_error` in Anthropic's API,
    /// `isError` in MCP): everything but a completed call, fresh or replayed.
    ///
    /// Pending, unknown and escalated calls are errors too: none is a success the model may
    /// build on, and the text says what state the call is in. A refusal executed nothing.
    /// An expired result counts as what it was: the tombstone of a completion is not an
    /// error, that of a failure is. Every integration (MCP, the providers, rig) uses this,
    /// with one exception forced by MCP: a tool that lists an `outputSchema` must return
    /// structured content with every success, so there an expired completion, which has no
    /// content left, is sent as an error (its `_meta` outcome still says completed).
    pub fn is_error(&self) -> bool {
        !matches!(
            self.outcome(),
            Some(
                Outcome::Completed { .. }
                    | Outcome::ResultExpired {
                        was: OutcomeClass::Completed
                    }
            )
        )
    }
}
