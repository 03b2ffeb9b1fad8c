//! [async-openai](https://docs.rs/async-openai/0.43)'s own types in and out (feature
//! `async-openai`, for async-openai 0.43 with only its `chat-completion-types` and
//! `response-types` features: idem brings no HTTP client; yours sends the requests).
//!
//! The same edge as `idem::providers::openai` (feature `openai`), over async-openai's types
//! instead of plain JSON:
//!
//! | API | in | out | tools |
//! |---|---|---|---|
//! | Chat Completions | [`chat_calls`] of a `ChatCompletionResponseMessage` | [`chat_tool_message`] (a `tool` request message) | [`chat_tools`] |
//! | Responses | [`response_calls`] of a `Response`'s `output` items | [`function_call_output`] (an input item) | [`response_tools`] |
//! | Chat Completions, streamed | [`ChatToolCallStream`] over the chunks | its [`finish`](ChatToolCallStream::finish) | |
//! | Responses, streamed | [`ResponsesToolCallStream`] over the events | its [`finish`](ResponsesToolCallStream::finish) | |
//!
//! Each call carries the model's call id (`.call_id(..)`, echoed in the answer, never part
//! of the key); the run comes from the caller as a [`Scope`]. A model's mistakes (malformed
//! arguments text, an unknown tool, arguments of the wrong shape) come back as answers that
//! say what was wrong, with nothing executed.
//!
//! One Chat Completions turn:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use async_openai::types::chat::{ChatCompletionRequestMessage, ChatCompletionResponseMessage};
//! use idem::providers::async_openai as aoai;
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
//! let tools = aoai::chat_tools(&registry); // the request's `tools`
//! # assert_eq!(tools.len(), 1);
//! // `choices[0].message` of the model's reply, as async-openai parsed it:
//! let message: ChatCompletionResponseMessage = serde_json::from_value(json!({
//!     "role": "assistant",
//!     "tool_calls": [{"id": "call_1", "type": "function",
//!         "function": {"name": "send_welcome", "arguments": "{\"to\": \"ada@example.com\"}"}}]
//! }))?;
//! let answers: Vec<ChatCompletionRequestMessage> =
//!     aoai::chat_tool_messages(&registry, &Scope::run("run-1"), &message).await;
//! // Append the assistant message, then `answers`, to the request's messages.
//! assert_eq!(
//!     serde_json::to_value(&answers[0])?,
//!     json!({"role": "tool", "tool_call_id": "call_1", "content": "sent to ada@example.com"})
//! );
//! # Ok(()) }
//! ```

use ::async_openai::types::chat::{
    ChatChoiceStream, ChatCompletionMessageToolCall, ChatCompletionMessageToolCallChunk,
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionResponseMessage, ChatCompletionTool,
    ChatCompletionTools, CreateChatCompletionStreamResponse, FunctionObject,
};
use ::async_openai::types::responses::{
    FunctionCallOutput, FunctionCallOutputItemParam, FunctionTool, FunctionToolCall, InputItem,
    Item, OutputItem, ResponseStreamEvent, Tool,
};
use serde_json::Value;

use super::{answered_id, call_all, text_call};
use crate::definitions::DefinitionOptions;
use crate::{CallError, Format, Registry, Scope, ToolCall, ToolResult};

// ---- Chat Completions --------------------------------------------------------------------

/// A function tool call of a Chat Completions message as a [`ToolCall`] in `scope`, under
/// the model's call id. The arguments text is decoded by the registry: malformed JSON is
/// refused with a message for the model, and nothing runs.
///
/// ```
/// # use async_openai::types::chat::{ChatCompletionMessageToolCall, FunctionCall};
/// # use idem::{providers::async_openai::chat_call, Scope};
/// let call = ChatCompletionMessageToolCall {
///     id: "call_1".into(),
///     function: FunctionCall { name: "send_welcome".into(), arguments: "{}".into() },
/// };
/// assert_eq!(chat_call(&call, &Scope::run("run-1")).tool(), "send_welcome");
/// ```
pub fn chat_call(call: &ChatCompletionMessageToolCall, scope: &Scope) -> ToolCall {
    text_call(
        scope,
        &call.id,
        &call.function.name,
        &call.function.arguments,
    )
}

