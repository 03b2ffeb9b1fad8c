//! The provider message adapters, from outside: the model's tool calls as the APIs send them
//! (Chat Completions `tool_calls` with `arguments` as JSON text, Responses `function_call`
//! items, Anthropic `tool_use` blocks) in, the results messages out. Every check is on the
//! desk's ledger of effects or on the store's record; the answers are checked for their
//! shape (ids echoed, the error flag where the API has one, a text that names the state).

use std::sync::{Arc, Mutex};

use idem::providers::anthropic::{self, AssistantMessage, ToolResultBlock};
use idem::providers::openai::{self, ChatAssistantMessage, ResponsesOutput};
use idem::reconcile::{resolve, Resolution};
use idem::{
    store::RecordState, toolbox, IdemStore, ReadCtx, Reconciler, Registry, Scope, ToolCall,
    ToolError, WriteCtx,
};
use serde_json::{json, Value};

#[idem::args]
struct ChargeArgs {
    customer: String,
    invoice: String,
    /// Amount in cents.
    cents: u64,
}

#[idem::args]
struct Customer {
    customer: String,
}

/// A billing desk whose ledger records every effect a handler had.
#[derive(Default)]
struct Desk {
    ledger: Mutex<Vec<String>>,
}

impl Desk {
    fn ledger(&self) -> Vec<String> {
        self.ledger.lock().unwrap().clone()
    }
    fn record(&self, entry: String) {
        self.ledger.lock().unwrap().push(entry);
    }
}

#[toolbox]
impl Desk {
    /// Charge a customer for one invoice.
    #[tool(write, key(customer, invoice))]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        self.record(format!(
            "charge {} {} {}",
            args.customer, args.invoice, args.cents
        ));
        Ok(format!("ch_{}_{}", args.customer, args.invoice))
    }

    /// Put a hold on a card; the bank confirms later.
    #[tool(write)]
    async fn hold(&self, _ctx: WriteCtx, args: Customer) -> Result<String, ToolError> {
        self.record(format!("hold {}", args.customer));
        Err(ToolError::pending(format!("hold_{}", args.customer)))
    }

    /// Wire money; the connection drops after the request went out.
    #[tool(write)]
    async fn wire(&self, _ctx: WriteCtx, args: Customer) -> Result<String, ToolError> {
        self.record(format!("wire {}", args.customer));
        Err(ToolError::unknown(
            "connection reset after the request was sent",
        ))
    }

    /// Quote a price (no effect).
    #[tool(read)]
    async fn quote(&self, _ctx: ReadCtx, args: Customer) -> Result<String, ToolError> {
        Ok(format!("quote for {}", args.customer))
    }
}

fn new_desk() -> (Arc<Desk>, Registry) {
    let desk = Arc::new(Desk::default());
    let registry = Registry::builder().toolbox(desk.clone()).build().unwrap();
    (desk, registry)
}

fn scope() -> Scope {
    Scope::run("run-1")
}

fn chat(calls: &[(&str, &str, &str)]) -> ChatAssistantMessage {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    serde_json::from_value(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}))
        .unwrap()
}

fn responses(calls: &[(&str, &str, &str)]) -> ResponsesOutput {
    let output: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id,
                   "name": name, "arguments": arguments, "status": "completed"})
        })
        .collect();
    serde_json::from_value(json!({"output": output})).unwrap()
}

fn claude(uses: &[(&str, &str, Value)]) -> AssistantMessage {
    let content: Vec<Value> = uses
        .iter()
        .map(
            |(id, name, input)| json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        )
        .collect();
    serde_json::from_value(json!({"role": "assistant", "content": content})).unwrap()
}

const CHARGE: &str = r#"{"customer": "acme", "invoice": "in_7", "cents": 4900}"#;

