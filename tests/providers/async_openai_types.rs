//! async-openai's types in and out, and its streams: recorded chunk and event streams
//! (`data/*.json`, in the shape the APIs stream) pushed through the accumulators, judged on
//! the desk's ledger of charges; the answers checked in async-openai's request types, as
//! the JSON they send.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionResponseMessage, CreateChatCompletionStreamResponse,
};
use async_openai::types::responses::{InputItem, InputParam, OutputItem, ResponseStreamEvent};
use idem::definitions::DefinitionOptions;
use idem::providers::async_openai::{
    self as aoai, ChatToolCallStream, LateFragment, ResponsesToolCallStream,
};
use idem::{toolbox, CallError, Format, Registry, Scope, ToolError, ToolResult, WriteCtx};
use serde_json::{json, Value};
use tokio::sync::mpsc;

#[idem::args]
struct ChargeArgs {
    customer: String,
    invoice: String,
    /// Amount in cents.
    cents: u64,
}

/// A billing desk: its ledger holds every charge a handler made, and each charge is also
/// announced on a channel, so a test can wait for one while the stream is still open.
struct Desk {
    ledger: Mutex<Vec<String>>,
    charged: mpsc::UnboundedSender<String>,
}

#[toolbox]
impl Desk {
    /// Charge a customer for one invoice.
    #[tool(write, key(customer, invoice))]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let entry = format!("{} {} {}", args.customer, args.invoice, args.cents);
        self.ledger.lock().unwrap().push(entry.clone());
        let _ = self.charged.send(entry);
        Ok(format!("ch_{}_{}", args.customer, args.invoice))
    }
}

struct Setup {
    desk: Arc<Desk>,
    registry: Registry,
    charged: mpsc::UnboundedReceiver<String>,
}

impl Setup {
    fn new() -> Setup {
        Setup::with(Registry::builder())
    }

    fn with(builder: idem::RegistryBuilder) -> Setup {
        let (tx, charged) = mpsc::unbounded_channel();
        let desk = Arc::new(Desk {
            ledger: Mutex::default(),
            charged: tx,
        });
        let registry = builder.toolbox(desk.clone()).build().unwrap();
        Setup {
            desk,
            registry,
            charged,
        }
    }

    fn ledger(&self) -> Vec<String> {
        self.desk.ledger.lock().unwrap().clone()
    }

    /// The next charge the desk announces (a bound so a missing one fails, not hangs).
    async fn next_charge(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.charged.recv())
            .await
            .expect("no charge was made")
            .expect("the desk is gone")
    }
}

