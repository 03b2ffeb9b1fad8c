//! A scripted OpenAI model for rig, shared by `examples/rig_agent.rs` and its test: rig's own
//! OpenAI Chat Completions wire over an HTTP client that answers each request with the
//! script's next response body (no network), and keeps every request body rig sent.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rig_agent::core::http_client::{
    self, HttpClientExt, LazyBody, MultipartForm, Request, Response, StreamingResponse,
};
use rig_agent::core::operation::Completion;
use rig_agent::core::providers::openai::OpenAIConfig;
use rig_agent::core::wasm_compat::WasmCompatSend;
use rig_agent::core::{DynModel, Model};
use serde_json::{json, Value};

/// The HTTP side of the scripted model.
#[derive(Clone, Default)]
pub struct ScriptedHttp {
    replies: Arc<Mutex<VecDeque<Value>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl ScriptedHttp {
    /// A client answering with `replies`, in order.
    pub fn new(replies: impl IntoIterator<Item = Value>) -> Self {
        ScriptedHttp {
            replies: Arc::new(Mutex::new(replies.into_iter().collect())),
            requests: Arc::default(),
        }
    }

    /// Every request body sent so far, as JSON.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }

    /// rig's OpenAI Chat Completions model over this client.
    pub fn model(&self) -> DynModel<Completion> {
        Model::new(
            OpenAIConfig::new("sk-scripted").chat("gpt-4.1"),
            self.clone(),
        )
        .into()
    }
}

fn script_error(message: &str) -> http_client::Error {
    http_client::Error::Instance(message.to_owned().into())
}

impl HttpClientExt for ScriptedHttp {
    fn send<T, U>(
        &self,
        req: Request<T>,
    ) -> impl Future<Output = http_client::Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        T: Into<Bytes> + WasmCompatSend,
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        let body: Bytes = req.into_body().into();
        let request = serde_json::from_slice(&body).unwrap_or(Value::Null);
        self.requests.lock().unwrap().push(request);
        let reply = self.replies.lock().unwrap().pop_front();
        async move {
            let reply = reply.ok_or_else(|| script_error("the script has no reply left"))?;
            let bytes = Bytes::from(reply.to_string());
            let body: LazyBody<U> = Box::pin(async move { Ok(U::from(bytes)) });
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(body)
                .map_err(http_client::Error::Protocol)
        }
    }

    fn send_multipart<U>(
        &self,
        _req: Request<MultipartForm>,
    ) -> impl Future<Output = http_client::Result<Response<LazyBody<U>>>> + WasmCompatSend + 'static
    where
        U: From<Bytes> + WasmCompatSend + 'static,
    {
        std::future::ready(Err(script_error(
            "the scripted model takes no multipart requests",
        )))
    }

    fn send_streaming<T>(
        &self,
        _req: Request<T>,
    ) -> impl Future<Output = http_client::Result<StreamingResponse>> + WasmCompatSend
    where
        T: Into<Bytes> + WasmCompatSend,
    {
        std::future::ready(Err(script_error("the scripted model does not stream")))
    }
}

/// A Chat Completions response calling one function.
pub fn tool_call_reply(call_id: &str, name: &str, arguments: Value) -> Value {
    json!({
        "id": format!("chatcmpl-{call_id}"), "object": "chat.completion", "created": 1764512400,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments.to_string()}}]
        }}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    })
}

/// A Chat Completions response with the final text.
pub fn text_reply(text: &str) -> Value {
    json!({
        "id": "chatcmpl-final", "object": "chat.completion", "created": 1764512460,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 150, "completion_tokens": 10, "total_tokens": 160}
    })
}