/// The function tool calls of an assistant message as [`ToolCall`]s in `scope`, in the
/// model's order. Custom tool calls are not idem tools and are left to the caller.
///
/// ```
/// # use async_openai::types::chat::ChatCompletionResponseMessage;
/// # use idem::{providers::async_openai::chat_calls, Scope};
/// let message: ChatCompletionResponseMessage = serde_json::from_str(r#"{"role": "assistant",
///     "tool_calls": [{"id": "call_1", "type": "function",
///                     "function": {"name": "send_welcome", "arguments": "{}"}}]}"#)?;
/// let calls = chat_calls(&message, &Scope::run("run-1"));
/// assert_eq!(calls.len(), 1);
/// # Ok::<(), serde_json::Error>(())
/// ```
pub fn chat_calls(message: &ChatCompletionResponseMessage, scope: &Scope) -> Vec<ToolCall> {
    message
        .tool_calls
        .iter()
        .flatten()
        .filter_map(|call| match call {
            ChatCompletionMessageToolCalls::Function(call) => Some(chat_call(call, scope)),
            ChatCompletionMessageToolCalls::Custom(_) => None,
        })
        .collect()
}

/// The answer to one call as a Chat Completions `tool` message: `{"role": "tool",
/// "tool_call_id", "content"}`, the content [`ToolResult::text`]. Push it into the next
/// request's messages (`.into()` makes it a `ChatCompletionRequestMessage`).
///
/// ```
/// # use idem::providers::async_openai::chat_tool_message;
/// # use idem::{CallError, ToolResult};
/// let refused = ToolResult::refused(
///     "send_welcome",
///     Some("call_1".into()),
///     CallError::MalformedJson { message: "EOF".into() },
/// );
/// let message = chat_tool_message(&refused);
/// assert_eq!(message.tool_call_id, "call_1");
/// ```
pub fn chat_tool_message(result: &ToolResult) -> ChatCompletionRequestToolMessage {
    ChatCompletionRequestToolMessage {
        content: ChatCompletionRequestToolMessageContent::Text(result.text()),
        tool_call_id: answered_id(result),
    }
}

/// Runs every function call of `message` concurrently and answers each with a `tool`
/// message, in the model's order. Never fails: a call that cannot run is answered with why.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use async_openai::types::chat::ChatCompletionResponseMessage;
/// # use idem::{providers::async_openai::chat_tool_messages, Registry, Scope};
/// let registry = Registry::builder().build()?;
/// let message: ChatCompletionResponseMessage = serde_json::from_str(r#"{"role": "assistant",
///     "tool_calls": [{"id": "call_1", "type": "function",
///                     "function": {"name": "no_such_tool", "arguments": "{}"}}]}"#)?;
/// let answers = chat_tool_messages(&registry, &Scope::run("run-1"), &message).await;
/// let sent = serde_json::to_value(&answers[0])?;
/// assert_eq!(sent["role"], "tool");
/// assert!(sent["content"].as_str().unwrap().contains("unknown tool"));
/// # Ok(()) }
/// ```
pub async fn chat_tool_messages(
    registry: &Registry,
    scope: &Scope,
    message: &ChatCompletionResponseMessage,
) -> Vec<ChatCompletionRequestMessage> {
    let results = call_all(registry, chat_calls(message, scope)).await;
    results
        .iter()
        .map(|r| chat_tool_message(r).into())
        .collect()
}

/// The registry's tools as Chat Completions tools, in registration order: its
/// [`Format::OpenAi`] definitions (name, description, parameters) in async-openai's type.
///
/// ```
/// # use idem::{providers::async_openai::chat_tools, Format, Registry};
/// let registry = Registry::builder().build()?;
/// let tools = chat_tools(&registry);
/// assert_eq!(serde_json::to_value(&tools)?, serde_json::to_value(registry.definitions(Format::OpenAi))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn chat_tools(registry: &Registry) -> Vec<ChatCompletionTools> {
    chat_tools_with(registry, &DefinitionOptions::default())
}