/// Turn 1 charges; the answer is lost; later turns re-issue the call with new ids, in other
/// field orders, through each API. One charge.
#[tokio::test]
async fn a_call_reissued_in_later_turns_with_new_ids_through_every_api_is_one_charge() {
    let (desk, registry) = new_desk();
    let first =
        openai::chat_tool_messages(&registry, &scope(), &chat(&[("call_1", "charge", CHARGE)]))
            .await;
    assert_eq!(first[0].tool_call_id, "call_1");
    assert_eq!(first[0].content, "ch_acme_in_7");

    let reordered = r#"{ "cents":4900,"invoice":"in_7",
        "customer":"acme" }"#;
    let chat_again = openai::chat_tool_messages(
        &registry,
        &scope(),
        &chat(&[("call_2", "charge", reordered)]),
    )
    .await;
    let responses_again = openai::function_call_outputs(
        &registry,
        &scope(),
        &responses(&[("call_3", "charge", CHARGE)]),
    )
    .await;
    let claude_again = anthropic::tool_results(
        &registry,
        &scope(),
        &claude(&[(
            "toolu_4",
            "charge",
            json!({"invoice": "in_7", "cents": 4900.0, "customer": "acme"}),
        )]),
    )
    .await;

    assert_eq!(desk.ledger(), ["charge acme in_7 4900"]);
    assert_eq!(chat_again[0].tool_call_id, "call_2");
    assert_eq!(responses_again[0].call_id, "call_3");
    assert_eq!(claude_again[0].tool_use_id, "toolu_4");
    for text in [
        &chat_again[0].content,
        &responses_again[0].output,
        &claude_again[0].content,
    ] {
        assert_eq!(
            text, "already completed earlier; not sent again. result: ch_acme_in_7",
            "the repeat replays the saved result"
        );
    }
    assert!(
        !claude_again[0].is_error,
        "a replayed completion is a success"
    );

    // The store holds one completed record, under the key the calls share.
    let key = registry
        .call(ToolCall::from_json("run-1", "charge", CHARGE))
        .await
        .key()
        .cloned()
        .unwrap();
    let record = registry.store().get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.attempts.len(), 1);
}

