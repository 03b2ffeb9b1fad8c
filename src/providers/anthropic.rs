//! Anthropic: the Messages API (feature `anthropic`).
//!
//! Plain serde types over the documented JSON, as far as tool use goes. Offer the tools with
//! [`Registry::definitions`] in [`Format::Anthropic`](crate::Format::Anthropic).
//!
//! One turn of the loop:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::providers::anthropic::{self, AssistantMessage};
//! use idem::{tool, Registry, Scope, ToolError, WriteCtx};
//! use serde_json::json;
//!
//! #[idem::args]
//! struct SendArgs { to: String }
//!
//! /// Send a welcome mail.
//! #[tool(write)]
//! async fn send_welcome(_ctx: WriteCtx, args: SendArgs) -> Result<String, ToolError> {
//!     Ok(format!("sent to {}", args.to))
//! }
//!
//! let registry = Registry::builder().tool(send_welcome).build()?;
//! // The model's reply (`stop_reason: "tool_use"`):
//! let reply = json!({"role": "assistant", "content": [
//!     {"type": "text", "text": "Sending it."},
//!     {"type": "tool_use", "id": "toolu_01", "name": "send_welcome",
//!      "input": {"to": "ada@example.com"}},
//!     {"type": "tool_use", "id": "toolu_02", "name": "send_welcome", "input": {"to": 7}}
//! ]});
//! let message: AssistantMessage = serde_json::from_value(reply.clone())?;
//! let results = anthropic::tool_results(&registry, &Scope::run("run-1"), &message).await;
//! // Append `reply`, then one user message holding every result, and ask the model again:
//! let _next = json!({"role": "user", "content": results});
//! assert_eq!(results[0].tool_use_id, "toolu_01");
//! assert!(!results[0].is_error);
//! assert!(results[1].is_error && results[1].content.contains("invalid arguments"));
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{answered_id, call_all, is_error, item_from_value, null_as_empty};
use crate::{Registry, Scope, ToolCall, ToolResult};

/// A Messages API assistant message (the reply, or an assistant turn of the conversation),
/// as far as tool use goes. Other fields are ignored: append the message to the
/// conversation as you received it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct AssistantMessage {
    /// The content blocks, in the model's order. A turn of the conversation written with
    /// string content (`"content": "Sure."`, which the API accepts for any message) is one
    /// text block, kept as [`ContentBlock::Other`]; `null` or absent is no blocks.
    #[serde(default, deserialize_with = "blocks_or_text")]
    pub content: Vec<ContentBlock>,
}

/// `content` as the API takes it: a list of blocks, or a string that stands for one text
/// block.
fn blocks_or_text<'de, D>(deserializer: D) -> Result<Vec<ContentBlock>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    match Value::deserialize(deserializer)? {
        Value::String(text) => Ok(vec![ContentBlock::Other(
            serde_json::json!({"type": "text", "text": text}),
        )]),
        other => null_as_empty(other).map_err(serde::de::Error::custom),
    }
}

/// One content block: a `tool_use`, or anything else (text, thinking, a server tool's
/// use), kept as received.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "Value", untagged)]
pub enum ContentBlock {
    /// `{"type": "tool_use", ..}`.
    ToolUse(ToolUse),
    /// Any other block, as received.
    Other(Value),
}

/// A `tool_use` block: `{"type": "tool_use", "id", "name", "input"}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename = "tool_use")]
pub struct ToolUse {
    /// The model's id for the call, answered as `tool_use_id`.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as a JSON object (the registry checks the shape).
    pub input: Value,
}

/// The answer to one tool use: `{"type": "tool_result", "tool_use_id", "content",
/// "is_error"}`. Every result of one assistant message goes back in one user message.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename = "tool_result")]
pub struct ToolResultBlock {
    /// The `id` of the `tool_use` this answers.
    pub tool_use_id: String,
    /// What the model is told ([`ToolResult::text`]).
    pub content: String,
    /// True for everything but a completed call, fresh or replayed ([`super::is_error`]).
    #[serde(default)]
    pub is_error: bool,
}

item_from_value!(ContentBlock, ToolUse, "tool_use");

impl ToolUse {
    /// The call for [`Registry::call`], in `scope`, under the model's `tool_use_id`.
    pub fn to_call(&self, scope: &Scope) -> ToolCall {
        ToolCall::new(scope.run_id(), &self.name, self.input.clone())
            .scope(scope.clone())
            .call_id(&self.id)
    }
}

impl AssistantMessage {
    /// The `tool_use` blocks, in the model's order.
    pub fn tool_uses(&self) -> impl Iterator<Item = &ToolUse> {
        self.content.iter().filter_map(|block| match block {
            ContentBlock::ToolUse(t) => Some(t),
            ContentBlock::Other(_) => None,
        })
    }

    /// The tool uses as [`ToolCall`]s in `scope`, in the model's order.
    pub fn to_calls(&self, scope: &Scope) -> Vec<ToolCall> {
        self.tool_uses().map(|t| t.to_call(scope)).collect()
    }
}

impl From<&ToolResult> for ToolResultBlock {
    /// The answer under the result's call id.
    fn from(result: &ToolResult) -> Self {
        ToolResultBlock {
            tool_use_id: answered_id(result),
            content: result.text(),
            is_error: is_error(result),
        }
    }
}

/// Runs every `tool_use` of `message` concurrently and answers each with a `tool_result`
/// block, in the model's order. Never fails: a call that cannot run is answered with why.
pub async fn tool_results(
    registry: &Registry,
    scope: &Scope,
    message: &AssistantMessage,
) -> Vec<ToolResultBlock> {
    let results = call_all(registry, message.to_calls(scope)).await;
    results.iter().map(ToolResultBlock::from).collect()
}