/// [`chat_tools`] with definition options (e.g. OpenAI strict mode).
///
/// ```
/// # use idem::{definitions::DefinitionOptions, providers::async_openai::chat_tools_with, Registry};
/// let registry = Registry::builder().build()?;
/// assert!(chat_tools_with(&registry, &DefinitionOptions::default().strict(true)).is_empty());
/// # Ok::<(), idem::BuildError>(())
/// ```
pub fn chat_tools_with(
    registry: &Registry,
    options: &DefinitionOptions,
) -> Vec<ChatCompletionTools> {
    registry
        .definitions_with(Format::OpenAi, options)
        .iter()
        .map(|definition| {
            let function = &definition["function"];
            ChatCompletionTools::Function(ChatCompletionTool {
                function: FunctionObject {
                    name: text(function, "name").unwrap_or_default(),
                    description: text(function, "description"),
                    parameters: function.get("parameters").cloned(),
                    strict: function.get("strict").and_then(Value::as_bool),
                },
            })
        })
        .collect()
}

// ---- Responses ----------------------------------------------------------------------------

/// A Responses `function_call` item as a [`ToolCall`] in `scope`, under the model's
/// `call_id`. The arguments text is decoded by the registry: malformed JSON is refused with a
/// message for the model, and nothing runs.
///
/// ```
/// # use async_openai::types::responses::FunctionToolCall;
/// # use idem::{providers::async_openai::function_call, Scope};
/// let call = FunctionToolCall {
///     call_id: "call_1".into(),
///     name: "send_welcome".into(),
///     arguments: "{}".into(),
///     ..Default::default()
/// };
/// assert_eq!(function_call(&call, &Scope::run("run-1")).tool(), "send_welcome");
/// ```
pub fn function_call(call: &FunctionToolCall, scope: &Scope) -> ToolCall {
    text_call(scope, &call.call_id, &call.name, &call.arguments)
}

/// The `function_call` items of a response's `output` as [`ToolCall`]s in `scope`, in the
/// model's order. Every other item (messages, reasoning, built-in tools' calls) is left to
/// the caller.
///
/// ```
/// # use async_openai::types::responses::OutputItem;
/// # use idem::{providers::async_openai::response_calls, Scope};
/// let output: Vec<OutputItem> = serde_json::from_str(r#"[{"type": "function_call",
///     "call_id": "call_1", "name": "send_welcome", "arguments": "{}"}]"#)?;
/// assert_eq!(response_calls(&output, &Scope::run("run-1")).len(), 1);
/// # Ok::<(), serde_json::Error>(())
/// ```
pub fn response_calls(output: &[OutputItem], scope: &Scope) -> Vec<ToolCall> {
    output
        .iter()
        .filter_map(|item| match item {
            OutputItem::FunctionCall(call) => Some(function_call(call, scope)),
            _ => None,
        })
        .collect()
}

/// The answer to one call as a Responses input item: `{"type": "function_call_output",
/// "call_id", "output"}`, the output [`ToolResult::text`]. Put it in the next request's
/// `input`, after the `function_call` items (or give `previous_response_id`).
///
/// ```
/// # use idem::providers::async_openai::function_call_output;
/// # use idem::{CallError, ToolResult};
/// let refused = ToolResult::refused(
///     "send_welcome",
///     Some("call_1".into()),
///     CallError::MalformedJson { message: "EOF".into() },
/// );
/// let item = serde_json::to_value(function_call_output(&refused))?;
/// assert_eq!(item["type"], "function_call_output");
/// assert_eq!(item["call_id"], "call_1");
/// # Ok::<(), serde_json::Error>(())
/// ```
pub fn function_call_output(result: &ToolResult) -> InputItem {
    InputItem::Item(Item::FunctionCallOutput(FunctionCallOutputItemParam {
        call_id: Some(answered_id(result)),
        output: FunctionCallOutput::Text(result.text()),
        id: None,
        status: None,
        name: None,
        namespace: None,
        caller: None,
    }))
}

/// Runs every `function_call` item of `output` concurrently and answers each with a
/// `function_call_output` input item, in the model's order. Never fails: a call that cannot
/// run is answered with why.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use async_openai::types::responses::OutputItem;
/// # use idem::{providers::async_openai::function_call_outputs, Registry, Scope};
/// let registry = Registry::builder().build()?;
/// let output: Vec<OutputItem> = serde_json::from_str(r#"[{"type": "function_call",
///     "call_id": "call_1", "name": "no_such_tool", "arguments": "{}"}]"#)?;
/// let answers = function_call_outputs(&registry, &Scope::run("run-1"), &output).await;
/// assert!(serde_json::to_value(&answers[0])?["output"].as_str().unwrap().contains("unknown tool"));
/// # Ok(()) }
/// ```
pub async fn function_call_outputs(
    registry: &Registry,
    scope: &Scope,
    output: &[OutputItem],
) -> Vec<InputItem> {
    let results = call_all(registry, response_calls(output, scope)).await;
    results.iter().map(function_call_output).collect()
}

