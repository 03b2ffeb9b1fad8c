//! "Unavailable, not executed" (503, 429, overload): asked again within the call's budget,
//! keyed downstream or not, never sooner than Retry-After; then released, nothing done.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    call::ToolCall,
    outcome::OutcomeClass,
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore},
    tool::{Downstream, ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;
use tokio::time::Instant;

/// What the downstream answers, in order; `None` commits the charge.
type Script = VecDeque<Option<Option<Duration>>>;

/// A billing service: each request is logged with its (virtual) time; a commit adds to
/// the ledger.
#[derive(Default)]
struct Billing {
    script: Mutex<Script>,
    requests: Mutex<Vec<Instant>>,
    ledger: Mutex<Vec<String>>,
}

struct Charge(Arc<Billing>, Downstream);

impl idem_runtime::tool::WriteTool for Charge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge").downstream(self.1)
    }
    async fn call(&self, ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
        let b = &self.0;
        b.requests.lock().unwrap().push(Instant::now());
        match b.script.lock().unwrap().pop_front().flatten() {
            Some(Some(wait)) => Err(ToolError::unavailable_for("429 slow down", wait)),
            Some(None) => Err(ToolError::unavailable("503 overloaded")),
            None => {
                b.ledger.lock().unwrap().push(ctx.key().to_string());
                Ok("ch_1".into())
            }
        }
    }
}

fn registry(billing: &Arc<Billing>, downstream: Downstream, store: Arc<MemoryStore>) -> Registry {
    Registry::builder()
        .shared_store(store)
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(5)
                .initial_backoff(Duration::from_millis(100))
                .budget(Duration::from_secs(30)),
        )
        .tool(Charge(billing.clone(), downstream))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_write_is_asked_again_after_retry_after_and_completes_once() {
    for downstream in [Downstream::Unkeyed, Downstream::Keyed] {
        let billing = Arc::new(Billing::default());
        *billing.script.lock().unwrap() =
            VecDeque::from([Some(Some(Duration::from_secs(2))), Some(None), None]);
        let r = registry(&billing, downstream, Arc::new(MemoryStore::new()));
        let result = r.call(ToolCall::new("run", "charge", json!({}))).await;
        assert!(result.is_completed(), "{downstream:?}: {}", result.text());
        assert_eq!(billing.ledger.lock().unwrap().len(), 1);
        let requests = billing.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 3, "{downstream:?}");
        assert!(
            requests[1] - requests[0] >= Duration::from_secs(2),
            "asked again {:?} after a Retry-After of 2 s",
            requests[1] - requests[0]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn when_the_budget_is_spent_the_claim_is_released_and_nothing_was_done() {
    let billing = Arc::new(Billing::default());
    // Always "come back in 20 s": the second pause would end at 40 s, past the 30 s budget.
    *billing.script.lock().unwrap() = VecDeque::from(vec![Some(Some(Duration::from_secs(20))); 10]);
    let store = Arc::new(MemoryStore::new());
    let r = registry(&billing, Downstream::Unkeyed, store.clone());
    let result = r.call(ToolCall::new("run", "charge", json!({}))).await;
    assert_eq!(result.class(), Some(OutcomeClass::Unavailable));
    assert!(result.is_error());
    let text = result.text();
    assert!(
        text.contains("nothing was done") && text.contains("again"),
        "{text}"
    );
    assert_eq!(billing.requests.lock().unwrap().len(), 2);
    assert!(billing.ledger.lock().unwrap().is_empty());
    assert_eq!(
        store.get(result.key().unwrap()).await.unwrap(),
        None,
        "nothing ran: the key is free"
    );

    // Later, the same intent runs (once).
    *billing.script.lock().unwrap() = VecDeque::new();
    let again = r.call(ToolCall::new("run", "charge", json!({}))).await;
    assert!(again.is_completed(), "{}", again.text());
    assert!(!again.replayed());
    assert_eq!(billing.ledger.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn unavailable_after_an_unknown_attempt_stays_unknown() {
    // A keyed write times out (unknown), and the retry with the same key is refused as
    // unavailable: the first send may still have landed, so the key must not be freed.
    struct Slow(Arc<Billing>);
    impl idem_runtime::tool::WriteTool for Slow {
        type Args = serde_json::Map<String, serde_json::Value>;
        type Output = String;
        fn spec(&self) -> ToolSpec {
            ToolSpec::new("charge")
                .downstream(Downstream::Keyed)
                .timeout(Duration::from_secs(1))
        }
        async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
            let n = {
                let mut r = self.0.requests.lock().unwrap();
                r.push(Instant::now());
                r.len()
            };
            if n == 1 {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Err(ToolError::unavailable("503"))
        }
    }
    let billing = Arc::new(Billing::default());
    let store = Arc::new(MemoryStore::new());
    let r = Registry::builder()
        .shared_store(store.clone())
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(2)
                .budget(Duration::ZERO),
        )
        .tool(Slow(billing.clone()))
        .build()
        .unwrap();
    let result = r.call(ToolCall::new("run", "charge", json!({}))).await;
    assert_eq!(
        result.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        result.text()
    );
    let record = store.get(result.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, idem_runtime::store::RecordState::Unknown);
    assert_eq!(billing.requests.lock().unwrap().len(), 2);
}