/// One message with several calls, one of them the same operation as another under a new
/// id: every distinct operation runs once, the duplicate is answered with the saved result,
/// and the answers come back in the model's order under the model's ids.
#[tokio::test]
async fn parallel_calls_with_one_duplicate_cause_one_effect_per_operation() {
    let (desk, registry) = new_desk();
    let a = r#"{"customer": "acme", "invoice": "in_1", "cents": 100}"#;
    let b = r#"{"customer": "acme", "invoice": "in_2", "cents": 200}"#;
    let a_again = r#"{"invoice": "in_1", "customer": "acme", "cents": 100}"#;
    let message = chat(&[
        ("call_a", "charge", a),
        ("call_q", "quote", r#"{"customer": "acme"}"#),
        ("call_b", "charge", b),
        ("call_a2", "charge", a_again),
    ]);
    let answers = openai::chat_tool_messages(&registry, &scope(), &message).await;
    let ids: Vec<&str> = answers.iter().map(|m| m.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["call_a", "call_q", "call_b", "call_a2"]);
    let mut ledger = desk.ledger();
    ledger.sort();
    assert_eq!(ledger, ["charge acme in_1 100", "charge acme in_2 200"]);
    let a_answers = [&answers[0].content, &answers[3].content];
    assert_eq!(
        a_answers
            .iter()
            .filter(|t| t.starts_with("already completed earlier"))
            .count(),
        1,
        "{a_answers:?}"
    );
    assert!(a_answers.iter().all(|t| t.contains("ch_acme_in_1")));
    assert_eq!(answers[1].content, "quote for acme");

    // The same through Anthropic (another run, so nothing is shared with the above).
    let (desk, registry) = new_desk();
    let uses = claude(&[
        ("toolu_1", "charge", serde_json::from_str(a).unwrap()),
        ("toolu_2", "charge", serde_json::from_str(b).unwrap()),
        ("toolu_3", "charge", serde_json::from_str(a_again).unwrap()),
    ]);
    let blocks = anthropic::tool_results(&registry, &scope(), &uses).await;
    let ids: Vec<&str> = blocks.iter().map(|b| b.tool_use_id.as_str()).collect();
    assert_eq!(ids, ["toolu_1", "toolu_2", "toolu_3"]);
    assert!(blocks.iter().all(|b| !b.is_error), "{blocks:?}");
    assert_eq!(desk.ledger().len(), 2, "{:?}", desk.ledger());

    // And through Responses, in one message: the duplicate first this time.
    let (desk, registry) = new_desk();
    let output = responses(&[("c1", "charge", a_again), ("c2", "charge", a)]);
    let items = openai::function_call_outputs(&registry, &scope(), &output).await;
    assert_eq!(desk.ledger(), ["charge acme in_1 100"]);
    assert_eq!(items[0].call_id, "c1");
    assert_eq!(items[1].call_id, "c2");
}

/// Arguments texts a model (or a truncated stream) produces that are not the tool's
/// arguments: each answered under its own id, with a text that says what is wrong, and
/// nothing runs. A corrected call afterwards runs once.
#[tokio::test]
async fn malformed_arguments_texts_run_nothing_and_are_answered_under_their_ids() {
    let (desk, registry) = new_desk();
    let deep = format!(
        r#"{{"customer": {}"acme"{}, "invoice": "in_7", "cents": 4900}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "truncated",
            r#"{"customer": "acme", "invoice": "in_7", "cen"#.into(),
            "not valid JSON",
        ),
        ("trailing", format!("{CHARGE} {{}}"), "not valid JSON"),
        ("two objects", format!("{CHARGE}{CHARGE}"), "not valid JSON"),
        (
            "double-encoded",
            serde_json::to_string(CHARGE).unwrap(),
            "must be a JSON object",
        ),
        ("null", "null".into(), "invalid arguments"),
        ("a number", "4900".into(), "must be a JSON object"),
        (
            "NaN",
            r#"{"customer": "acme", "invoice": "in_7", "cents": NaN}"#.into(),
            "not valid JSON",
        ),
        (
            "single quotes",
            "{'customer': 'acme'}".into(),
            "not valid JSON",
        ),
        ("a BOM", format!("\u{feff}{CHARGE}"), "not valid JSON"),
        (
            "a field twice",
            r#"{"customer": "acme", "invoice": "in_7", "cents": 100, "cents": 9900}"#.into(),
            "duplicate field",
        ),
        (
            "out of range",
            r#"{"customer": "acme", "invoice": "in_7", "cents": 1e400}"#.into(),
            "not valid JSON",
        ),
        (
            "negative",
            r#"{"customer": "acme", "invoice": "in_7", "cents": -4900}"#.into(),
            "invalid arguments",
        ),
        ("too deep", deep, "nest deeper than"),
        (
            "missing a field",
            r#"{"customer": "acme", "cents": 4900}"#.into(),
            "invoice",
        ),
    ];
    let calls: Vec<(String, &str, &str)> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, text, _))| (format!("call_{i}"), "charge", text.as_str()))
        .collect();
    let borrowed: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(id, n, t)| (id.as_str(), *n, *t))
        .collect();

    let chat_answers = openai::chat_tool_messages(&registry, &scope(), &chat(&borrowed)).await;
    let responses_answers =
        openai::function_call_outputs(&registry, &scope(), &responses(&borrowed)).await;
    assert_eq!(desk.ledger(), Vec::<String>::new(), "nothing ran");

    for (i, (what, _, says)) in cases.iter().enumerate() {
        let id = format!("call_{i}");
        for (answered, text) in [
            (&chat_answers[i].tool_call_id, &chat_answers[i].content),
            (&responses_answers[i].call_id, &responses_answers[i].output),
        ] {
            assert_eq!(answered, &id, "{what}");
            assert!(text.contains(says), "{what}: {text}");
            assert!(text.contains("nothing was done"), "{what}: {text}");
            assert!(
                text.len() < 2048,
                "{what}: a short text, not {} bytes",
                text.len()
            );
        }
    }

    // Nothing was claimed: the corrected call is the first run of the operation.
    let fixed =
        openai::chat_tool_messages(&registry, &scope(), &chat(&[("call_ok", "charge", CHARGE)]))
            .await;
    assert_eq!(fixed[0].content, "ch_acme_in_7");
    assert_eq!(desk.ledger(), ["charge acme in_7 4900"]);
}

