//! A timed-out handler whose result arrives after a person released its key: the effect
//! happened, so the key must not stay free for a second one, and the person must hear of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::reconcile::resolve;
use idem_runtime::{
    call::ToolCall,
    escalation::{CallbackSink, Escalation},
    reconcile::Resolution,
    registry::Registry,
    store::{IdemStore, MemoryStore, RecordState},
    tool::{ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;

#[derive(Default)]
struct Billing {
    ledger: Mutex<Vec<String>>,
    requests: Mutex<u32>,
}

/// Commits an hour after it was asked: long after its 1 s timeout, inside the two hours it
/// declares it may take (undeclared, its handler would be dropped after the default bound).
struct SlowCharge(Arc<Billing>);

impl idem_runtime::tool::WriteTool for SlowCharge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .timeout(Duration::from_secs(1))
            .in_flight_bound(Duration::from_secs(2 * 3600))
    }
    async fn call(&self, ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
        *self.0.requests.lock().unwrap() += 1;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        self.0.ledger.lock().unwrap().push(ctx.key().to_string());
        Ok("ch_1".into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_late_result_after_a_release_is_recorded_again_and_reported() {
    let billing = Arc::new(Billing::default());
    let store = Arc::new(MemoryStore::new());
    let notices: Arc<Mutex<Vec<Escalation>>> = Arc::default();
    let seen = notices.clone();
    let registry = Registry::builder()
        .shared_store(store.clone())
        .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
            seen.lock().unwrap().push(e.clone())
        })))
        .tool(SlowCharge(billing.clone()))
        .build()
        .unwrap();

    let first = registry
        .call(ToolCall::new("run", "charge", json!({})))
        .await;
    assert_eq!(
        first.class(),
        Some(idem_runtime::outcome::OutcomeClass::Unknown)
    );
    let key = first.key().unwrap().clone();

    // A person, seeing nothing in the ledger yet, frees the key: inside the bound, so only
    // by forcing it.
    resolve(
        &*store,
        &key,
        Resolution::ForceRelease {
            reason: "the bank's log shows no request".into(),
        },
        "not in the ledger",
    )
    .await
    .unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None);

    // The charge lands after all.
    tokio::time::sleep(Duration::from_secs(3700)).await;
    assert_eq!(billing.ledger.lock().unwrap().len(), 1);

    let record = store
        .get(&key)
        .await
        .unwrap()
        .expect("the late result is recorded again");
    assert_eq!(record.state, RecordState::Completed);
    assert!(
        record
            .attempts
            .iter()
            .any(|a| a.kind == idem_runtime::store::AttemptKind::Late),
        "{:?}",
        record.attempts
    );
    let notices = notices.lock().unwrap().clone();
    assert!(
        notices
            .iter()
            .any(|n| n.reason.contains("after its key was released")),
        "{notices:?}"
    );

    // The model asks again: replayed, not charged twice.
    let again = registry
        .call(ToolCall::new("run", "charge", json!({})))
        .await;
    assert!(again.replayed() && again.is_completed(), "{}", again.text());
    assert_eq!(*billing.requests.lock().unwrap(), 1);
    assert_eq!(billing.ledger.lock().unwrap().len(), 1);
}
