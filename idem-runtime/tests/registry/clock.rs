//! One clock reaches everything: a registry over a store uses the store's clock, and a
//! registry given a clock that disagrees with its store's is refused at build.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{IdemStore, ManualClock, Timestamp};
use idem_runtime::{
    call::ToolCall,
    registry::{BuildError, Registry},
    store::MemoryStore,
    tool::{ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;

struct Charge;

impl idem_runtime::tool::WriteTool for Charge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<&'static str, ToolError> {
        Ok("ch_1")
    }
}

const LONG_AGO: Timestamp = Timestamp(1_600_000_000_000);

#[tokio::test]
async fn a_registry_over_a_store_stamps_attempts_with_the_stores_clock() {
    let clock = ManualClock::new(LONG_AGO);
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(Charge)
        .build()
        .unwrap();
    let result = registry
        .call(ToolCall::new("run-1", "charge", json!({"a": 1})))
        .await;
    assert!(result.is_completed(), "{}", result.text());
    let record = store.get(result.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.created_at, LONG_AGO);
    let attempt = &record.attempts[0];
    assert_eq!(
        (attempt.started_at, attempt.finished_at),
        (LONG_AGO, LONG_AGO),
        "attempts stamped by another clock than the store's: {attempt:?}"
    );
}

#[test]
fn a_clock_that_disagrees_with_the_stores_is_refused() {
    let store = MemoryStore::with_clock(Arc::new(ManualClock::new(LONG_AGO)));
    let other = ManualClock::new(LONG_AGO.plus(Duration::from_secs(3600)));
    let built = Registry::builder()
        .store(store)
        .clock(Arc::new(other))
        .tool(Charge)
        .build();
    assert!(
        matches!(built, Err(BuildError::ClockMismatch(_))),
        "{built:?}"
    );
}

#[test]
fn one_clock_shared_by_store_and_registry_is_accepted() {
    let clock = ManualClock::new(LONG_AGO);
    let built = Registry::builder()
        .store(MemoryStore::with_clock(Arc::new(clock.clone())))
        .clock(Arc::new(clock))
        .tool(Charge)
        .build();
    assert!(built.is_ok(), "{built:?}");
}