/// Tool names a model invents: empty, long, multi-byte, with control characters. Each is
/// answered (flagged as an error where the API has a flag) without running anything, and the
/// name is not echoed back in full.
#[tokio::test]
async fn unknown_tool_names_of_any_shape_run_nothing() {
    let (desk, registry) = new_desk();
    let long = "charge".repeat(2000);
    let wide = "é".repeat(100); // 200 bytes: cut inside a character would panic
    let names = [
        "",
        "Charge",
        "charge ",
        "functions.charge",
        long.as_str(),
        wide.as_str(),
        "charge\n\u{1b}[2J",
    ];
    let uses: Vec<(String, &str, Value)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                format!("toolu_{i}"),
                *n,
                serde_json::from_str::<Value>(CHARGE).unwrap(),
            )
        })
        .collect();
    let uses: Vec<(&str, &str, Value)> = uses
        .iter()
        .map(|(id, n, v)| (id.as_str(), *n, v.clone()))
        .collect();
    let blocks = anthropic::tool_results(&registry, &scope(), &claude(&uses)).await;
    let calls: Vec<(String, &str, &str)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("call_{i}"), *n, CHARGE))
        .collect();
    let borrowed: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(id, n, t)| (id.as_str(), *n, *t))
        .collect();
    let answers = openai::chat_tool_messages(&registry, &scope(), &chat(&borrowed)).await;
    assert_eq!(desk.ledger(), Vec::<String>::new(), "nothing ran");

    for (i, block) in blocks.iter().enumerate() {
        assert_eq!(block.tool_use_id, format!("toolu_{i}"));
        assert!(block.is_error, "{block:?}");
        assert!(block.content.contains("unknown tool"), "{}", block.content);
        assert!(block.content.len() < 512, "{} bytes", block.content.len());
        assert_eq!(answers[i].tool_call_id, format!("call_{i}"));
        assert_eq!(answers[i].content, block.content);
    }
}