fn recorded(name: &str) -> String {
    let path = format!("{}/tests/providers/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn chunks(text: &str) -> Vec<CreateChatCompletionStreamResponse> {
    serde_json::from_str(text).unwrap()
}

fn events(text: &str) -> Vec<ResponseStreamEvent> {
    serde_json::from_str(text).unwrap()
}

fn call_ids(results: &[ToolResult]) -> Vec<&str> {
    results.iter().map(|r| r.call_id().unwrap()).collect()
}

/// Whether `chunk` carries the first delta of the call at `index`.
fn opens_call(chunk: &CreateChatCompletionStreamResponse, index: u32) -> bool {
    chunk.choices[..].iter().any(|choice| {
        choice
            .delta
            .tool_calls
            .iter()
            .flatten()
            .any(|d| d.index == index && d.id.is_some())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streamed_chat_calls_are_two_charges_each_started_when_complete() {
    let mut setup = Setup::new();
    let stream = chunks(&recorded("chat_stream_two_charges.json"));
    let mut calls = ChatToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    let second = stream.iter().position(|c| opens_call(c, 1)).unwrap();
    let finish = stream
        .iter()
        .position(|c| c.choices.iter().any(|ch| ch.finish_reason.is_some()))
        .unwrap();
    for (i, chunk) in stream.iter().enumerate() {
        let started = calls.push(chunk).unwrap();
        // The first call starts when the second one opens, the second at `finish_reason`.
        let expected = usize::from(i == second || i == finish);
        assert_eq!(started, expected, "chunk {i}");
        if i == second {
            // Charged while the model is still streaming the second call.
            assert_eq!(setup.next_charge().await, "cus_42 in_7 4900");
            assert_eq!(setup.ledger().len(), 1);
        }
    }
    let results = calls.finish().await;
    assert_eq!(call_ids(&results), ["call_Qx1aV9", "call_Pn4dW2"]);
    assert_eq!(setup.ledger(), ["cus_42 in_7 4900", "cus_43 in_8 1500"]);
    assert_eq!(results[0].text(), "ch_cus_42_in_7");
    assert_eq!(results[1].text(), "ch_cus_43_in_8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_stream_sent_again_with_new_call_ids_replays() {
    let setup = Setup::new();
    let scope = Scope::run("run-1");
    let first = recorded("chat_stream_two_charges.json");
    let again = first
        .replace("call_Qx1aV9", "call_Zz0new")
        .replace("call_Pn4dW2", "call_Yy1new");
    let mut answers = Vec::new();
    for text in [&first, &again] {
        let mut calls = ChatToolCallStream::new(&setup.registry, &scope);
        for chunk in chunks(text) {
            calls.push(&chunk).unwrap();
        }
        answers.push(calls.finish().await);
    }
    // The first stream's two calls run concurrently, so the ledger's order is theirs to pick:
    // what matters is one charge each, and none from the stream sent again.
    let mut ledger = setup.ledger();
    ledger.sort();
    assert_eq!(ledger, ["cus_42 in_7 4900", "cus_43 in_8 1500"]);
    let replayed = &answers[1];
    assert_eq!(call_ids(replayed), ["call_Zz0new", "call_Yy1new"]);
    assert!(replayed.iter().all(ToolResult::replayed), "{replayed:?}");
    assert_eq!(replayed[0].key(), answers[0][0].key());
    assert!(replayed[0].text().contains("ch_cus_42_in_7"));
}

#[tokio::test]
async fn chat_arguments_cut_short_are_an_error_and_nothing_runs() {
    let setup = Setup::new();
    let mut calls = ChatToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    for chunk in chunks(&recorded("chat_stream_cut_short.json")) {
        calls.push(&chunk).unwrap();
    }
    let results = calls.finish().await;
    assert_eq!(setup.ledger(), Vec::<String>::new());
    assert!(
        matches!(results[0].error(), Some(CallError::MalformedJson { .. })),
        "{results:?}"
    );
    let answer = serde_json::to_value(aoai::chat_tool_message(&results[0])).unwrap();
    assert_eq!(answer["tool_call_id"], "call_Ht8kL3");
    assert!(answer["content"]
        .as_str()
        .unwrap()
        .contains("nothing was done"));
}

/// A chunk of choice 0 carrying `tool_calls`.
fn tool_chunk(tool_calls: Value, finish: Option<&str>) -> CreateChatCompletionStreamResponse {
    serde_json::from_value(json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"tool_calls": tool_calls}, "finish_reason": finish}]
    }))
    .unwrap()
}

