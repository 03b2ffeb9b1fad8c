//! The providers' message formats: tool calls in, results out.
//!
//! An agent loop that talks to a model API directly reads the tool calls out of the model's
//! reply, runs them, and sends the results back in the shape that API expects. These modules
//! convert at that edge, and nothing more: every call goes through [`Registry::call`], so the
//! exactly-once promise holds unchanged.
//!
//! | API | in | out |
//! |---|---|---|
//! | OpenAI Chat Completions (`openai`) | `message.tool_calls[]` (arguments as JSON text) | `{"role": "tool", "tool_call_id", "content"}` |
//! | OpenAI Responses (`openai`) | `output[]` items of type `function_call` | `{"type": "function_call_output", "call_id", "output"}` |
//! | Anthropic Messages (`anthropic`) | `content[]` blocks of type `tool_use` | `{"type": "tool_result", "tool_use_id", "content", "is_error"}` |
//! | async-openai's types (`async_openai`), both OpenAI APIs | `ChatCompletionResponseMessage::tool_calls`, `OutputItem::FunctionCall`, and their streams | `ChatCompletionRequestToolMessage`, `InputItem` of `function_call_output` |
//!
//! Each call carries the provider's call id (`.call_id(..)`): logged, and echoed in the
//! result, but never part of the key — a model that re-issues a call mints a new one. The
//! run id (and tenant, principal) come from the caller as a [`Scope`].
//!
//! A model's mistakes never end the loop: malformed arguments text, an unknown tool or
//! arguments of the wrong shape each come back as a result that tells the model what was
//! wrong (and `is_error`), with nothing executed.

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "async-openai")]
pub mod async_openai;
#[cfg(feature = "openai")]
pub mod openai;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use idem_runtime::{
    call::{ToolCall, ToolResult},
    identity::Scope,
    registry::Registry,
};

/// Runs `calls` concurrently through [`Registry::call`] and returns their results in the
/// order of `calls` — the order the model issued them in, which is the order the providers
/// expect the results back in.
///
/// Calls of one message that share a key (the model asked twice for the same operation)
/// still cause one effect: the second waits for the first and replays it.
pub async fn call_all(registry: &Registry, calls: Vec<ToolCall>) -> Vec<ToolResult> {
    join_all(calls.into_iter().map(|call| registry.call(call))).await
}

/// Polls `futures` together until every one is ready; their outputs in the order given.
///
/// A turn holds a handful of calls, so each wake polls the ones still pending in turn (what
/// `futures::future::join_all` does for short lists) rather than pulling in a crate for it.
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_ready = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => all_ready = false,
                }
            }
        }
        if all_ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    // Every slot is filled once the loop above has seen them all ready.
    outputs.into_iter().flatten().collect()
}

/// Whether the model should be told the call is an error: [`ToolResult::is_error`], the one
/// rule every integration shares (everything but a completed call, fresh or replayed).
pub fn is_error(result: &ToolResult) -> bool {
    result.is_error()
}

/// A call whose arguments are the model's JSON text, decoded by the registry straight from
/// the text. An empty text (some OpenAI-compatible servers send `""` for a function without
/// parameters) is read as `{}`.
fn text_call(scope: &Scope, call_id: &str, name: &str, arguments: &str) -> ToolCall {
    let arguments = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    ToolCall::from_json(scope.run_id(), name, arguments)
        .scope(scope.clone())
        .call_id(call_id)
}

/// The call id a result is answered under (empty when the call was made without one, which
/// the providers refuse: every call these modules build has one).
fn answered_id(result: &ToolResult) -> String {
    result.call_id().unwrap_or_default().to_owned()
}

#[cfg(any(feature = "openai", feature = "anthropic"))]
/// Items of a provider's list are told apart by their `type`: an item of the type idem reads
/// must parse as one (a malformed one is an error, never silently "other"); an item of any
/// other type is handed back as it is.
fn typed_item<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    wanted: &str,
) -> Result<Result<T, serde_json::Value>, String> {
    if value.get("type").and_then(serde_json::Value::as_str) != Some(wanted) {
        return Ok(Err(value));
    }
    serde_json::from_value(value)
        .map(Ok)
        .map_err(|e| format!("a `{wanted}` item that does not parse: {e}"))
}

#[cfg(any(feature = "openai", feature = "anthropic"))]
/// `TryFrom<Value>` for an enum of one typed variant and `Other(Value)`.
macro_rules! item_from_value {
    ($item:ident, $variant:ident, $wanted:literal) => {
        impl TryFrom<serde_json::Value> for $item {
            type Error = String;
            fn try_from(value: serde_json::Value) -> Result<Self, String> {
                Ok(match super::typed_item(value, $wanted)? {
                    Ok(item) => $item::$variant(item),
                    Err(other) => $item::Other(other),
                })
            }
        }
    };
}
#[cfg(any(feature = "openai", feature = "anthropic"))]
use item_from_value;

#[cfg(any(feature = "openai", feature = "anthropic"))]
/// A list the provider may send as `null` or leave out: empty.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    Ok(<Option<Vec<T>> as serde::Deserialize>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::join_all;

    /// The first future waits for a value only the second sends: polled one after the other,
    /// they would never finish.
    #[tokio::test]
    async fn join_all_runs_its_futures_together_and_keeps_their_order() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let first = Box::pin(async move { rx.await.unwrap_or(0) + 1 })
            as std::pin::Pin<Box<dyn std::future::Future<Output = u32>>>;
        let second = Box::pin(async move {
            tokio::task::yield_now().await;
            let _ = tx.send(41);
            7
        });
        let outputs = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            join_all([first, second]),
        )
        .await
        .expect("join_all polled its futures one after the other");
        assert_eq!(outputs, vec![42, 7]);
        assert!(join_all(Vec::<std::future::Ready<u8>>::new())
            .await
            .is_empty());
    }
}