/// The registry's tools as Responses function tools, in registration order: its
/// [`Format::OpenAiResponses`] definitions (name, description, parameters, strict) in
/// async-openai's type.
///
/// ```
/// # use idem::{providers::async_openai::response_tools, Format, Registry};
/// let registry = Registry::builder().build()?;
/// let tools = response_tools(&registry);
/// assert_eq!(serde_json::to_value(&tools)?, serde_json::to_value(registry.definitions(Format::OpenAiResponses))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn response_tools(registry: &Registry) -> Vec<Tool> {
    response_tools_with(registry, &DefinitionOptions::default())
}

/// [`response_tools`] with definition options (e.g. OpenAI strict mode).
///
/// ```
/// # use idem::{definitions::DefinitionOptions, providers::async_openai::response_tools_with, Registry};
/// let registry = Registry::builder().build()?;
/// assert!(response_tools_with(&registry, &DefinitionOptions::default().strict(true)).is_empty());
/// # Ok::<(), idem::BuildError>(())
/// ```
pub fn response_tools_with(registry: &Registry, options: &DefinitionOptions) -> Vec<Tool> {
    registry
        .definitions_with(Format::OpenAiResponses, options)
        .iter()
        .map(|definition| {
            Tool::Function(FunctionTool {
                name: text(definition, "name").unwrap_or_default(),
                description: text(definition, "description"),
                parameters: definition.get("parameters").cloned(),
                strict: definition.get("strict").and_then(Value::as_bool),
                ..FunctionTool::default()
            })
        })
        .collect()
}

fn text(value: &Value, field: &str) -> Option<String> {
    value.get(field).and_then(Value::as_str).map(str::to_owned)
}

// ---- Streams ------------------------------------------------------------------------------

/// A call started while its stream went on.
enum Started {
    /// Running on the tokio runtime the stream was read on. The call is kept to ask again
    /// if the task does not finish (the runtime shut down under it, or it panicked): a repeat
    /// of a call replays, waits or runs what never ran, and never runs an effect twice.
    Spawned {
        task: tokio::task::JoinHandle<ToolResult>,
        call: ToolCall,
    },
    /// No tokio runtime was current: run by `finish`.
    Deferred(ToolCall),
    /// Refused before it reached the registry.
    Refused(ToolResult),
}

impl Started {
    fn start(registry: &Registry, call: ToolCall) -> Started {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let registry = registry.clone();
                let spawned = call.clone();
                Started::Spawned {
                    task: runtime.spawn(async move { registry.call(spawned).await }),
                    call,
                }
            }
            Err(_) => Started::Deferred(call),
        }
    }

    async fn result(self, registry: &Registry) -> ToolResult {
        match self {
            Started::Spawned { task, call } => match task.await {
                Ok(result) => result,
                Err(_) => registry.call(call).await,
            },
            Started::Deferred(call) => registry.call(call).await,
            Started::Refused(result) => result,
        }
    }
}

/// A streamed call's arguments text, bounded: past the registry's limit the text is dropped
/// as it comes (only its size is kept) and the call is refused, nothing run.
#[derive(Default)]
struct Arguments {
    text: String,
    size: usize,
}

impl Arguments {
    fn push(&mut self, fragment: &str, limit: usize) {
        self.size = self.size.saturating_add(fragment.len());
        if self.size > limit {
            self.text = String::new();
        } else {
            self.text.push_str(fragment);
        }
    }

    fn set(&mut self, text: &str, limit: usize) {
        *self = Arguments::default();
        self.push(text, limit);
    }

