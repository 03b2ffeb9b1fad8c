//! The providers' message formats, both directions.
//!
//! Shapes are checked against the providers' own OpenAPI descriptions (extracts vendored in
//! `tests/data/`: OpenAI's `openai-openapi`, Anthropic's Messages API); behaviour is checked on
//! the tools' ledger: what ran, how often, and in which order.

use std::sync::{Arc, Mutex};

use idem::providers::anthropic::{self, AssistantMessage, ToolResultBlock};
use idem::providers::openai::{
    self, ChatAssistantMessage, ChatToolCallItem, ChatToolMessage, FunctionCallOutput,
    ResponsesItem, ResponsesOutput,
};
use idem::providers::{call_all, is_error};
use idem::{
    definitions::DefinitionOptions, toolbox, CallError, Format, ReadCtx, Registry, Scope, ToolCall,
    ToolError, WriteCtx,
};
use serde_json::{json, Value};
use tokio::sync::{Barrier, Notify};

// ---- the tools ----------------------------------------------------------------------------

#[idem::args]
struct Address {
    line1: String,
    postcode: Option<String>,
}

#[idem::args]
struct ShipArgs {
    /// The order to ship.
    order: String,
    /// Where to.
    address: Address,
    /// A note for the courier.
    note: Option<String>,
}

#[idem::args]
struct MeetArgs {
    who: String,
}

#[idem::args]
struct OrderArgs {
    order: String,
}

/// A shop whose ledger records every effect.
#[derive(Default)]
struct Shop {
    ledger: Mutex<Vec<String>>,
    barrier: Option<Barrier>,
    b_recorded: Notify,
}

impl Shop {
    fn ledger(&self) -> Vec<String> {
        self.ledger.lock().unwrap().clone()
    }
}

#[toolbox]
impl Shop {
    /// Ship an order.
    #[tool(write, key(order))]
    async fn ship(&self, ctx: WriteCtx, args: ShipArgs) -> Result<String, ToolError> {
        let _ = ctx;
        self.ledger
            .lock()
            .unwrap()
            .push(format!("shipped {} to {}", args.order, args.address.line1));
        Ok(format!("shipment of {}", args.order))
    }

    /// Hand an order to a courier who confirms later.
    #[tool(write)]
    async fn hand_over(&self, _ctx: WriteCtx, args: OrderArgs) -> Result<String, ToolError> {
        self.ledger
            .lock()
            .unwrap()
            .push(format!("handed over {}", args.order));
        Err(ToolError::pending(format!("courier-{}", args.order)))
    }

    /// Cancel an order (the service refuses: nothing to cancel).
    #[tool(write)]
    async fn cancel(&self, _ctx: WriteCtx, args: OrderArgs) -> Result<String, ToolError> {
        Err(ToolError::rejected(format!("{} is not open", args.order)))
    }

    /// Both `a` and `b` must be in flight at once to get past the barrier; `a` records only
    /// after `b` has, so `a` finishes last.
    #[tool(read, timeout = "5s")]
    async fn meet(&self, _ctx: ReadCtx, args: MeetArgs) -> Result<String, ToolError> {
        if let Some(barrier) = &self.barrier {
            barrier.wait().await;
        }
        if args.who == "a" {
            self.b_recorded.notified().await;
        }
        self.ledger
            .lock()
            .unwrap()
            .push(format!("met {}", args.who));
        if args.who == "b" {
            self.b_recorded.notify_one();
        }
        Ok(format!("hello {}", args.who))
    }

    /// What time is it?
    #[tool(read)]
    async fn now(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
        Ok(1_764_512_400)
    }
}

fn shop() -> (Arc<Shop>, Registry) {
    shop_with(Shop::default())
}

fn shop_with(shop: Shop) -> (Arc<Shop>, Registry) {
    let shop = Arc::new(shop);
    let registry = Registry::builder().toolbox(shop.clone()).build().unwrap();
    (shop, registry)
}

fn scope() -> Scope {
    Scope::run("run-1")
}

// ---- the documented shapes ------------------------------------------------------------------

/// A validator for one schema of a vendored OpenAPI extract.
fn documented(file: &str, name: &str) -> jsonschema::Validator {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        doc["components"]["schemas"].get(name).is_some(),
        "{file} has no {name}"
    );
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&schema).unwrap()
}

fn openai_schema(name: &str) -> jsonschema::Validator {
    documented("openai-openapi-tools.json", name)
}

fn anthropic_schema(name: &str) -> jsonschema::Validator {
    documented("anthropic-openapi-tools.json", name)
}

