//! A model stuck repeating a refused call (same key, changed parameters) pages a person once
//! per key and window, not once per turn; nothing runs either way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::{ManualClock, Timestamp};
use idem_runtime::{
    call::{CallError, ToolCall},
    escalation::{CallbackSink, Escalation},
    registry::{Registry, CHANGED_PARAMS_NOTICE_WINDOW},
    store::MemoryStore,
    tool::{ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;

struct Charge(Arc<Mutex<u32>>);

impl idem_runtime::tool::WriteTool for Charge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<&'static str, ToolError> {
        *self.0.lock().unwrap() += 1;
        Ok("ch_1")
    }
}

#[tokio::test]
async fn refused_repeats_of_one_key_are_coalesced_per_window() {
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let runs = Arc::new(Mutex::new(0));
    let notices: Arc<Mutex<Vec<Escalation>>> = Arc::default();
    let seen = notices.clone();
    let registry = Registry::builder()
        .store(MemoryStore::with_clock(Arc::new(clock.clone())))
        .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
            seen.lock().unwrap().push(e.clone())
        })))
        .tool(Charge(runs.clone()))
        .build()
        .unwrap();
    let call =
        |cents: u64| ToolCall::new("run", "charge", json!({ "cents": cents })).intent("order-1");
    assert!(registry.call(call(4900)).await.is_completed());

    for _ in 0..50 {
        let refused = registry.call(call(9900)).await;
        assert!(matches!(
            refused.error(),
            Some(CallError::ChangedParams { .. })
        ));
    }
    assert_eq!(*runs.lock().unwrap(), 1, "a refused repeat runs nothing");
    assert_eq!(
        notices.lock().unwrap().len(),
        1,
        "one notice for the first refusal"
    );

    clock.advance(CHANGED_PARAMS_NOTICE_WINDOW + Duration::from_secs(1));
    let refused = registry.call(call(9900)).await;
    assert!(matches!(
        refused.error(),
        Some(CallError::ChangedParams { .. })
    ));
    {
        let notices = notices.lock().unwrap();
        assert_eq!(notices.len(), 2);
        assert!(
            notices[1].reason.contains("49 more refused"),
            "{}",
            notices[1].reason
        );
        assert_eq!(notices[1].refused_args, Some(json!({"cents": 9900})));
    }

    // Another key has its own window.
    let other = ToolCall::new("run", "charge", json!({"cents": 1})).intent("order-2");
    assert!(registry.call(other).await.is_completed());
    let other = ToolCall::new("run", "charge", json!({"cents": 2})).intent("order-2");
    assert!(registry.call(other).await.error().is_some());
    assert_eq!(notices.lock().unwrap().len(), 3);
}
