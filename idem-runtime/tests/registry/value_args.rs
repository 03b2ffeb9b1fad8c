//! A write called with a JSON value: every attempt, retries included, receives the same
//! arguments whatever their shape; a value and its text are one operation; and a value is
//! refused exactly as the same arguments sent as text. (Pins what a change to how the value
//! is decoded, for instance moving it into the typed arguments, must keep.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    call::{CallError, ToolCall},
    outcome::OutcomeClass,
    registry::{Registry, RetryPolicy},
    store::MemoryStore,
    tool::{Downstream, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::{json, Value};

#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    customer: String,
    cents: u64,
    tags: Vec<String>,
    note: Option<String>,
    lines: BTreeMap<String, Vec<f64>>,
    #[serde(default)]
    rush: bool,
}

/// Answers each attempt from a script (then succeeds), keeping the arguments it was given.
struct Charge {
    seen: Arc<Mutex<Vec<Args>>>,
    script: Vec<ToolError>,
    downstream: Downstream,
}

impl WriteTool for Charge {
    type Args = Args;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge").downstream(self.downstream)
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<u64, ToolError> {
        let cents = args.cents;
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(args);
            seen.len()
        };
        match self.script.get(n - 1) {
            Some(e) => Err(e.clone()),
            None => Ok(cents),
        }
    }
}

fn registry(script: Vec<ToolError>, downstream: Downstream) -> (Registry, Arc<Mutex<Vec<Args>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registry = Registry::builder()
        .store(MemoryStore::new())
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .initial_backoff(Duration::from_millis(10))
                .max_backoff(Duration::from_millis(10))
                .jitter(0.0),
        )
        .tool(Charge {
            seen: seen.clone(),
            script,
            downstream,
        })
        .build()
        .expect("a valid registry");
    (registry, seen)
}

fn args() -> Value {
    json!({
        "customer": "acme \"corp\" \u{e9}\n",
        "cents": 4900,
        "tags": ["a", "", "long tag with spaces"],
        "note": null,
        "lines": {"z": [1.5, -0.0, 1e300], "a": []},
    })
}

fn expected() -> Args {
    serde_json::from_value(args()).expect("the arguments decode")
}

#[tokio::test(start_paused = true)]
async fn a_keyed_retry_of_a_value_call_gets_the_same_arguments() {
    let (registry, seen) = registry(
        vec![ToolError::unknown("the connection dropped")],
        Downstream::Keyed,
    );
    let r = registry
        .call(ToolCall::new("run-1", "charge", args()))
        .await;
    assert_eq!(
        r.class(),
        Some(OutcomeClass::Completed),
        "{:?}",
        r.outcome()
    );
    assert_eq!(r.attempts(), 2);
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        vec![expected(), expected()],
        "both attempts got the same arguments"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_retry_of_a_value_call_gets_the_same_arguments() {
    let (registry, seen) = registry(
        vec![
            ToolError::unavailable("503"),
            ToolError::unavailable("503 again"),
        ],
        Downstream::Unkeyed,
    );
    let r = registry
        .call(ToolCall::new("run-1", "charge", args()))
        .await;
    assert_eq!(
        r.class(),
        Some(OutcomeClass::Completed),
        "{:?}",
        r.outcome()
    );
    assert_eq!(r.attempts(), 3);
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        vec![expected(); 3],
        "every attempt got the same arguments"
    );
}

#[tokio::test]
async fn a_value_and_its_text_are_one_operation() {
    let (registry, seen) = registry(Vec::new(), Downstream::Keyed);
    let first = registry
        .call(ToolCall::new("run-1", "charge", args()))
        .await;
    let text = serde_json::to_string(&args()).unwrap();
    let again = registry
        .call(ToolCall::from_json("run-1", "charge", text))
        .await;
    assert!(first.is_completed() && !first.replayed());
    assert!(again.replayed(), "the same operation: replayed");
    assert_eq!(first.key(), again.key());
    assert_eq!(seen.lock().unwrap().len(), 1, "ran once");
}

#[tokio::test]
async fn bad_values_are_refused_as_their_text_is() {
    let bad = [
        json!({"customer": 7, "cents": 1, "tags": [], "lines": {}}),
        json!({"customer": "a", "tags": [], "lines": {}}),
        json!({"customer": "a", "cents": -1, "tags": [], "lines": {}}),
        json!({"customer": "a", "cents": 1, "tags": [3], "lines": {}}),
        json!({"customer": "a", "cents": 1, "tags": [], "lines": {"x": "y"}}),
        json!({}),
        json!(null),
    ];
    let (registry, seen) = registry(Vec::new(), Downstream::Keyed);
    for value in bad {
        let text = serde_json::to_string(&value).unwrap();
        let by_value = registry
            .call(ToolCall::new("run-1", "charge", value.clone()))
            .await;
        let by_text = registry
            .call(ToolCall::from_json("run-1", "charge", text))
            .await;
        let (
            Some(CallError::InvalidArgs { message: a, .. }),
            Some(CallError::InvalidArgs { message: b, .. }),
        ) = (by_value.error(), by_text.error())
        else {
            panic!(
                "{value}: refused as invalid both ways: {:?} / {:?}",
                by_value.error(),
                by_text.error()
            );
        };
        assert_eq!(a, b, "{value}: the same reason both ways");
    }
    assert!(seen.lock().unwrap().is_empty(), "nothing ran");
}