    /// The call, or its refusal when the text outgrew `limit`.
    fn start(self, registry: &Registry, scope: &Scope, id: &str, name: &str) -> Started {
        let limit = registry.max_args_bytes();
        if self.size > limit {
            return Started::Refused(ToolResult::refused(
                name,
                Some(id.to_owned()),
                CallError::ArgsTooLarge {
                    size: self.size,
                    limit,
                },
            ));
        }
        Started::start(registry, text_call(scope, id, name, &self.text))
    }
}

/// Awaits started calls in their order.
async fn results(registry: &Registry, started: Vec<Started>) -> Vec<ToolResult> {
    super::join_all(started.into_iter().map(|s| s.result(registry))).await
}

/// A fragment of a streamed call that came after the call was started: a stream that goes
/// back to a call it had moved on from. The call ran with the arguments it had; the fragment
/// is dropped.
///
/// ```
/// # use idem::providers::async_openai::LateFragment;
/// let late = LateFragment { index: 0 };
/// assert!(late.to_string().contains("call 0"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateFragment {
    /// The call's position: its `index` (Chat Completions) or `output_index` (Responses).
    pub index: u32,
}

impl std::fmt::Display for LateFragment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a fragment of streamed call {} came after the call was started; it ran with the \
             arguments it had and the fragment was dropped",
            self.index
        )
    }
}

impl std::error::Error for LateFragment {}

/// One Chat Completions call being streamed.
struct ChatPending {
    index: u32,
    id: String,
    name: String,
    arguments: Arguments,
}

/// Runs the tool calls of a streamed Chat Completions reply as they complete.
///
/// Push every chunk of the stream ([`push`](Self::push)); the tool-call deltas are gathered by
/// `index`, and a call is started (spawned on the current tokio runtime, through
/// [`Registry::call`]) the moment its arguments are complete: when a delta for a later index
/// arrives, or when the choice's `finish_reason` is set. [`finish`](Self::finish) starts what
/// the stream left open and returns every result in the model's order (by `index`), ready for
/// [`chat_tool_message`].
///
/// The id and name are the first ones a call's deltas give; a delta with another id at the
/// index of a call still open (servers that stream every call at index 0) completes that
/// call and opens the next, answered in the order they came. A call's arguments text is
/// bounded by [`Registry::max_args_bytes`]: past it the text is dropped as it comes and the
/// call is answered [`CallError::ArgsTooLarge`], nothing run. Arguments cut short (a
/// `length` finish, a broken stream) are malformed JSON and refused as such.
///
/// Without a current tokio runtime the calls start in `finish` instead. Dropping the
/// accumulator does not stop calls already started.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use async_openai::types::chat::CreateChatCompletionStreamResponse;
/// use idem::providers::async_openai::{chat_tool_message, ChatToolCallStream};
/// use idem::{tool, Registry, Scope, ToolError, WriteCtx};
/// use serde_json::json;
///
/// #[idem::args]
/// struct SendArgs { to: String }
///
/// /// Send a welcome mail.
/// #[tool(write)]
/// async fn send_welcome(_ctx: WriteCtx, args: SendArgs) -> Result<String, ToolError> {
///     Ok(format!("sent to {}", args.to))
/// }
///
/// let registry = Registry::builder().tool(send_welcome).build()?;
/// let mut calls = ChatToolCallStream::new(&registry, &Scope::run("run-1"));
/// // Chunks as `client.chat().create_stream(..)` yields them:
/// let chunks = [
///     json!([{"index": 0, "id": "call_1", "type": "function",
///             "function": {"name": "send_welcome", "arguments": ""}}]),
///     json!([{"index": 0, "function": {"arguments": "{\"to\": \"ada@"}}]),
///     json!([{"index": 0, "function": {"arguments": "example.com\"}"}}]),
/// ];
/// for tool_calls in chunks {
///     let chunk: CreateChatCompletionStreamResponse = serde_json::from_value(json!({
///         "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
///         "choices": [{"index": 0, "delta": {"tool_calls": tool_calls}}]}))?;
///     calls.push(&chunk)?;
/// }
/// let results = calls.finish().await; // the stream ended
/// assert_eq!(chat_tool_message(&results[0]).tool_call_id, "call_1");
/// assert_eq!(results[0].text(), "sent to ada@example.com");
/// # Ok(()) }
/// ```
pub struct ChatToolCallStream {
    registry: Registry,
    scope: Scope,
    choice: u32,
    /// Calls whose arguments are still coming, by index.
    pending: Vec<ChatPending>,
    /// Started calls with their index.
    started: Vec<(u32, Started)>,
}

