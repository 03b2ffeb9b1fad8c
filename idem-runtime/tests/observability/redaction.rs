//! What leaves the process about a call: escalations pass the registry's redaction hook, and
//! the model never reads the store's own error text.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_runtime::identity::CanonicalJson;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::ClaimToken;
use idem_runtime::{
    call::ToolCall,
    escalation::{CallbackSink, Escalation},
    identity::IdemKey,
    registry::Registry,
    store::{IdemStore, MemoryStore, Record, RecordState, StoreError},
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

#[tokio::test]
async fn escalations_reach_the_sink_redacted() {
    let seen: Arc<Mutex<Vec<Escalation>>> = Arc::default();
    let sink_seen = seen.clone();
    let registry = Registry::builder()
        .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
            sink_seen.lock().unwrap().push(e.clone())
        })))
        .redact(|e| {
            if let Some(op) = e.operation.as_mut() {
                op.args = CanonicalJson::from_value(&json!("[redacted]"));
            }
            e.refused_args = None;
        })
        .tool(Charge)
        .build()
        .unwrap();
    let card = json!({"card": "4242424242424242"});
    let first = ToolCall::new("run", "charge", card).intent("order-1");
    assert!(registry.call(first).await.is_completed());
    let changed =
        ToolCall::new("run", "charge", json!({"card": "5555555555554444"})).intent("order-1");
    assert!(registry.call(changed).await.error().is_some());

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "the changed-params notice");
    let text = serde_json::to_string(&seen[0]).unwrap();
    assert!(!text.contains("4242") && !text.contains("5555"), "{text}");
    assert!(text.contains("[redacted]"), "{text}");
}

/// A send whose outcome nobody can know: the downstream has no key contract and the tool
/// no read-back, so the reconciler hands it to a person.
struct Unknowable;

impl idem_runtime::tool::WriteTool for Unknowable {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("send_parcel")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<&'static str, ToolError> {
        Err(ToolError::unknown("connection reset"))
    }
}

#[tokio::test]
async fn a_sink_given_to_the_reconciler_gets_escalations_redacted_too() {
    let registry = Registry::builder()
        .redact(|e| {
            if let Some(op) = e.operation.as_mut() {
                op.args = CanonicalJson::from_value(&json!("[redacted]"));
            }
        })
        .tool(Unknowable)
        .build()
        .unwrap();
    let card = json!({"card": "4242424242424242"});
    let call = ToolCall::new("run", "send_parcel", card).intent("parcel-1");
    assert_eq!(
        registry.call(call).await.class(),
        Some(idem_runtime::outcome::OutcomeClass::Unknown)
    );

    let seen: Arc<Mutex<Vec<Escalation>>> = Arc::default();
    let sink_seen = seen.clone();
    let reconciler = idem_runtime::reconcile::Reconciler::new(&registry).sink(Arc::new(
        CallbackSink(move |e: &Escalation| sink_seen.lock().unwrap().push(e.clone())),
    ));
    reconciler.run_once().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one escalation");
    let text = serde_json::to_string(&seen[0]).unwrap();
    assert!(!text.contains("4242"), "{text}");
    assert!(text.contains("[redacted]"), "{text}");
    // The record in the store keeps the arguments (a person finds them with `idem show`) and
    // the escalation's reason kind.
    let record = registry
        .store()
        .get(&seen[0].key)
        .await
        .unwrap()
        .expect("the escalated record");
    assert_eq!(record.state, RecordState::Escalated);
    assert!(
        serde_json::to_string(&record.operation)
            .unwrap()
            .contains("4242"),
        "the store keeps what the sink must not carry"
    );
    let detail = idem_runtime::escalation::EscalationDetail::of(&record);
    assert_eq!(
        detail.reason_kind,
        idem_runtime::escalation::ReasonKind::NoKeyNoReadBack
    );
    assert_eq!(seen[0].kind, detail.reason_kind);
}

/// A store whose settle fails with a raw backend reply, after the handler ran.
#[derive(Debug)]
struct SettleFails(MemoryStore);

#[async_trait]
impl IdemStore for SettleFails {
    // A test double that keeps no release traces: a release takes the record over and frees
    // it, a traced release settles and then releases, and no trace is listed.
    async fn release_unsettled(
        &self,
        key: &idem_runtime::identity::IdemKey,
        expected: idem_runtime::store::ClaimToken,
        _note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        let token = self
            .reclaim(key, expected, std::time::Duration::from_secs(60))
            .await?;
        self.release(key, token).await
    }

    async fn release_traced(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
        settlement: idem_runtime::store::backend::Settlement,
        note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        idem_runtime::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    async fn releases(
        &self,
        _key: &idem_runtime::identity::IdemKey,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    async fn list_releases(
        &self,
        _after: Option<&idem_runtime::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(req).await
    }
    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.0.renew(key, token, lease).await
    }
    async fn settle(&self, _: &IdemKey, _: ClaimToken, _: Settlement) -> Result<(), StoreError> {
        Err(StoreError::Backend(
            "ERR redis 10.0.0.7:6379 replied: -MOVED 3999 secret-host".into(),
        ))
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        self.0.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        self.0.reclaim(key, expected, lease).await
    }
    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }
    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.0.list(state, limit).await
    }
}

#[tokio::test]
async fn the_model_never_reads_the_stores_error_text() {
    let registry = Registry::builder()
        .store(SettleFails(MemoryStore::new()))
        .tool(Charge)
        .build()
        .unwrap();
    let result = registry
        .call(ToolCall::new("run", "charge", json!({})))
        .await;
    assert_eq!(
        result.class(),
        Some(idem_runtime::outcome::OutcomeClass::Unknown)
    );
    let text = result.text();
    assert!(
        !text.contains("secret-host") && !text.contains("10.0.0.7"),
        "{text}"
    );
    assert!(text.contains("store"), "{text}");
}
