//! OpenAI: the Chat Completions and the Responses APIs (feature `openai`).
//!
//! Plain serde types over the documented JSON, as far as tool calls go. Offer the tools with
//! [`Registry::definitions`] in [`Format::OpenAi`](crate::Format::OpenAi) (Chat Completions)
//! or [`Format::OpenAiResponses`](crate::Format::OpenAiResponses) (Responses).
//!
//! Chat Completions, one turn of the loop:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::providers::openai::{self, ChatAssistantMessage};
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
//! // `choices[0].message` of the model's reply:
//! let reply = json!({"role": "assistant", "content": null, "tool_calls": [
//!     {"id": "call_1", "type": "function",
//!      "function": {"name": "send_welcome", "arguments": "{\"to\": \"ada@example.com\"}"}},
//!     {"id": "call_2", "type": "function",
//!      "function": {"name": "send_welcome", "arguments": "{\"to\": "}}
//! ]});
//! let message: ChatAssistantMessage = serde_json::from_value(reply.clone())?;
//! let answers = openai::chat_tool_messages(&registry, &Scope::run("run-1"), &message).await;
//! // Append `reply`, then each answer, to the conversation and ask the model again.
//! assert_eq!(answers[0].tool_call_id, "call_1");
//! assert_eq!(answers[0].content, "sent to ada@example.com");
//! assert!(answers[1].content.contains("not valid JSON")); // told, not thrown
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{answered_id, call_all, item_from_value, null_as_empty, text_call};
use crate::{Registry, Scope, ToolCall, ToolResult};

// ---- Chat Completions --------------------------------------------------------------------

/// A Chat Completions assistant message (`choices[i].message`), as far as tool calls go.
/// Other fields are ignored: append the message to the conversation as you received it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ChatAssistantMessage {
    /// The tool calls, in the model's order (`null` or absent: none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ChatToolCallItem>,
}

/// One entry of `tool_calls`: a function call, or another kind (e.g. a `custom` tool call),
/// which is not an idem tool and is left to the caller.
///
/// An entry whose `type` is missing or `null` but that has a `function` member is read as a
/// function call: some OpenAI-compatible servers send it so, and passing it over as another
/// kind would leave the model's call without an answer.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "Value", untagged)]
pub enum ChatToolCallItem {
    /// `{"type": "function", ..}`.
    Function(ChatToolCall),
    /// Any other type, as received.
    Other(Value),
}

/// A function tool call: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename = "function")]
pub struct ChatToolCall {
    /// The call's id, answered as `tool_call_id`.
    pub id: String,
    /// The function and the model's arguments.
    pub function: ChatFunctionCall,
}

/// The function a [`ChatToolCall`] calls.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct ChatFunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not always valid.
    pub arguments: String,
}

/// The answer to one tool call: `{"role": "tool", "tool_call_id", "content"}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "role", rename = "tool")]
pub struct ChatToolMessage {
    /// The id of the call this answers.
    pub tool_call_id: String,
    /// What the model is told ([`ToolResult::text`]).
    pub content: String,
}

impl ChatToolCall {
    /// The call for [`Registry::call`], in `scope`, under the model's call id. The arguments
    /// text is decoded by the registry: malformed JSON is refused with a message for the
    /// model, and nothing runs.
    pub fn to_call(&self, scope: &Scope) -> ToolCall {
        text_call(
            scope,
            &self.id,
            &self.function.name,
            &self.function.arguments,
        )
    }
}

impl ChatAssistantMessage {
    /// The function calls, in the model's order.
    pub fn function_calls(&self) -> impl Iterator<Item = &ChatToolCall> {
        self.tool_calls.iter().filter_map(|item| match item {
            ChatToolCallItem::Function(call) => Some(call),
            ChatToolCallItem::Other(_) => None,
        })
    }

    /// The function calls as [`ToolCall`]s in `scope`, in the model's order.
    pub fn to_calls(&self, scope: &Scope) -> Vec<ToolCall> {
        self.function_calls().map(|c| c.to_call(scope)).collect()
    }
}