impl ChatToolCallStream {
    /// An accumulator for choice 0 of a stream, running its calls through `registry` in
    /// `scope`.
    pub fn new(registry: &Registry, scope: &Scope) -> Self {
        ChatToolCallStream {
            registry: registry.clone(),
            scope: scope.clone(),
            choice: 0,
            pending: Vec::new(),
            started: Vec::new(),
        }
    }

    /// Reads the choice of this `index` instead of choice 0 (a request with `n` > 1: one
    /// accumulator per choice).
    ///
    /// ```
    /// # use idem::{providers::async_openai::ChatToolCallStream, Registry, Scope};
    /// # let registry = Registry::builder().build()?;
    /// let second = ChatToolCallStream::new(&registry, &Scope::run("run-1")).choice(1);
    /// # let _ = second; Ok::<(), idem::BuildError>(())
    /// ```
    pub fn choice(mut self, index: u32) -> Self {
        self.choice = index;
        self
    }

    /// Takes one chunk of the stream (its choice of this accumulator's index; other choices
    /// are ignored) and returns how many calls it started. A [`LateFragment`] says the chunk
    /// went back to a call already started (it was dropped; the rest of the chunk was read).
    pub fn push(
        &mut self,
        chunk: &CreateChatCompletionStreamResponse,
    ) -> Result<usize, LateFragment> {
        let mut started = 0;
        let mut late = None;
        let wanted = self.choice;
        for choice in chunk.choices.iter().filter(|c| c.index == wanted) {
            match self.push_choice(choice) {
                Ok(n) => started += n,
                Err(e) => {
                    late.get_or_insert(e);
                }
            }
        }
        late.map_or(Ok(started), Err)
    }

    /// Takes one streamed choice: its tool-call deltas, then its `finish_reason`. Returns how
    /// many calls it started, or the first [`LateFragment`] it dropped.
    pub fn push_choice(&mut self, choice: &ChatChoiceStream) -> Result<usize, LateFragment> {
        let mut started = 0;
        let mut late = None;
        for delta in choice.delta.tool_calls.iter().flatten() {
            match self.push_delta(delta) {
                Ok(n) => started += n,
                Err(e) => {
                    late.get_or_insert(e);
                }
            }
        }
        if choice.finish_reason.is_some() {
            started += self.start_below(u32::MAX, true);
        }
        late.map_or(Ok(started), Err)
    }

    /// Takes one tool-call delta. Returns how many calls it started (those it shows complete:
    /// before its index, or at its index under another id), or a [`LateFragment`] when its
    /// call was already started.
    pub fn push_delta(
        &mut self,
        delta: &ChatCompletionMessageToolCallChunk,
    ) -> Result<usize, LateFragment> {
        let index = delta.index;
        let id = delta.id.as_deref().filter(|id| !id.is_empty());
        let mut started = self.start_below(index, false);
        let position = match self.pending.iter().position(|p| p.index == index) {
            // A new id at the index of a call still open: a server that streams every call
            // at index 0. The open call is complete.
            Some(position)
                if id.is_some_and(|id| {
                    !self.pending[position].id.is_empty() && self.pending[position].id != id
                }) =>
            {
                let call = self.pending.remove(position);
                self.start_pending(call);
                started += 1;
                self.open(index)
            }
            Some(position) => position,
            None if id.is_none() && self.started.iter().any(|(i, _)| *i == index) => {
                return Err(LateFragment { index });
            }
            None => self.open(index),
        };
        let limit = self.registry.max_args_bytes();
        let call = &mut self.pending[position];
        if let Some(id) = id.filter(|_| call.id.is_empty()) {
            call.id = id.to_owned();
        }
        if let Some(function) = &delta.function {
            if let Some(name) = function.name.as_deref().filter(|_| call.name.is_empty()) {
                call.name = name.to_owned();
            }
            if let Some(fragment) = &function.arguments {
                call.arguments.push(fragment, limit);
            }
        }
        Ok(started)
    }

    /// Opens a call at `index`; its position in `pending`.
    fn open(&mut self, index: u32) -> usize {
        self.pending.push(ChatPending {
            index,
            id: String::new(),
            name: String::new(),
            arguments: Arguments::default(),
        });
        self.pending.len() - 1
    }