/// The size limit counts the arguments text as the model wrote it: at the limit it runs,
/// one byte over it is refused with nothing run, through either kind of message.
#[tokio::test]
async fn oversized_arguments_are_refused_at_the_limit_and_not_before() {
    const LIMIT: usize = 1024;
    let desk = Arc::new(Desk::default());
    let registry = Registry::builder()
        .toolbox(desk.clone())
        .max_args_bytes(LIMIT)
        .build()
        .unwrap();
    let text_of = |len: usize, invoice: &str| {
        let bare =
            format!(r#"{{"customer": "acme", "invoice": "{invoice}", "cents": 4900, "memo": ""}}"#);
        let pad = "x".repeat(len - bare.len());
        let text = format!(
            r#"{{"customer": "acme", "invoice": "{invoice}", "cents": 4900, "memo": "{pad}"}}"#
        );
        assert_eq!(text.len(), len);
        text
    };
    let at = text_of(LIMIT, "in_at");
    let over = text_of(LIMIT + 1, "in_over");
    let answers = openai::chat_tool_messages(
        &registry,
        &scope(),
        &chat(&[("call_at", "charge", &at), ("call_over", "charge", &over)]),
    )
    .await;
    assert_eq!(desk.ledger(), ["charge acme in_at 4900"]);
    assert_eq!(answers[0].content, "ch_acme_in_at");
    assert_eq!(answers[1].tool_call_id, "call_over");
    assert!(
        answers[1].content.contains("exceed the limit"),
        "{}",
        answers[1].content
    );
    assert!(answers[1].content.contains("nothing was done"));
    assert!(answers[1].content.len() < 512);

    // Anthropic sends the input as a value: measured as its compact text.
    let big: Value = serde_json::from_str(&text_of(4 * LIMIT, "in_big")).unwrap();
    let blocks = anthropic::tool_results(
        &registry,
        &scope(),
        &claude(&[("toolu_big", "charge", big)]),
    )
    .await;
    assert!(blocks[0].is_error && blocks[0].content.contains("exceed the limit"));
    assert_eq!(
        desk.ledger(),
        ["charge acme in_at 4900"],
        "nothing more ran"
    );
}

/// Pending, unknown and escalated calls re-issued by the model under new ids: the answer
/// names the state and says it was not sent again, flagged as an error where the API has a
/// flag; the ledger does not move. After a person resolves the escalation, a repeat gets the
/// person's result.
#[tokio::test]
async fn pending_unknown_and_escalated_calls_are_reported_and_not_sent_again() {
    let (desk, registry) = new_desk();
    let wired = anthropic::tool_results(
        &registry,
        &scope(),
        &claude(&[("toolu_1", "wire", json!({"customer": "globex"}))]),
    )
    .await;
    assert!(wired[0].is_error);
    assert!(
        wired[0].content.contains("outcome unknown"),
        "{}",
        wired[0].content
    );
    // The reconciler cannot settle the wire (no key contract, no read-back): a person must.
    let decisions = Reconciler::new(&registry).run_all().await.unwrap();
    assert_eq!(decisions.len(), 1);

    // Then a hold (pending) and a second wire, left unknown.
    let first = anthropic::tool_results(
        &registry,
        &scope(),
        &claude(&[
            ("toolu_2", "hold", json!({"customer": "acme"})),
            ("toolu_3", "wire", json!({"customer": "initech"})),
        ]),
    )
    .await;
    assert!(first.iter().all(|b| b.is_error), "{first:?}");
    assert!(first[0].content.contains("pending"), "{}", first[0].content);
    assert!(
        first[1].content.contains("outcome unknown"),
        "{}",
        first[1].content
    );
    let before = desk.ledger();
    assert_eq!(before.len(), 3, "{before:?}");

    let again = [
        ("hold", "acme", "pending, not sent again"),
        ("wire", "globex", "escalated to a person"),
        ("wire", "initech", "outcome unknown"),
    ];
    let uses: Vec<(String, &str, Value)> = again
        .iter()
        .enumerate()
        .map(|(i, (tool, who, _))| (format!("toolu_r{i}"), *tool, json!({ "customer": who })))
        .collect();
    let uses: Vec<(&str, &str, Value)> = uses
        .iter()
        .map(|(id, t, v)| (id.as_str(), *t, v.clone()))
        .collect();
    let blocks = anthropic::tool_results(&registry, &scope(), &claude(&uses)).await;
    let texts: Vec<String> = again
        .iter()
        .map(|(_, who, _)| format!(r#"{{"customer": "{who}"}}"#))
        .collect();
    let calls: Vec<(String, &str, &str)> = again
        .iter()
        .zip(&texts)
        .enumerate()
        .map(|(i, ((tool, _, _), text))| (format!("call_r{i}"), *tool, text.as_str()))
        .collect();
    let borrowed: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(id, n, t)| (id.as_str(), *n, *t))
        .collect();
    let chat_answers = openai::chat_tool_messages(&registry, &scope(), &chat(&borrowed)).await;
    let responses_answers =
        openai::function_call_outputs(&registry, &scope(), &responses(&borrowed)).await;

    assert_eq!(desk.ledger(), before, "nothing was sent again");
    for (i, (_, _, says)) in again.iter().enumerate() {
        assert_eq!(blocks[i].tool_use_id, format!("toolu_r{i}"));
        assert!(blocks[i].is_error, "{:?}", blocks[i]);
        for text in [
            &blocks[i].content,
            &chat_answers[i].content,
            &responses_answers[i].output,
        ] {
            assert!(text.contains(says), "{says}: {text}");
            assert!(text.contains("not sent again"), "{text}");
        }
        assert_eq!(chat_answers[i].tool_call_id, format!("call_r{i}"));
        assert_eq!(responses_answers[i].call_id, format!("call_r{i}"));
    }

    // A person finds the wire in the bank's ledger and resolves it; the model's next repeat
    // gets that result, as a success, and still nothing is sent.
    let key = registry
        .call(ToolCall::new(
            "run-1",
            "wire",
            json!({"customer": "globex"}),
        ))
        .await
        .key()
        .cloned()
        .unwrap();
    let store: &dyn IdemStore = registry.store().as_ref();
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().state,
        RecordState::Escalated
    );
    resolve(
        store,
        &key,
        Resolution::Completed {
            downstream_ref: "wr_88".into(),
            output: Some(json!("wr_88")),
        },
        "found in the bank's statement",
    )
    .await
    .unwrap();
    let after: Vec<ToolResultBlock> = anthropic::tool_results(
        &registry,
        &scope(),
        &claude(&[("toolu_z", "wire", json!({"customer": "globex"}))]),
    )
    .await;
    assert!(!after[0].is_error, "{:?}", after[0]);
    assert_eq!(
        after[0].content,
        "already completed earlier; not sent again. result: wr_88"
    );
    assert_eq!(desk.ledger(), before);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.downstream_ref.as_deref(), Some("wr_88"));
}