#[tokio::test]
async fn chat_arguments_past_the_limit_are_refused_and_nothing_runs() {
    let setup = Setup::with(Registry::builder().max_args_bytes(1024));
    let mut calls = ChatToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    let (head, tail) = (r#"{"customer": ""#, r#"", "invoice": "in_1", "cents": 1}"#);
    calls
        .push(&tool_chunk(
            json!([{"index": 0, "id": "call_big", "type": "function",
                    "function": {"name": "charge", "arguments": head}}]),
            None,
        ))
        .unwrap();
    // Four MiB of one string, streamed a KiB at a time.
    let fragment = json!([{"index": 0, "function": {"arguments": "x".repeat(1024)}}]);
    let chunk = tool_chunk(fragment, None);
    for _ in 0..4096 {
        calls.push(&chunk).unwrap();
    }
    let end = tool_chunk(
        json!([{"index": 0, "function": {"arguments": tail}}]),
        Some("tool_calls"),
    );
    assert_eq!(calls.push(&end).unwrap(), 1);
    let results = calls.finish().await;
    assert_eq!(setup.ledger(), Vec::<String>::new());
    let sent = head.len() + 4096 * 1024 + tail.len();
    assert_eq!(
        results[0].error(),
        Some(&CallError::ArgsTooLarge {
            size: sent,
            limit: 1024
        })
    );
    assert_eq!(results[0].call_id(), Some("call_big"));
}

#[tokio::test]
async fn a_chat_delta_for_a_call_already_started_is_reported() {
    let setup = Setup::new();
    let mut calls = ChatToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    let open = |index: u32, id: &str, args: &str| {
        tool_chunk(
            json!([{"index": index, "id": id, "type": "function",
                    "function": {"name": "charge", "arguments": args}}]),
            None,
        )
    };
    calls
        .push(&open(
            0,
            "call_a",
            r#"{"customer":"c1","invoice":"i1","cents":1}"#,
        ))
        .unwrap();
    assert_eq!(
        calls
            .push(&open(
                1,
                "call_b",
                r#"{"customer":"c2","invoice":"i2","cents":2}"#
            ))
            .unwrap(),
        1
    );
    let back = tool_chunk(json!([{"index": 0, "function": {"arguments": " "}}]), None);
    assert_eq!(calls.push(&back), Err(LateFragment { index: 0 }));
    let results = calls.finish().await;
    assert_eq!(call_ids(&results), ["call_a", "call_b"]);
    let mut ledger = setup.ledger();
    ledger.sort();
    assert_eq!(ledger, ["c1 i1 1", "c2 i2 2"]);
}

#[tokio::test]
async fn calls_streamed_at_one_index_under_their_own_ids_are_each_run_in_order() {
    // Some OpenAI-compatible servers stream every call at index 0.
    let setup = Setup::new();
    let mut calls = ChatToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    let mut started = Vec::new();
    for (id, args) in [
        ("call_a", r#"{"customer":"c1","invoice":"i1","cents":1}"#),
        ("call_b", r#"{"customer":"c2","invoice":"i2","cents":2}"#),
    ] {
        let (head, tail) = args.split_at(10);
        let opening = json!([{"index": 0, "id": id, "type": "function",
                              "function": {"name": "charge", "arguments": head}}]);
        // The id repeated on a later delta of the same call changes nothing.
        let rest = json!([{"index": 0, "id": id, "function": {"arguments": tail}}]);
        started.push(calls.push(&tool_chunk(opening, None)).unwrap());
        started.push(calls.push(&tool_chunk(rest, None)).unwrap());
    }
    started.push(
        calls
            .push(&tool_chunk(json!([]), Some("tool_calls")))
            .unwrap(),
    );
    assert_eq!(started, [0, 0, 1, 0, 1]);
    let results = calls.finish().await;
    assert_eq!(call_ids(&results), ["call_a", "call_b"]);
    assert_eq!(results[1].text(), "ch_c2_i2");
    let mut ledger = setup.ledger();
    ledger.sort();
    assert_eq!(ledger, ["c1 i1 1", "c2 i2 2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streamed_responses_calls_are_two_charges_each_started_at_arguments_done() {
    let mut setup = Setup::new();
    let stream = events(&recorded("responses_stream_two_charges.json"));
    let mut calls = ResponsesToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    let mut started_at = Vec::new();
    for event in &stream {
        let kind = serde_json::to_value(event).unwrap()["type"].clone();
        let started = calls.push(event).unwrap();
        if started > 0 {
            started_at.push(kind.clone());
        }
        if started_at.len() == 1 && kind == "response.function_call_arguments.done" {
            // Charged before the second call is even announced.
            assert_eq!(setup.next_charge().await, "cus_42 in_7 4900");
        }
    }
    assert_eq!(
        started_at,
        [
            "response.function_call_arguments.done",
            "response.function_call_arguments.done"
        ]
    );
    let results = calls.finish().await;
    assert_eq!(call_ids(&results), ["call_Rk2mX7", "call_Vt9pQ1"]);
    assert_eq!(setup.ledger(), ["cus_42 in_7 4900", "cus_43 in_8 1500"]);
    let input: Vec<InputItem> = results.iter().map(aoai::function_call_output).collect();
    assert_eq!(
        serde_json::to_value(InputParam::Items(input)).unwrap(),
        json!([
            {"type": "function_call_output", "call_id": "call_Rk2mX7", "output": "ch_cus_42_in_7"},
            {"type": "function_call_output", "call_id": "call_Vt9pQ1", "output": "ch_cus_43_in_8"}
        ])
    );
}

#[tokio::test]
async fn a_responses_stream_sent_again_with_new_call_ids_replays() {
    let setup = Setup::new();
    let first = recorded("responses_stream_two_charges.json");
    let again = first
        .replace("call_Rk2mX7", "call_new_1")
        .replace("call_Vt9pQ1", "call_new_2")
        .replace("fc_0", "fc_9");
    let mut last = Vec::new();
    for text in [&first, &again] {
        let mut calls = ResponsesToolCallStream::new(&setup.registry, &Scope::run("run-1"));
        for event in events(text) {
            calls.push(&event).unwrap();
        }
        last = calls.finish().await;
    }
    // The first stream's calls may run in either order: one charge each is what counts.
    let mut ledger = setup.ledger();
    ledger.sort();
    assert_eq!(ledger, ["cus_42 in_7 4900", "cus_43 in_8 1500"]);
    assert_eq!(call_ids(&last), ["call_new_1", "call_new_2"]);
    assert!(last.iter().all(ToolResult::replayed), "{last:?}");
}

#[tokio::test]
async fn responses_arguments_that_do_not_parse_are_an_error_and_nothing_runs() {
    let setup = Setup::new();
    let broken = recorded("responses_stream_two_charges.json").replace(
        r#""arguments": "{\"customer\":\"cus_43\",\"invoice\":\"in_8\",\"cents\":1500}""#,
        r#""arguments": "{\"customer\":\"cus_43\",\"invoice\":\"in_8\",\"cents\":15""#,
    );
    assert_ne!(broken, recorded("responses_stream_two_charges.json"));
    let mut calls = ResponsesToolCallStream::new(&setup.registry, &Scope::run("run-1"));
    for event in events(&broken) {
        calls.push(&event).unwrap();
    }
    let results = calls.finish().await;
    assert_eq!(setup.ledger(), ["cus_42 in_7 4900"]);
    assert!(
        matches!(results[1].error(), Some(CallError::MalformedJson { .. })),
        "{results:?}"
    );
}

#[tokio::test]
async fn a_chat_message_round_trips_in_async_openais_types() {
    let setup = Setup::new();
    let message: ChatCompletionResponseMessage = serde_json::from_value(json!({
        "role": "assistant", "content": null, "refusal": null,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "charge",
             "arguments": "{\"customer\":\"cus_42\",\"invoice\":\"in_7\",\"cents\":4900}"}},
            {"id": "call_2", "type": "custom", "custom_tool": {"name": "grep", "input": "x"}},
            {"id": "call_3", "type": "function", "function": {"name": "charge",
             "arguments": "{\"customer\":\"cus_42\",\"invoice\":\"in_7\",\"cents\":4900}"}}
        ]
    }))
    .unwrap();
    let answers: Vec<ChatCompletionRequestMessage> =
        aoai::chat_tool_messages(&setup.registry, &Scope::run("run-1"), &message).await;
    // The same charge twice in one message: one charge, the custom call left to the caller.
    assert_eq!(setup.ledger(), ["cus_42 in_7 4900"]);
    let sent = serde_json::to_value(&answers).unwrap();
    assert_eq!(
        sent[0],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "ch_cus_42_in_7"})
    );
    assert_eq!(sent[1]["role"], "tool");
    assert_eq!(sent[1]["tool_call_id"], "call_3");
    assert!(sent[1]["content"]
        .as_str()
        .unwrap()
        .contains("ch_cus_42_in_7"));
    assert_eq!(answers.len(), 2);
}