    fn start_pending(&mut self, call: ChatPending) {
        let started = call
            .arguments
            .start(&self.registry, &self.scope, &call.id, &call.name);
        self.started.push((call.index, started));
    }

    /// Starts the pending calls before `index` (`all`: every one).
    fn start_below(&mut self, index: u32, all: bool) -> usize {
        let (ready, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| all || p.index < index);
        self.pending = open;
        let n = ready.len();
        for call in ready {
            self.start_pending(call);
        }
        n
    }

    /// Starts what the stream left open and returns every call's result in the model's
    /// order (by `index`). Call it when the stream ended.
    pub async fn finish(mut self) -> Vec<ToolResult> {
        self.start_below(u32::MAX, true);
        let mut started = std::mem::take(&mut self.started);
        started.sort_by_key(|(index, _)| *index);
        results(
            &self.registry,
            started.into_iter().map(|(_, s)| s).collect(),
        )
        .await
    }
}

/// One Responses `function_call` item being streamed.
struct ResponsesItem {
    output_index: u32,
    item_id: Option<String>,
    call_id: String,
    name: String,
    arguments: Arguments,
    started: Option<Started>,
}

/// Runs the function calls of a streamed Responses reply as they complete.
///
/// Push every event of the stream ([`push`](Self::push)): `response.output_item.added`
/// opens a `function_call` item, `response.function_call_arguments.delta` adds to its
/// arguments, and `response.function_call_arguments.done` starts the call (spawned on the
/// current tokio runtime, through [`Registry::call`]) with the event's full arguments text.
/// A stream without that event starts the call at `response.output_item.done`, or at the
/// end. [`finish`](Self::finish) returns every result in the model's order (by
/// `output_index`), ready for [`function_call_output`].
///
/// Arguments gathered from deltas are bounded by [`Registry::max_args_bytes`]: past it the
/// text is dropped as it comes and the call is answered [`CallError::ArgsTooLarge`], nothing
/// run. Without a current tokio runtime the calls start in `finish` instead. Dropping the
/// accumulator does not stop calls already started.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use async_openai::types::responses::ResponseStreamEvent;
/// use idem::providers::async_openai::{function_call_output, ResponsesToolCallStream};
/// use idem::{Registry, Scope};
/// use serde_json::json;
///
/// let registry = Registry::builder().build()?;
/// let mut calls = ResponsesToolCallStream::new(&registry, &Scope::run("run-1"));
/// let events = [
///     json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
///            "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1",
///                     "name": "lookup", "arguments": "", "status": "in_progress"}}),
///     json!({"type": "response.function_call_arguments.delta", "sequence_number": 2,
///            "item_id": "fc_1", "output_index": 0, "delta": "{}"}),
///     json!({"type": "response.function_call_arguments.done", "sequence_number": 3,
///            "item_id": "fc_1", "output_index": 0, "arguments": "{}"}),
/// ];
/// for event in events {
///     calls.push(&serde_json::from_value::<ResponseStreamEvent>(event)?)?;
/// }
/// let results = calls.finish().await;
/// assert!(results[0].text().contains("unknown tool `lookup`"));
/// assert_eq!(serde_json::to_value(function_call_output(&results[0]))?["call_id"], "call_1");
/// # Ok(()) }
/// ```
pub struct ResponsesToolCallStream {
    registry: Registry,
    scope: Scope,
    items: Vec<ResponsesItem>,
}

impl ResponsesToolCallStream {
    /// An accumulator running a stream's calls through `registry` in `scope`.
    pub fn new(registry: &Registry, scope: &Scope) -> Self {
        ResponsesToolCallStream {
            registry: registry.clone(),
            scope: scope.clone(),
            items: Vec::new(),
        }
    }