#[track_caller]
fn assert_valid(validator: &jsonschema::Validator, value: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{value} is invalid: {errors:?}");
}

fn strict_mode() -> DefinitionOptions {
    DefinitionOptions::default().strict(true)
}

#[test]
fn chat_completions_definitions_are_documented_function_tools() {
    let (_, registry) = shop();
    let v = openai_schema("ChatCompletionTool");
    for options in [DefinitionOptions::default(), strict_mode()] {
        let defs = registry.definitions_with(Format::OpenAi, &options);
        assert_eq!(defs.len(), 5);
        for d in &defs {
            assert_valid(&v, d);
        }
    }
    // The validator is not vacuous: the flat Responses shape is not a Chat Completions tool.
    let flat = &registry.definitions(Format::OpenAiResponses)[0];
    assert!(!v.is_valid(flat));
}

#[test]
fn responses_definitions_are_documented_flat_function_tools() {
    let (_, registry) = shop();
    let v = openai_schema("FunctionTool");
    let plain = registry.definitions(Format::OpenAiResponses);
    let strict = registry.definitions_with(Format::OpenAiResponses, &strict_mode());
    for d in plain.iter().chain(&strict) {
        assert_valid(&v, d);
        assert!(d.get("function").is_none(), "flat, not nested: {d}");
    }
    let ship = &plain[0];
    assert_eq!(ship["type"], "function");
    assert_eq!(ship["name"], "ship");
    assert_eq!(ship["description"], "Ship an order.");
    // Not asked for strict: said so, since the API may otherwise apply it to a schema
    // written without its rules (an optional `note` that is not required).
    assert_eq!(ship["strict"], false);
    assert_eq!(ship["parameters"]["required"], json!(["order", "address"]));
    // Strict: the schema is rewritten to strict mode's rules.
    let ship = &strict[0];
    assert_eq!(ship["strict"], true);
    assert_eq!(ship["parameters"]["additionalProperties"], false);
    let mut required: Vec<&str> = ship["parameters"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["address", "note", "order"]);
    assert_eq!(
        ship["parameters"],
        registry.definitions_with(Format::OpenAi, &strict_mode())[0]["function"]["parameters"],
        "both OpenAI formats offer one schema"
    );
    // Not vacuous: the nested Chat Completions shape lacks the documented `name`.
    assert!(!v.is_valid(&registry.definitions(Format::OpenAi)[0]));
}

#[test]
fn anthropic_definitions_are_documented_tools() {
    let (_, registry) = shop();
    let v = anthropic_schema("Tool");
    for d in registry.definitions(Format::Anthropic) {
        assert_valid(&v, &d);
    }
    // Not vacuous: `Tool` is closed, so an OpenAI definition is not one.
    assert!(!v.is_valid(&registry.definitions(Format::OpenAi)[0]));
}

/// The replies of the agent loop's recorded transcripts.
fn fixture(file: &str) -> Value {
    let path = format!("{}/examples/agent_loop/{file}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_recorded_tool_calls_are_documented_shapes_and_parse() {
    let v = openai_schema("ChatCompletionMessageToolCall");
    let mut calls = 0;
    for reply in fixture("openai_chat.json")["replies"].as_array().unwrap() {
        let message = &reply["choices"][0]["message"];
        let parsed: ChatAssistantMessage = serde_json::from_value(message.clone()).unwrap();
        let raw = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(parsed.tool_calls.len(), raw.len());
        for (item, raw) in parsed.tool_calls.iter().zip(&raw) {
            assert_valid(&v, raw);
            assert_eq!(&serde_json::to_value(item).unwrap(), raw, "round trip");
            calls += 1;
        }
    }
    assert_eq!(calls, 4);

    let v = anthropic_schema("RequestToolUseBlock");
    let mut uses = 0;
    for reply in fixture("anthropic_messages.json")["replies"]
        .as_array()
        .unwrap()
    {
        let parsed: AssistantMessage = serde_json::from_value(reply.clone()).unwrap();
        assert_eq!(
            parsed.content.len(),
            reply["content"].as_array().unwrap().len()
        );
        for (block, raw) in parsed
            .content
            .iter()
            .zip(reply["content"].as_array().unwrap())
        {
            assert_eq!(&serde_json::to_value(block).unwrap(), raw, "round trip");
        }
        for t in parsed.tool_uses() {
            assert_valid(&v, &serde_json::to_value(t).unwrap());
            uses += 1;
        }
    }
    assert_eq!(uses, 4);
}

/// A Responses API reply: reasoning, a message and two function calls.
fn responses_reply() -> Value {
    json!({
        "id": "resp_68b1", "object": "response", "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "ship",
             "arguments": "{\"order\":\"o-1\",\"address\":{\"line1\":\"1 Main St\"}}",
             "status": "completed"},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Shipping.", "annotations": []}]},
            {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "ship",
             "arguments": "{\"address\":{\"line1\":\"1 Main St\"},\"order\":\"o-1\"}",
             "status": "completed"}
        ]
    })
}