#[tokio::test]
async fn a_responses_output_round_trips_in_async_openais_types() {
    let setup = Setup::new();
    let output: Vec<OutputItem> = serde_json::from_value(json!([
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "charge",
         "arguments": "{\"customer\":\"cus_42\",\"invoice\":\"in_7\",\"cents\":4900}",
         "status": "completed"},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "charge",
         "arguments": "{\"customer\":\"cus_42\",", "status": "completed"}
    ]))
    .unwrap();
    let answers = aoai::function_call_outputs(&setup.registry, &Scope::run("run-1"), &output).await;
    assert_eq!(setup.ledger(), ["cus_42 in_7 4900"]);
    let sent = serde_json::to_value(&answers).unwrap();
    assert_eq!(
        sent[0],
        json!({"type": "function_call_output", "call_id": "call_1", "output": "ch_cus_42_in_7"})
    );
    assert_eq!(sent[1]["call_id"], "call_2");
    assert!(sent[1]["output"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    // What was sent reads back as the same input items.
    let back: Vec<InputItem> = serde_json::from_value(sent).unwrap();
    assert_eq!(back, answers);
}

#[test]
fn the_tools_are_the_registrys_definitions_in_async_openais_types() {
    let setup = Setup::new();
    for options in [
        DefinitionOptions::default(),
        DefinitionOptions::default().strict(true),
    ] {
        let chat = serde_json::to_value(aoai::chat_tools_with(&setup.registry, &options)).unwrap();
        let responses =
            serde_json::to_value(aoai::response_tools_with(&setup.registry, &options)).unwrap();
        assert_eq!(
            chat,
            Value::Array(setup.registry.definitions_with(Format::OpenAi, &options))
        );
        assert_eq!(
            responses,
            Value::Array(
                setup
                    .registry
                    .definitions_with(Format::OpenAiResponses, &options)
            )
        );
    }
    assert_eq!(
        serde_json::to_value(aoai::chat_tools(&setup.registry)).unwrap()[0]["function"]["name"],
        "charge"
    );
    assert_eq!(
        serde_json::to_value(aoai::response_tools(&setup.registry)).unwrap()[0]["name"],
        "charge"
    );
}

#[test]
fn the_accumulators_move_into_spawned_tasks() {
    // A stream is often read in a task of its own: the accumulators are `Send + 'static`
    // (this fails to compile otherwise).
    fn spawnable<T: Send + 'static>() {}
    spawnable::<ChatToolCallStream>();
    spawnable::<ResponsesToolCallStream>();
}