impl From<&ToolResult> for ChatToolMessage {
    /// The answer under the result's call id.
    fn from(result: &ToolResult) -> Self {
        ChatToolMessage {
            tool_call_id: answered_id(result),
            content: result.text(),
        }
    }
}

/// Runs every function call of `message` concurrently and answers each with a `tool`
/// message, in the model's order. Never fails: a call that cannot run is answered with why.
pub async fn chat_tool_messages(
    registry: &Registry,
    scope: &Scope,
    message: &ChatAssistantMessage,
) -> Vec<ChatToolMessage> {
    let results = call_all(registry, message.to_calls(scope)).await;
    results.iter().map(ChatToolMessage::from).collect()
}

// ---- Responses ----------------------------------------------------------------------------

/// A Responses API reply (`{"output": [..]}`), as far as function calls go. Other fields
/// are ignored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ResponsesOutput {
    /// The output items, in the model's order.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub output: Vec<ResponsesItem>,
}

/// One output item: a function call, or anything else (a message, reasoning, a built-in
/// tool's call), kept as received so it can go back into the next request's `input`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "Value", untagged)]
pub enum ResponsesItem {
    /// `{"type": "function_call", ..}`.
    FunctionCall(FunctionCall),
    /// Any other item, as received.
    Other(Value),
}

/// A `function_call` output item: `{"type": "function_call", "call_id", "name",
/// "arguments", "id"?, "status"?}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename = "function_call")]
pub struct FunctionCall {
    /// The item's id (`fc_…`), when the API gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model's id for the call, answered as `call_id`.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not always valid.
    pub arguments: String,
    /// `in_progress`, `completed` or `incomplete`, when the API gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// The answer to one function call: `{"type": "function_call_output", "call_id", "output"}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename = "function_call_output")]
pub struct FunctionCallOutput {
    /// The `call_id` of the call this answers.
    pub call_id: String,
    /// What the model is told ([`ToolResult::text`]).
    pub output: String,
}

impl FunctionCall {
    /// The call for [`Registry::call`], in `scope`, under the model's `call_id`. The
    /// arguments text is decoded by the registry: malformed JSON is refused with a message
    /// for the model, and nothing runs.
    pub fn to_call(&self, scope: &Scope) -> ToolCall {
        text_call(scope, &self.call_id, &self.name, &self.arguments)
    }
}

impl ResponsesOutput {
    /// The function calls, in the model's order.
    pub fn function_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.output.iter().filter_map(|item| match item {
            ResponsesItem::FunctionCall(call) => Some(call),
            ResponsesItem::Other(_) => None,
        })
    }

    /// The function calls as [`ToolCall`]s in `scope`, in the model's order.
    pub fn to_calls(&self, scope: &Scope) -> Vec<ToolCall> {
        self.function_calls().map(|c| c.to_call(scope)).collect()
    }
}

impl From<&ToolResult> for FunctionCallOutput {
    /// The answer under the result's call id.
    fn from(result: &ToolResult) -> Self {
        FunctionCallOutput {
            call_id: answered_id(result),
            output: result.text(),
        }
    }
}

/// Runs every function call of `output` concurrently and answers each with a
/// `function_call_output` item, in the model's order. Never fails: a call that cannot run is
/// answered with why.
pub async fn function_call_outputs(
    registry: &Registry,
    scope: &Scope,
    output: &ResponsesOutput,
) -> Vec<FunctionCallOutput> {
    let results = call_all(registry, output.to_calls(scope)).await;
    results.iter().map(FunctionCallOutput::from).collect()
}

impl TryFrom<Value> for ChatToolCallItem {
    type Error = String;
    fn try_from(mut value: Value) -> Result<Self, String> {
        if let Value::Object(item) = &mut value {
            let untyped = item.get("type").is_none_or(Value::is_null);
            if untyped && item.contains_key("function") {
                item.insert("type".into(), Value::String("function".into()));
            }
        }
        Ok(match super::typed_item(value, "function")? {
            Ok(call) => ChatToolCallItem::Function(call),
            Err(other) => ChatToolCallItem::Other(other),
        })
    }
}
item_from_value!(ResponsesItem, FunctionCall, "function_call");