#[test]
fn responses_function_calls_are_documented_and_other_items_are_kept() {
    let reply = responses_reply();
    let parsed: ResponsesOutput = serde_json::from_value(reply.clone()).unwrap();
    let v = openai_schema("FunctionToolCall");
    let calls: Vec<_> = parsed.function_calls().collect();
    assert_eq!(
        calls.iter().map(|c| c.call_id.as_str()).collect::<Vec<_>>(),
        ["call_a", "call_b"]
    );
    for (item, raw) in parsed
        .output
        .iter()
        .zip(reply["output"].as_array().unwrap())
    {
        let back = serde_json::to_value(item).unwrap();
        assert_eq!(&back, raw, "every item goes back as received");
        if let ResponsesItem::FunctionCall(_) = item {
            assert_valid(&v, &back);
        }
    }
}

#[test]
fn a_malformed_function_item_is_an_error_not_a_silent_skip() {
    // A function call the harness cannot answer (no call id) must not vanish: the API
    // would refuse the next request for want of its output.
    let reply = json!({"output": [{"type": "function_call", "name": "ship", "arguments": "{}"}]});
    let err = serde_json::from_value::<ResponsesOutput>(reply).unwrap_err();
    assert!(err.to_string().contains("call_id"), "{err}");
    let message =
        json!({"tool_calls": [{"type": "function", "id": "c", "function": {"name": "x"}}]});
    assert!(serde_json::from_value::<ChatAssistantMessage>(message).is_err());
    let reply = json!({"content": [{"type": "tool_use", "id": "toolu_1", "name": "ship"}]});
    assert!(serde_json::from_value::<AssistantMessage>(reply).is_err());
    // Another kind of call is kept for the caller, not run.
    let message = json!({"role": "assistant", "tool_calls": [
        {"type": "custom", "id": "c1", "custom": {"name": "grammar", "input": "x"}}]});
    let parsed: ChatAssistantMessage = serde_json::from_value(message).unwrap();
    assert!(matches!(parsed.tool_calls[0], ChatToolCallItem::Other(_)));
    assert!(parsed.to_calls(&scope()).is_empty());
    // `tool_calls: null` is no calls.
    let parsed: ChatAssistantMessage =
        serde_json::from_value(json!({"role": "assistant", "content": "hi", "tool_calls": null}))
            .unwrap();
    assert!(parsed.tool_calls.is_empty());
}

// ---- out: the answers -----------------------------------------------------------------------

#[tokio::test]
async fn answers_have_the_documented_shapes() {
    let (_, registry) = shop();
    let message: ChatAssistantMessage = serde_json::from_value(json!({"tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{"}}
    ]}))
    .unwrap();
    let chat = openai::chat_tool_messages(&registry, &scope(), &message).await;
    let v = openai_schema("ChatCompletionRequestToolMessage");
    for m in &chat {
        let value = serde_json::to_value(m).unwrap();
        assert_valid(&v, &value);
        assert_eq!(
            serde_json::from_value::<ChatToolMessage>(value).unwrap(),
            *m
        );
    }
    assert_eq!(
        serde_json::to_value(&chat[0]).unwrap(),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "1764512400"})
    );
    assert!(
        !v.is_valid(&json!({"role": "tool", "content": "x"})),
        "not vacuous"
    );

    let output: ResponsesOutput = serde_json::from_value(json!({"output": [
        {"type": "function_call", "call_id": "call_1", "name": "now", "arguments": "{}"}
    ]}))
    .unwrap();
    let items = openai::function_call_outputs(&registry, &scope(), &output).await;
    let v = openai_schema("FunctionCallOutputItemParam");
    let value = serde_json::to_value(&items[0]).unwrap();
    assert_valid(&v, &value);
    assert_eq!(
        value,
        json!({"type": "function_call_output", "call_id": "call_1", "output": "1764512400"})
    );
    assert_eq!(
        serde_json::from_value::<FunctionCallOutput>(value).unwrap(),
        items[0]
    );
    assert!(!v.is_valid(&json!({"type": "function_call_output", "call_id": "c"})));

    let reply: AssistantMessage = serde_json::from_value(json!({"content": [
        {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}},
        {"type": "tool_use", "id": "toolu_2", "name": "nope", "input": {}}
    ]}))
    .unwrap();
    let blocks = anthropic::tool_results(&registry, &scope(), &reply).await;
    let v = anthropic_schema("RequestToolResultBlock");
    for b in &blocks {
        let value = serde_json::to_value(b).unwrap();
        assert_valid(&v, &value);
        assert_eq!(
            serde_json::from_value::<ToolResultBlock>(value).unwrap(),
            *b
        );
    }
    assert_eq!(
        serde_json::to_value(&blocks[0]).unwrap(),
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "1764512400", "is_error": false})
    );
    assert!(blocks[1].is_error && blocks[1].content.contains("unknown tool `nope`"));
    assert!(!v.is_valid(&json!({"type": "tool_result", "tool_use_id": "bad id!"})));
}