    /// Takes one event of the stream and returns how many calls it started (0 or 1; every
    /// event but the function-call ones is ignored). A [`LateFragment`] says the event added
    /// to a call already started (it was dropped).
    pub fn push(&mut self, event: &ResponseStreamEvent) -> Result<usize, LateFragment> {
        let limit = self.registry.max_args_bytes();
        match event {
            ResponseStreamEvent::ResponseOutputItemAdded(added) => {
                if let OutputItem::FunctionCall(call) = &added.item {
                    if self
                        .position(added.output_index, call.id.as_deref())
                        .is_none()
                    {
                        self.items
                            .push(ResponsesItem::open(added.output_index, call, limit));
                    }
                }
                Ok(0)
            }
            ResponseStreamEvent::ResponseFunctionCallArgumentsDelta(delta) => {
                let Some(item) = self.item(delta.output_index, Some(&delta.item_id)) else {
                    return Ok(0);
                };
                if item.started.is_some() {
                    return Err(LateFragment {
                        index: delta.output_index,
                    });
                }
                item.arguments.push(&delta.delta, limit);
                Ok(0)
            }
            ResponseStreamEvent::ResponseFunctionCallArgumentsDone(done) => {
                let Some(position) = self.position(done.output_index, Some(&done.item_id)) else {
                    return Ok(0);
                };
                if self.items[position].started.is_some() {
                    return Err(LateFragment {
                        index: done.output_index,
                    });
                }
                let item = &mut self.items[position];
                item.arguments.set(&done.arguments, limit);
                if let Some(name) = done.name.as_deref().filter(|_| item.name.is_empty()) {
                    item.name = name.to_owned();
                }
                Ok(self.start(position))
            }
            ResponseStreamEvent::ResponseOutputItemDone(done) => {
                let OutputItem::FunctionCall(call) = &done.item else {
                    return Ok(0);
                };
                let position = match self.position(done.output_index, call.id.as_deref()) {
                    Some(position) if self.items[position].started.is_some() => return Ok(0),
                    Some(position) => {
                        self.items[position].arguments.set(&call.arguments, limit);
                        position
                    }
                    None => {
                        self.items
                            .push(ResponsesItem::open(done.output_index, call, limit));
                        self.items.len() - 1
                    }
                };
                Ok(self.start(position))
            }
            ResponseStreamEvent::ResponseCompleted(_)
            | ResponseStreamEvent::ResponseIncomplete(_)
            | ResponseStreamEvent::ResponseFailed(_) => Ok(self.start_open()),
            _ => Ok(0),
        }
    }

    fn position(&self, output_index: u32, item_id: Option<&str>) -> Option<usize> {
        self.items
            .iter()
            .position(|item| match (item_id, &item.item_id) {
                (Some(wanted), Some(id)) => wanted == id,
                _ => item.output_index == output_index,
            })
    }

    fn item(&mut self, output_index: u32, item_id: Option<&str>) -> Option<&mut ResponsesItem> {
        let position = self.position(output_index, item_id)?;
        self.items.get_mut(position)
    }

    fn start(&mut self, position: usize) -> usize {
        let item = &mut self.items[position];
        if item.started.is_some() {
            return 0;
        }
        let arguments = std::mem::take(&mut item.arguments);
        item.started =
            Some(arguments.start(&self.registry, &self.scope, &item.call_id, &item.name));
        1
    }

    fn start_open(&mut self) -> usize {
        (0..self.items.len())
            .map(|position| self.start(position))
            .sum()
    }

    /// Starts what the stream left open and returns every call's result in the model's
    /// order (by `output_index`). Call it when the stream ended.
    pub async fn finish(mut self) -> Vec<ToolResult> {
        self.start_open();
        let mut items = std::mem::take(&mut self.items);
        items.sort_by_key(|item| item.output_index);
        let started = items.into_iter().filter_map(|item| item.started).collect();
        results(&self.registry, started).await
    }
}

impl ResponsesItem {
    fn open(output_index: u32, call: &FunctionToolCall, limit: usize) -> Self {
        let mut arguments = Arguments::default();
        arguments.push(&call.arguments, limit);
        ResponsesItem {
            output_index,
            item_id: call.id.clone(),
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments,
            started: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Arguments;

    #[test]
    fn arguments_past_the_limit_keep_their_size_and_drop_their_text() {
        let mut arguments = Arguments::default();
        let fragment = "x".repeat(1024);
        for _ in 0..4096 {
            arguments.push(&fragment, 4096);
        }
        assert_eq!(arguments.size, 4096 * 1024);
        // Nothing of the text is held once it outgrew the limit.
        assert_eq!(arguments.text.capacity(), 0);
    }
}
