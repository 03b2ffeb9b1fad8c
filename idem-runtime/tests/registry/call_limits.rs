//! What a model or a caller can send that must be refused before anything runs, and how
//! much of a refusal the model is shown.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem_runtime::{
    call::{CallError, ToolCall},
    registry::{Registry, MAX_ARGS_DEPTH},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{ToolError, ToolSpec, WriteCtx},
};
use serde_json::{json, Value};

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    cents: u64,
    memo: Option<Value>,
}

/// Counts the handler's runs: the downstream's ledger of this test.
struct Charge(Arc<AtomicU32>);

impl idem_runtime::tool::WriteTool for Charge {
    type Args = Args;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<u64, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(args.cents)
    }
}

fn setup() -> (Registry, Arc<MemoryStore>, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(Charge(runs.clone()))
        .build()
        .unwrap();
    (registry, store, runs)
}

fn nested(levels: usize) -> Value {
    let mut v = Value::Null;
    for _ in 0..levels {
        v = Value::Array(vec![v]);
    }
    v
}

#[tokio::test]
async fn a_value_nested_past_the_limit_is_refused_before_anything_recurses() {
    let (registry, store, runs) = setup();
    // Deep enough to overflow the stack of any recursive walk in a debug build.
    let deep = nested(200_000);
    // Built by hand: `json!` would serialize `deep`, recursively.
    let mut args = serde_json::Map::new();
    args.insert("cents".into(), json!(1));
    args.insert("memo".into(), deep);
    let args = Value::Object(args);
    // The registry takes the value apart itself: dropping it the usual way would recurse.
    let result = registry.call(ToolCall::new("r", "charge", args)).await;
    match result.error() {
        Some(CallError::InvalidArgs { message, .. }) => {
            assert!(message.contains(&MAX_ARGS_DEPTH.to_string()), "{message}")
        }
        other => panic!("expected InvalidArgs, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing may run");
    assert!(store
        .list(RecordState::Running, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .list(RecordState::Completed, 10)
        .await
        .unwrap()
        .is_empty());

    // Just within the limit it runs (the root object is one level, `memo` adds the rest).
    let ok = json!({"cents": 1, "memo": nested(MAX_ARGS_DEPTH - 2)});
    let result = registry.call(ToolCall::new("r", "charge", ok)).await;
    assert!(result.is_completed(), "{}", result.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn deep_text_is_refused_like_a_deep_value() {
    let (registry, _store, runs) = setup();
    let text = format!(
        "{{\"cents\": 1, \"memo\": {}null{}}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let result = registry
        .call(ToolCall::from_json("r", "charge", text))
        .await;
    assert!(result.error().is_some(), "{}", result.text());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_model_is_shown_at_most_a_kilobyte_of_a_refusal() {
    let (registry, _store, runs) = setup();
    // serde quotes the offending value in its error: 900 KB of it.
    let huge = "9".repeat(900_000);
    let result = registry
        .call(ToolCall::new("r", "charge", json!({"cents": huge})))
        .await;
    let text = result.text();
    assert!(
        matches!(result.error(), Some(CallError::InvalidArgs { .. })),
        "{text:.200}"
    );
    assert!(text.len() < 1300, "the model got {} bytes", text.len());
    assert!(text.contains("more bytes not shown"), "{text:.200}");
    // The full detail stays with the caller.
    assert!(result.error().unwrap().to_string().len() > 900_000);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Runs `f` on a thread with a small stack (256 KiB): a recursive walk (or drop) of a value
/// a million levels deep overflows it and aborts the test process.
fn on_a_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .expect("the call returned a refusal");
}

/// `{"cents": 1, "memo": <a million levels>}`, built without recursing.
fn million_deep() -> Value {
    let mut args = serde_json::Map::new();
    args.insert("cents".into(), json!(1));
    args.insert("memo".into(), nested(1_000_000));
    Value::Object(args)
}

/// A value a million levels deep, refused before its depth is checked (an unknown tool, an
/// invalid call) or for its size, is taken apart without recursion: the call returns its
/// refusal on a small stack, and nothing runs or is stored.
#[test]
fn a_deep_value_is_dropped_without_recursion_on_every_refusal() {
    on_a_small_stack(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (registry, store, runs) = setup();
            let unknown = registry
                .call(ToolCall::new("r", "no_such_tool", million_deep()))
                .await;
            assert!(
                matches!(unknown.error(), Some(CallError::UnknownTool { .. })),
                "{}",
                unknown.text()
            );
            let invalid = registry
                .call(ToolCall::new("", "charge", million_deep()))
                .await;
            assert!(
                matches!(invalid.error(), Some(CallError::InvalidCall { .. })),
                "{}",
                invalid.text()
            );
            let small = Registry::builder()
                .shared_store(store.clone())
                .tool(Charge(runs.clone()))
                .max_args_bytes(64)
                .build()
                .unwrap();
            let large = small
                .call(ToolCall::new("r", "charge", million_deep()))
                .await;
            assert!(
                matches!(large.error(), Some(CallError::ArgsTooLarge { .. })),
                "{}",
                large.text()
            );
            assert_eq!(runs.load(Ordering::SeqCst), 0);
            for state in [RecordState::Running, RecordState::Completed] {
                assert!(store.list(state, 10).await.unwrap().is_empty());
            }
        });
    });
}

/// Text nested past the limit but within serde_json's own (128) is refused as too deep,
/// as a value of that depth is: nothing runs, nothing is claimed.
#[tokio::test]
async fn text_past_the_limit_but_within_the_parser_is_refused() {
    let (registry, store, runs) = setup();
    // The root object and `memo` are two levels; the arrays and the null the rest.
    let text = |levels: usize| {
        format!(
            "{{\"cents\": 1, \"memo\": {}null{}}}",
            "[".repeat(levels - 2),
            "]".repeat(levels - 2)
        )
    };
    let over = registry
        .call(ToolCall::from_json("r", "charge", text(MAX_ARGS_DEPTH + 1)))
        .await;
    match over.error() {
        Some(CallError::InvalidArgs { message, .. }) => {
            assert!(message.contains(&MAX_ARGS_DEPTH.to_string()), "{message}")
        }
        other => panic!("refused as too deep, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(store
        .list(RecordState::Running, 10)
        .await
        .unwrap()
        .is_empty());
    let at = registry
        .call(ToolCall::from_json("r", "charge", text(MAX_ARGS_DEPTH)))
        .await;
    assert!(at.is_completed(), "{}", at.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