/// A tool that returns a `String` answers with that text in every format, fresh or
/// replayed: the model reads `shipment of o-1`, not a JSON-quoted `"shipment of o-1"`.
#[tokio::test]
async fn a_string_output_reaches_the_model_as_its_text() {
    let (shop, registry) = shop();
    let args = r#"{"order":"o-1","address":{"line1":"1 Main St"}}"#;
    let message: ChatAssistantMessage = serde_json::from_value(json!({"tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "ship", "arguments": args}}
    ]}))
    .unwrap();
    let chat = openai::chat_tool_messages(&registry, &scope(), &message).await;
    assert_eq!(chat[0].content, "shipment of o-1");

    let output: ResponsesOutput = serde_json::from_value(json!({"output": [
        {"type": "function_call", "call_id": "call_2", "name": "ship", "arguments": args}
    ]}))
    .unwrap();
    let items = openai::function_call_outputs(&registry, &scope(), &output).await;
    assert_eq!(
        items[0].output,
        "already completed earlier; not sent again. result: shipment of o-1"
    );

    let reply: AssistantMessage = serde_json::from_value(json!({"content": [
        {"type": "tool_use", "id": "toolu_1", "name": "meet", "input": {"who": "c"}}
    ]}))
    .unwrap();
    let blocks = anthropic::tool_results(&registry, &scope(), &reply).await;
    assert_eq!(blocks[0].content, "hello c");
    assert_eq!(
        shop.ledger(),
        ["shipped o-1 to 1 Main St", "met c"],
        "the repeat replayed"
    );
}

// ---- the model's mistakes ---------------------------------------------------------------------

#[tokio::test]
async fn malformed_arguments_are_told_to_the_model_and_nothing_runs() {
    let (shop, registry) = shop();
    let message: ChatAssistantMessage = serde_json::from_value(json!({"tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "ship", "arguments": "{\"order\": \"o-1\", \"address\": "}},
        {"id": "c2", "type": "function",
         "function": {"name": "ship", "arguments": "[\"o-1\", {\"line1\": \"x\"}]"}},
        {"id": "c3", "type": "function",
         "function": {"name": "ship", "arguments": "{\"order\": 7, \"address\": {\"line1\": \"x\"}}"}},
        {"id": "c4", "type": "function", "function": {"name": "shipp", "arguments": "{}"}},
        {"id": "c5", "type": "function", "function": {"name": "now", "arguments": ""}}
    ]}))
    .unwrap();
    let results = call_all(&registry, message.to_calls(&scope())).await;
    assert_eq!(shop.ledger(), Vec::<String>::new(), "nothing ran");
    let texts: Vec<String> = results.iter().map(|r| r.text()).collect();
    assert!(matches!(
        results[0].error(),
        Some(CallError::MalformedJson { .. })
    ));
    assert!(texts[0].contains("not valid JSON"), "{}", texts[0]);
    assert!(
        texts[1].contains("must be a JSON object, not an array"),
        "{}",
        texts[1]
    );
    assert!(
        texts[2].contains("invalid arguments for `ship`"),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("unknown tool `shipp`"), "{}", texts[3]);
    for r in &results[..4] {
        assert!(is_error(r) && r.attempts() == 0, "{r:?}");
    }
    // An empty arguments text is a call without arguments.
    assert_eq!(results[4].output(), Some(&json!(1_764_512_400)));

    // Anthropic: `input` of the wrong shape.
    let reply: AssistantMessage = serde_json::from_value(json!({"content": [
        {"type": "tool_use", "id": "toolu_1", "name": "ship", "input": "o-1"},
        {"type": "tool_use", "id": "toolu_2", "name": "ship", "input": {"order": "o-1"}}
    ]}))
    .unwrap();
    let blocks = anthropic::tool_results(&registry, &scope(), &reply).await;
    assert!(blocks.iter().all(|b| b.is_error));
    assert!(
        blocks[0].content.contains("not a string"),
        "{}",
        blocks[0].content
    );
    assert!(
        blocks[1].content.contains("address"),
        "{}",
        blocks[1].content
    );
    assert_eq!(shop.ledger(), Vec::<String>::new(), "nothing ran");
}