/// A Chat Completions tool call whose `type` is missing or `null` (as some
/// OpenAI-compatible servers send it) is still the function call it names: answered under its
/// id and run once, never passed over and left without an answer. A call of another type is
/// left to the caller.
#[tokio::test]
async fn a_chat_tool_call_without_a_type_is_still_answered() {
    let (desk, registry) = new_desk();
    let message: ChatAssistantMessage = serde_json::from_value(json!({"tool_calls": [
        {"id": "call_1", "function": {"name": "charge", "arguments": CHARGE}},
        {"id": "call_2", "type": null, "function": {"name": "charge", "arguments": CHARGE}},
        {"id": "call_3", "type": "custom", "custom": {"name": "grammar", "input": "x"}}
    ]}))
    .unwrap();
    let answers = openai::chat_tool_messages(&registry, &scope(), &message).await;
    let ids: Vec<&str> = answers.iter().map(|m| m.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["call_1", "call_2"]);
    assert_eq!(desk.ledger(), ["charge acme in_7 4900"]);
    assert!(answers[1].content.starts_with("already completed earlier"));
}

/// An assistant turn of the conversation may carry its content as a string (the API takes
/// that for any message): it parses, as one text block and no tool use. A malformed
/// `tool_use` block is still an error that says so, never skipped.
#[tokio::test]
async fn an_assistant_turn_with_string_content_has_no_tool_uses() {
    let (desk, registry) = new_desk();
    let turn: AssistantMessage =
        serde_json::from_value(json!({"role": "assistant", "content": "Charging now."})).unwrap();
    assert_eq!(turn.tool_uses().count(), 0);
    assert_eq!(turn.content.len(), 1);
    assert!(anthropic::tool_results(&registry, &scope(), &turn)
        .await
        .is_empty());
    assert!(desk.ledger().is_empty());

    let empty: AssistantMessage =
        serde_json::from_value(json!({"role": "assistant", "content": null})).unwrap();
    assert!(empty.content.is_empty());

    let broken = serde_json::from_value::<AssistantMessage>(json!({"content": [
        {"type": "tool_use", "id": "toolu_1", "name": "charge"}
    ]}))
    .unwrap_err();
    assert!(broken.to_string().contains("tool_use"), "{broken}");
}

/// A model that fans one operation out over many parallel tool calls (a loop gone wrong):
/// one effect, every other call answered with it, each under its own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parallel_copies_of_one_call_are_one_effect() {
    let (desk, registry) = new_desk();
    let uses: Vec<(String, &str, Value)> = (0..64)
        .map(|i| {
            (
                format!("toolu_{i:02}"),
                "charge",
                serde_json::from_str::<Value>(CHARGE).unwrap(),
            )
        })
        .collect();
    let uses: Vec<(&str, &str, Value)> = uses
        .iter()
        .map(|(id, n, v)| (id.as_str(), *n, v.clone()))
        .collect();
    let blocks = anthropic::tool_results(&registry, &scope(), &claude(&uses)).await;
    assert_eq!(desk.ledger(), ["charge acme in_7 4900"]);
    assert_eq!(blocks.len(), 64);
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(b.tool_use_id, format!("toolu_{i:02}"));
        assert!(!b.is_error, "{b:?}");
        assert!(b.content.contains("ch_acme_in_7"), "{}", b.content);
    }
    let fresh = blocks
        .iter()
        .filter(|b| !b.content.starts_with("already completed"))
        .count();
    assert_eq!(fresh, 1);
}