// ---- running one message's calls ----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn calls_of_one_message_run_concurrently_and_answer_in_the_models_order() {
    let (shop, registry) = shop_with(Shop {
        barrier: Some(Barrier::new(2)),
        ..Shop::default()
    });
    let reply: AssistantMessage = serde_json::from_value(json!({"content": [
        {"type": "tool_use", "id": "toolu_a", "name": "meet", "input": {"who": "a"}},
        {"type": "tool_use", "id": "toolu_b", "name": "meet", "input": {"who": "b"}}
    ]}))
    .unwrap();
    let blocks = anthropic::tool_results(&registry, &scope(), &reply).await;
    // Both got past the barrier (so both were in flight at once), and `a` finished last.
    assert_eq!(shop.ledger(), ["met b", "met a"]);
    let answered: Vec<(&str, &str)> = blocks
        .iter()
        .map(|b| (b.tool_use_id.as_str(), b.content.as_str()))
        .collect();
    assert_eq!(answered, [("toolu_a", "hello a"), ("toolu_b", "hello b")]);
}

#[tokio::test]
async fn one_message_asking_twice_for_one_operation_causes_one_effect() {
    let (shop, registry) = shop();
    let output: ResponsesOutput = serde_json::from_value(responses_reply()).unwrap();
    let items = openai::function_call_outputs(&registry, &scope(), &output).await;
    assert_eq!(shop.ledger(), ["shipped o-1 to 1 Main St"]);
    assert_eq!(items[0].call_id, "call_a");
    assert_eq!(items[1].call_id, "call_b");
    let replayed = items
        .iter()
        .filter(|i| i.output.starts_with("already completed"))
        .count();
    assert_eq!(replayed, 1, "{items:?}");
}

#[tokio::test]
async fn the_callers_scope_separates_tenants() {
    let (shop, registry) = shop();
    let output: ResponsesOutput = serde_json::from_value(json!({"output": [
        {"type": "function_call", "call_id": "call_1", "name": "ship",
         "arguments": "{\"order\":\"o-1\",\"address\":{\"line1\":\"1 Main St\"}}"}
    ]}))
    .unwrap();
    for tenant in ["acme", "globex", "acme"] {
        let scope = Scope::run("run-1").with_tenant(tenant);
        openai::function_call_outputs(&registry, &scope, &output).await;
    }
    assert_eq!(shop.ledger().len(), 2, "one shipment per tenant");
}

#[tokio::test]
async fn is_error_is_false_only_for_completed_calls() {
    let (shop, registry) = shop();
    let ship = |cents: &str, id: &str| {
        ToolCall::from_json(
            "run-1",
            "ship",
            format!("{{\"order\":\"o-9\",\"address\":{{\"line1\":\"{cents}\"}}}}"),
        )
        .call_id(id)
    };
    let calls = vec![
        ship("1 Main St", "c1"),
        ToolCall::new("run-1", "hand_over", json!({"order": "o-9"})).call_id("c2"),
        ToolCall::new("run-1", "cancel", json!({"order": "o-9"})).call_id("c3"),
    ];
    let first = call_all(&registry, calls).await;
    let again = call_all(
        &registry,
        vec![ship("1 Main St", "c4"), ship("2 Side St", "c5")],
    )
    .await;
    assert_eq!(
        shop.ledger(),
        ["shipped o-9 to 1 Main St", "handed over o-9"]
    );

    let blocks: Vec<ToolResultBlock> = first.iter().chain(&again).map(Into::into).collect();
    let flags: Vec<(&str, bool)> = blocks
        .iter()
        .map(|b| (b.tool_use_id.as_str(), b.is_error))
        .collect();
    assert_eq!(
        flags,
        [
            ("c1", false), // completed
            ("c2", true),  // pending: not a success to build on
            ("c3", true),  // rejected before execution
            ("c4", false), // replayed completion
            ("c5", true),  // same key, changed parameters: refused
        ]
    );
    assert!(matches!(
        again[1].error(),
        Some(CallError::ChangedParams { .. })
    ));
}
