//! The reconciler's decisions, each asserted against a stub downstream's ledger.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{ClaimToken, ListCursor, ManualClock, Record, StoreError, Timestamp};
use idem_runtime::{
    call::{CallError, ToolCall},
    identity::IdemKey,
    outcome::OutcomeClass,
    reconcile::{Reconciler, Resolution},
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{Downstream, ReadBack, ReadBackCtx, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use idem_runtime::{
    escalation::{Escalation, EscalationSink},
    reconcile::{resolve, Action},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What the stub does with the next request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Commit, lose the response.
    LostAck,
    /// Do nothing now; commit when `land()` is called (a request still in flight).
    InFlight,
    /// Nothing committed, response lost (timed out before it reached the server).
    DroppedRequest,
    /// Accept asynchronously: pending until `finish_pending()`.
    Async,
}

#[derive(Default)]
struct Stub {
    /// key → (charge id, status)
    charges: Mutex<Vec<(String, String, &'static str)>>,
    in_flight: Mutex<Vec<String>>,
    faults: Mutex<VecDeque<Fault>>,
    sends: AtomicU32,
    /// The next this many read-backs fail (the downstream's lookup answers 503).
    read_back_errors: AtomicU32,
    /// A charge is one item of a two-item batch: the read-back finds the batch partial.
    partial: AtomicBool,
    keyed: bool,
}

impl Stub {
    fn new(keyed: bool, faults: impl IntoIterator<Item = Fault>) -> Arc<Stub> {
        Arc::new(Stub {
            keyed,
            faults: Mutex::new(faults.into_iter().collect()),
            ..Stub::default()
        })
    }
    fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
    fn commit(&self, key: &str, status: &'static str) -> String {
        let mut c = self.charges.lock().unwrap();
        if self.keyed {
            if let Some((_, id, _)) = c.iter().find(|(k, _, _)| k == key) {
                return id.clone();
            }
        }
        let id = format!("ch_{}", c.len() + 1);
        c.push((key.to_owned(), id.clone(), status));
        id
    }
    /// Everything in flight lands now.
    fn land(&self) {
        for key in std::mem::take(&mut *self.in_flight.lock().unwrap()) {
            self.commit(&key, "succeeded");
        }
    }
    fn finish_pending(&self) {
        for c in self.charges.lock().unwrap().iter_mut() {
            if c.2 == "pending" {
                c.2 = "succeeded";
            }
        }
    }
    /// One key's pending charge clears; the others stay pending.
    fn finish_pending_of(&self, key: &str) {
        for c in self.charges.lock().unwrap().iter_mut() {
            if c.0 == key && c.2 == "pending" {
                c.2 = "succeeded";
            }
        }
    }
    fn find(&self, key: &str) -> Vec<(String, &'static str)> {
        self.charges
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, id, s)| (id.clone(), *s))
            .collect()
    }
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

struct Charge {
    stub: Arc<Stub>,
    spec: ToolSpec,
    read_back: bool,
}

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = serde_json::Value;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, ctx: WriteCtx, _args: ChargeArgs) -> Result<serde_json::Value, ToolError> {
        self.stub.sends.fetch_add(1, Ordering::SeqCst);
        let key = ctx.key().as_str();
        let fault = self
            .stub
            .faults
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Fault::None);
        match fault {
            Fault::None => Ok(json!({ "id": self.stub.commit(key, "succeeded") })),
            Fault::LostAck => {
                self.stub.commit(key, "succeeded");
                Err(ToolError::unknown("timeout"))
            }
            Fault::InFlight => {
                self.stub.in_flight.lock().unwrap().push(key.to_owned());
                Err(ToolError::unknown("timeout"))
            }
            Fault::DroppedRequest => Err(ToolError::unknown("timeout")),
            Fault::Async => Err(ToolError::pending(self.stub.commit(key, "pending"))),
        }
    }
    async fn read_back(&self, ctx: ReadBackCtx, _args: ChargeArgs) -> Result<ReadBack, ToolError> {
        if !self.read_back {
            return Ok(ReadBack::Unsupported);
        }
        let failing =
            self.stub
                .read_back_errors
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(ToolError::unknown("lookup answered 503"));
        }
        let found = self.stub.find(ctx.key().as_str());
        Ok(match found.as_slice() {
            [] => ReadBack::NotFound,
            [(id, _)] if self.stub.partial.load(Ordering::SeqCst) => ReadBack::Partial {
                landed: vec![format!("item 1: {id}")],
                left: vec!["item 2".into()],
            },
            [(id, "succeeded")] => ReadBack::Completed {
                downstream_ref: Some(id.clone()),
                output: json!({ "id": id }),
            },
            [(id, "pending")] => ReadBack::Pending {
                downstream_ref: id.clone(),
            },
            [(id, _)] => ReadBack::Failed {
                downstream_ref: Some(id.clone()),
                message: "declined".into(),
            },
            many => ReadBack::Ambiguous {
                downstream_refs: many.iter().map(|(id, _)| id.clone()).collect(),
            },
        })
    }
}

/// What the store and the sink do to the reconciler's escalation, when armed.
#[derive(Default)]
struct Trap {
    /// A settle to `escalated` never returns: the reconciler dies (its future is dropped)
    /// between delivering the escalation and recording it.
    hang_escalated_settle: AtomicBool,
    /// A settle to `escalated` fails before it is applied.
    fail_escalated_settle: AtomicBool,
    /// The sink refuses this many deliveries.
    sink_refusals: AtomicU32,
    /// The sink never answers (a webhook that hangs).
    sink_hangs: AtomicBool,
}

/// The test's `MemoryStore`, behind the [`Trap`].
#[derive(Debug)]
struct Trapped {
    inner: Arc<MemoryStore>,
    trap: Arc<Trap>,
}

impl std::fmt::Debug for Trap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Trap")
    }
}

#[async_trait::async_trait]
impl IdemStore for Trapped {
    // A traced release settles and then releases, in two steps; no trace is listed.
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

    async fn list_releases(
        &self,
        _after: Option<&idem_runtime::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    fn clock(&self) -> Arc<dyn idem_runtime::store::Clock> {
        self.inner.clock()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(req).await
    }
    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        s: Settlement,
    ) -> Result<(), StoreError> {
        if s.state == RecordState::Escalated {
            if self.trap.hang_escalated_settle.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            if self
                .trap
                .fail_escalated_settle
                .swap(false, Ordering::SeqCst)
            {
                return Err(StoreError::Unavailable("connection reset".into()));
            }
        }
        self.inner.settle(key, token, s).await
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        self.inner.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        self.inner.reclaim(key, expected, lease).await
    }
    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list(state, limit).await
    }
    async fn list_after(
        &self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_after(state, after, limit).await
    }
    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), StoreError> {
        self.inner.release_unsettled(key, expected, note).await
    }
    async fn releases(
        &self,
        key: &IdemKey,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, StoreError> {
        self.inner.releases(key).await
    }
}

struct World {
    registry: Registry,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    stub: Arc<Stub>,
    escalations: Arc<Mutex<Vec<Escalation>>>,
    trap: Arc<Trap>,
}

impl World {
    fn new(stub: Arc<Stub>, read_back: bool, spec: impl FnOnce(ToolSpec) -> ToolSpec) -> World {
        let clock = ManualClock::new(Timestamp(1_800_000_000_000));
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let escalations = Arc::new(Mutex::new(Vec::new()));
        let seen = escalations.clone();
        let trap = Arc::new(Trap::default());
        let refuse = trap.clone();
        let base = ToolSpec::new("charge").description("Charge.");
        let base = if stub.keyed {
            base.downstream(Downstream::Keyed)
        } else {
            base
        };
        let registry = Registry::builder()
            .store(Trapped {
                inner: store.clone(),
                trap: trap.clone(),
            })
            .clock(Arc::new(clock.clone()))
            .retry_policy(RetryPolicy::never())
            .escalation_sink(Arc::new(RefusingSink { seen, refuse }))
            .tool(Charge {
                stub: stub.clone(),
                spec: spec(base),
                read_back,
            })
            .build()
            .unwrap();
        World {
            registry,
            store,
            clock,
            stub,
            escalations,
            trap,
        }
    }

    async fn call(&self) -> idem_runtime::call::ToolResult {
        self.registry
            .call(ToolCall::new(
                "run-1",
                "charge",
                json!({"customer": "acme", "cents": 4900}),
            ))
            .await
    }

    async fn state(&self, r: &idem_runtime::call::ToolResult) -> Option<RecordState> {
        self.store
            .get(r.key().unwrap())
            .await
            .unwrap()
            .map(|rec| rec.state)
    }

    async fn pass(&self) -> Vec<Action> {
        self.pass_with(|r| r).await
    }

    /// A pass once the next same-key retry is due (the longest backoff later), by a
    /// reconciler that retries a keyed operation at most three times.
    async fn retry_pass(&self) -> Vec<Action> {
        self.clock
            .advance(idem_runtime::reconcile::RETRY_BACKOFF_MAX);
        self.pass_with(|r| r.max_retries(3)).await
    }

    async fn pass_with(&self, reconciler: impl FnOnce(Reconciler) -> Reconciler) -> Vec<Action> {
        reconciler(Reconciler::new(&self.registry))
            .run_once()
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.action)
            .collect()
    }
}

/// Keeps every escalation it takes; refuses as many as the trap says first.
#[derive(Debug)]
struct RefusingSink {
    seen: Arc<Mutex<Vec<Escalation>>>,
    refuse: Arc<Trap>,
}

#[async_trait::async_trait]
impl EscalationSink for RefusingSink {
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        let refused =
            self.refuse
                .sink_refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if refused.is_ok() {
            return Err("pager unreachable".into());
        }
        if self.refuse.sink_hangs.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        self.seen.lock().unwrap().push(e.clone());
        Ok(())
    }
}

#[tokio::test]
async fn keyed_unknown_inside_the_window_is_retried_with_the_same_key() {
    let w = World::new(Stub::new(true, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    assert_eq!(w.retry_pass().await, [Action::Retried]);
    assert_eq!(
        w.stub.sends.load(Ordering::SeqCst),
        2,
        "sent again, same key"
    );
    assert_eq!(w.stub.charges(), 1, "the keyed downstream replayed");
    assert_eq!(w.state(&first).await, Some(RecordState::Completed));
    let again = w.call().await;
    assert!(again.replayed() && again.is_completed());
}

#[tokio::test]
async fn keyed_unknown_past_the_window_is_never_retried() {
    let w = World::new(Stub::new(true, [Fault::LostAck]), false, |s| {
        s.window(Duration::from_secs(3600))
    });
    let first = w.call().await;
    w.clock.advance(Duration::from_secs(3601));
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 1);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    let e = &w.escalations.lock().unwrap()[0];
    assert!(e.reason.contains("window"), "{}", e.reason);
}

#[tokio::test]
async fn a_keyed_downstream_that_keeps_failing_is_escalated_with_every_attempt() {
    let faults = [Fault::DroppedRequest; 10];
    let w = World::new(Stub::new(true, faults), false, |s| s);
    let first = w.call().await;
    let mut actions = Vec::new();
    for _ in 0..6 {
        actions.extend(w.retry_pass().await);
    }
    assert_eq!(actions.iter().filter(|a| **a == Action::Retried).count(), 3);
    assert_eq!(actions.last(), Some(&Action::Escalated));
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    let escalations = w.escalations.lock().unwrap();
    let e = escalations.last().unwrap();
    assert_eq!(
        e.attempts.len(),
        4,
        "the executor's attempt and three retries, all carried"
    );
    assert!(e.attempts.iter().all(|a| a.message.is_some()));
    assert_eq!(e.operation.as_ref().unwrap().args["cents"], 4900);
    assert_eq!(w.stub.charges(), 0);
}

#[tokio::test]
async fn no_key_contract_and_no_read_back_is_escalated() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert!(w.escalations.lock().unwrap()[0]
        .reason
        .contains("no key contract"));
    let again = w.call().await;
    assert_eq!(again.class(), Some(OutcomeClass::Escalated));
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 1)
    );
}

#[tokio::test]
async fn a_read_back_that_finds_the_effect_settles_it() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), true, |s| s);
    let first = w.call().await;
    assert_eq!(w.pass().await, [Action::Settled]);
    let rec = w.store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.downstream_ref.as_deref(), Some("ch_1"));
    assert_eq!(rec.read_backs.len(), 1);
    let again = w.call().await;
    assert_eq!(again.output(), Some(&json!({"id": "ch_1"})));
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 1)
    );
}

/// A record names the tool that claimed it. Renamed, the tool that keeps the old name as its
/// key name settles what it left unknown: the read-back finds the charge (under the same
/// key), and nothing is sent again.
#[tokio::test]
async fn a_renamed_tool_settles_the_records_of_its_old_name() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), true, |s| s);
    let first = w.call().await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let renamed = Registry::builder()
        .shared_store(w.store.clone())
        .retry_policy(RetryPolicy::never())
        .tool(Charge {
            stub: w.stub.clone(),
            spec: ToolSpec::new("charge_card").key_name("charge"),
            read_back: true,
        })
        .build()
        .unwrap();
    let decisions = Reconciler::new(&renamed).run_once().await.unwrap();
    let actions: Vec<Action> = decisions.into_iter().map(|d| d.action).collect();
    assert_eq!(actions, [Action::Settled]);
    let rec = w.store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.downstream_ref.as_deref(), Some("ch_1"));
    let again = renamed
        .call(ToolCall::new(
            "run-1",
            "charge_card",
            json!({"customer": "acme", "cents": 4900}),
        ))
        .await;
    assert!(again.replayed(), "{:?}", again.as_result());
    assert_eq!(again.key(), first.key());
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 1)
    );
}

#[tokio::test]
async fn a_late_commit_after_a_not_found_inside_the_bound_is_not_duplicated() {
    let bound = Duration::from_secs(120);
    let w = World::new(Stub::new(false, [Fault::InFlight]), true, |s| {
        s.in_flight_bound(bound)
    });
    let first = w.call().await;
    // Read-back inside the bound: nothing found yet, and that proves nothing.
    assert_eq!(w.pass().await, [Action::Waiting]);
    assert_eq!(
        w.call().await.class(),
        Some(OutcomeClass::Unknown),
        "still not sent again"
    );
    // The original lands, still inside the bound.
    w.clock.advance(Duration::from_secs(90));
    w.stub.land();
    assert_eq!(w.pass().await, [Action::Settled]);
    assert_eq!(w.state(&first).await, Some(RecordState::Completed));
    w.clock.advance(Duration::from_secs(3600));
    assert!(w.pass().await.is_empty());
    let again = w.call().await;
    assert!(again.replayed());
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 1)
    );
    let rec = w.store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.read_backs.len(), 2, "both read-backs are evidence");
}

#[tokio::test]
async fn not_found_after_the_bound_frees_the_intent_to_run_again() {
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), true, |s| {
        s.in_flight_bound(Duration::from_secs(60))
    });
    let first = w.call().await;
    // Not yet: the send may land until its start + timeout (30 s) + twice the bound.
    w.clock.advance(Duration::from_secs(149));
    assert_eq!(w.pass().await, [Action::Waiting]);
    w.clock.advance(Duration::from_secs(2));
    assert_eq!(w.pass().await, [Action::Released]);
    assert_eq!(w.state(&first).await, None);
    let again = w.call().await;
    assert!(again.is_completed() && !again.replayed());
    assert_eq!(again.key(), first.key(), "the same key");
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (2, 1)
    );
    // The release stays reviewable beside the new record: by the reconciler, with the
    // unknown record it freed.
    let trace = w.store.releases(first.key().unwrap()).await.unwrap();
    assert_eq!(trace.len(), 1, "{trace:?}");
    assert_eq!(trace[0].by, idem_runtime::reconcile::RECONCILER);
    assert_eq!(trace[0].record.state, RecordState::Unknown);
    assert!(!trace[0].note.is_empty());
}

#[tokio::test]
async fn not_found_without_a_declared_bound_goes_to_a_person_after_the_default_bound() {
    // Timeout 30 s, no bound declared: the default bound is 4 × 30 s = 2 min, so the send
    // may land until its start + 30 s + 2 × 2 min. The default is a guess about the
    // downstream: after it, "not found" is handed to a person, never taken as "did not
    // happen" (a late commit after a release would be a second effect).
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), true, |s| s);
    let first = w.call().await;
    w.clock.advance(Duration::from_secs(269));
    assert_eq!(w.pass().await, [Action::Waiting]);
    assert_eq!(w.state(&first).await, Some(RecordState::Unknown));
    w.clock.advance(Duration::from_secs(2));
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    let escalations = w.escalations.lock().unwrap();
    assert_eq!(escalations.len(), 1);
    assert!(
        escalations[0]
            .reason
            .contains("declares no in-flight bound"),
        "{}",
        escalations[0].reason
    );
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 1);
}

/// The key's record, which must exist.
async fn record_of(w: &World, r: &idem_runtime::call::ToolResult) -> idem_runtime::store::Record {
    w.store.get(r.key().unwrap()).await.unwrap().unwrap()
}

fn failed_read_backs(record: &idem_runtime::store::Record) -> usize {
    record
        .read_backs
        .iter()
        .filter(|rb| rb.result == "error: outcome unknown: lookup answered 503")
        .count()
}

#[tokio::test]
async fn a_read_back_that_keeps_failing_is_escalated_after_ten_in_a_row() {
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), true, |s| s);
    w.stub.read_back_errors.store(u32::MAX, Ordering::SeqCst);
    let first = w.call().await;
    for pass in 1..10 {
        assert_eq!(w.pass().await, [Action::Waiting], "pass {pass}");
        let record = record_of(&w, &first).await;
        assert_eq!(record.state, RecordState::Unknown);
        assert_eq!(failed_read_backs(&record), pass, "each failure is evidence");
        assert!(w.escalations.lock().unwrap().is_empty());
    }
    assert_eq!(w.pass().await, [Action::Escalated]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(record.read_backs.len(), 10, "{:?}", record.read_backs);
    assert_eq!(failed_read_backs(&record), 10);
    assert!(record
        .message
        .as_deref()
        .unwrap()
        .contains("10 times in a row"));
    {
        let escalations = w.escalations.lock().unwrap();
        assert_eq!(escalations.len(), 1);
        let e = &escalations[0];
        assert_eq!(&e.key, first.key().unwrap());
        assert_eq!(e.state, RecordState::Escalated);
        assert_eq!(
            e.read_backs, record.read_backs,
            "the person sees every failure"
        );
    }
    // Escalated: not walked again, and repeats are not sent.
    assert!(w.pass().await.is_empty());
    assert_eq!(w.call().await.class(), Some(OutcomeClass::Escalated));
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_read_back_that_answers_starts_the_count_again() {
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), true, |s| {
        s.in_flight_bound(Duration::from_secs(3600))
    });
    let first = w.call().await;
    let limited = |r: Reconciler| r.max_failed_read_backs(3);
    w.stub.read_back_errors.store(2, Ordering::SeqCst);
    assert_eq!(w.pass_with(limited).await, [Action::Waiting]);
    assert_eq!(w.pass_with(limited).await, [Action::Waiting]);
    // The lookup answers ("not found", inside the bound): noted, and the run is over.
    assert_eq!(w.pass_with(limited).await, [Action::Waiting]);
    w.stub.read_back_errors.store(u32::MAX, Ordering::SeqCst);
    assert_eq!(w.pass_with(limited).await, [Action::Waiting]);
    assert_eq!(w.pass_with(limited).await, [Action::Waiting]);
    assert_eq!(w.state(&first).await, Some(RecordState::Unknown));
    assert!(w.escalations.lock().unwrap().is_empty());
    assert_eq!(w.pass_with(limited).await, [Action::Escalated]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.read_backs.len(), 6);
    assert_eq!(failed_read_backs(&record), 5);
    assert_eq!(w.escalations.lock().unwrap()[0].read_backs.len(), 6);
}

#[tokio::test]
async fn a_pending_record_whose_read_back_keeps_failing_is_escalated() {
    let w = World::new(Stub::new(false, [Fault::Async]), true, |s| s);
    let first = w.call().await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    // Polls that find it still pending leave nothing on the record.
    assert_eq!(w.pass().await, [Action::Waiting]);
    assert!(record_of(&w, &first).await.read_backs.is_empty());
    w.stub.read_back_errors.store(u32::MAX, Ordering::SeqCst);
    for pass in 1..10 {
        assert_eq!(w.pass().await, [Action::Waiting], "pass {pass}");
        let record = record_of(&w, &first).await;
        assert_eq!(record.state, RecordState::Pending);
        assert_eq!(failed_read_backs(&record), pass);
    }
    assert_eq!(w.pass().await, [Action::Escalated]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(failed_read_backs(&record), 10);
    assert_eq!(w.escalations.lock().unwrap()[0].read_backs.len(), 10);
}

#[tokio::test]
async fn read_back_evidence_stays_capped_and_failures_still_escalate() {
    // A long bound: "not found" is noted on every pass, 40 times, before the lookup breaks.
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), true, |s| {
        s.in_flight_bound(Duration::from_secs(24 * 3600))
    });
    let first = w.call().await;
    for _ in 0..40 {
        assert_eq!(w.pass().await, [Action::Waiting]);
    }
    let kept = idem_runtime::store::backend::rules::EVIDENCE_KEPT;
    let record = record_of(&w, &first).await;
    assert_eq!(
        record.read_backs.len(),
        2 * kept + 1,
        "first and last 16, and the marker"
    );
    w.stub.read_back_errors.store(u32::MAX, Ordering::SeqCst);
    let actions: Vec<_> = {
        let mut all = Vec::new();
        for _ in 0..10 {
            all.extend(w.pass().await);
        }
        all
    };
    assert_eq!(actions.iter().filter(|a| **a == Action::Waiting).count(), 9);
    assert_eq!(actions.last(), Some(&Action::Escalated));
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(record.read_backs.len(), 2 * kept + 1, "still capped");
    assert_eq!(
        failed_read_backs(&record),
        10,
        "the last ten are the failures"
    );
    let marker = record
        .read_backs
        .iter()
        .find(|rb| {
            rb.result
                .starts_with(idem_runtime::store::backend::rules::EVIDENCE_MARKER)
        })
        .expect("the marker counts what was dropped");
    assert_eq!(
        marker.result,
        "idem evidence cap: 0 attempts and 18 read-backs dropped"
    );
}

#[tokio::test]
async fn a_keyed_record_out_of_attempts_is_settled_by_its_read_back() {
    // Every send commits and loses its answer: the keyed downstream holds one charge.
    let w = World::new(Stub::new(true, [Fault::LostAck; 4]), true, |s| s);
    let first = w.call().await;
    let mut actions = Vec::new();
    for _ in 0..3 {
        actions.extend(w.retry_pass().await);
    }
    assert_eq!(actions, [Action::Retried; 3]);
    assert_eq!(w.state(&first).await, Some(RecordState::Unknown));
    // Attempts spent: read back before escalating, and it finds the charge.
    assert_eq!(w.retry_pass().await, [Action::Settled]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.downstream_ref.as_deref(), Some("ch_1"));
    assert!(w.escalations.lock().unwrap().is_empty());
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (4, 1)
    );
    assert!(w.call().await.replayed());
}

#[tokio::test]
async fn a_keyed_record_out_of_attempts_whose_read_back_fails_is_escalated_with_it() {
    let w = World::new(Stub::new(true, [Fault::DroppedRequest; 4]), true, |s| s);
    let first = w.call().await;
    for _ in 0..3 {
        assert_eq!(w.retry_pass().await, [Action::Retried]);
    }
    w.stub.read_back_errors.store(1, Ordering::SeqCst);
    assert_eq!(w.retry_pass().await, [Action::Escalated]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(failed_read_backs(&record), 1);
    let e = &w.escalations.lock().unwrap()[0];
    assert!(e.reason.contains("after 4 attempts"), "{}", e.reason);
    assert_eq!(e.attempts.len(), 4);
    assert_eq!(e.read_backs.len(), 1);
    assert_eq!(w.stub.charges(), 0);
}

#[tokio::test]
async fn pending_is_polled_until_terminal() {
    let w = World::new(Stub::new(false, [Fault::Async]), true, |s| s);
    let first = w.call().await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    assert_eq!(w.pass().await, [Action::Waiting]);
    assert_eq!(w.state(&first).await, Some(RecordState::Pending));
    w.stub.finish_pending();
    assert_eq!(w.pass().await, [Action::Settled]);
    assert_eq!(w.state(&first).await, Some(RecordState::Completed));
    assert!(w.call().await.replayed());
    assert_eq!(w.stub.charges(), 1);
}

#[tokio::test]
async fn more_than_one_effect_found_is_escalated() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), true, |s| s);
    let first = w.call().await;
    // Someone (another system, a person) created a second charge with the same key.
    w.stub.commit(first.key().unwrap().as_str(), "succeeded");
    assert_eq!(w.pass().await, [Action::Escalated]);
    let e = w.escalations.lock().unwrap()[0].clone();
    assert!(e.reason.contains("2 effects"), "{}", e.reason);
    assert_eq!(e.read_backs.len(), 1);
    // Escalated in the store too, and nothing sent or charged on top of the two effects.
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 2)
    );
    // A later pass leaves it to a person: still nothing sent.
    w.clock.advance(Duration::from_secs(3600));
    assert!(w.pass().await.is_empty());
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_person_resolves_an_escalation_and_the_next_call_obeys() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    w.pass().await;
    let key = first.key().unwrap();
    let store: &dyn IdemStore = &*w.store;
    resolve(
        store,
        key,
        Resolution::Completed {
            downstream_ref: "ch_1".into(),
            output: None,
        },
        "found it in the dashboard",
    )
    .await
    .unwrap();
    let again = w.call().await;
    assert_eq!(again.output(), Some(&json!({"downstream_ref": "ch_1"})));
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 1);

    // Release: a second operation that a person decides never happened runs again.
    let w = World::new(Stub::new(false, [Fault::DroppedRequest]), false, |s| s);
    let first = w.call().await;
    w.pass().await;
    // Once no send can land any more (by the largest defaults: `resolve` has no tool).
    w.clock.advance(Duration::from_secs(90 * 60));
    resolve(
        &*w.store,
        first.key().unwrap(),
        Resolution::Release,
        "not in the ledger",
    )
    .await
    .unwrap();
    assert!(w.call().await.is_completed());
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (2, 1)
    );
    // Completed records are not a person's to change.
    assert!(
        resolve(&*w.store, first.key().unwrap(), Resolution::Release, "")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn changed_params_are_refused_and_reported_to_a_person() {
    let w = World::new(Stub::new(false, []), false, |s| s);
    let call = |cents: u64| {
        ToolCall::new(
            "run-1",
            "charge",
            json!({"customer": "acme", "cents": cents}),
        )
        .intent("order-9")
    };
    let first = w.registry.call(call(4900)).await;
    let changed = w.registry.call(call(9900)).await;
    assert!(matches!(
        changed.error(),
        Some(CallError::ChangedParams { .. })
    ));
    assert_eq!(
        w.state(&first).await,
        Some(RecordState::Completed),
        "the original record is untouched"
    );
    let notices = w.escalations.lock().unwrap();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].refused_args.as_ref().unwrap()["cents"], 9900);
    assert_eq!(notices[0].operation.as_ref().unwrap().args["cents"], 4900);
    assert_eq!(w.stub.charges(), 1);
}

impl World {
    /// A charge for its own customer: a key of its own.
    async fn call_for(&self, customer: &str) -> idem_runtime::call::ToolResult {
        self.registry
            .call(ToolCall::new(
                "run-1",
                "charge",
                json!({"customer": customer, "cents": 4900}),
            ))
            .await
    }
}

#[tokio::test]
async fn records_that_stay_pending_do_not_starve_newer_ones() {
    let w = World::new(Stub::new(false, [Fault::Async; 4]), true, |s| s);
    // Three transfers that stay pending for days, then a newer one that clears at once.
    let mut keys = Vec::new();
    for customer in ["old-1", "old-2", "old-3", "new"] {
        let r = w.call_for(customer).await;
        assert_eq!(r.class(), Some(OutcomeClass::Pending));
        keys.push(r.key().unwrap().clone());
        w.clock.advance(Duration::from_secs(60));
    }
    let newest = keys.last().unwrap();
    w.stub.finish_pending_of(newest.as_str());

    // One reconciler across passes, as `spawn` runs it, looking at two records per pass.
    let reconciler = Reconciler::new(&w.registry).batch(2);
    let mut passes = 0;
    while w.store.get(newest).await.unwrap().unwrap().state == RecordState::Pending {
        passes += 1;
        assert!(
            passes <= 2,
            "the newer record must be looked at within ⌈4 / 2⌉ passes, not starved behind \
             the older ones that stay pending"
        );
        let decisions = reconciler.run_once().await.unwrap();
        assert!(decisions.len() <= 2, "at most `batch` records per pass");
    }
    let record = w.store.get(newest).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.downstream_ref.as_deref(), Some("ch_4"));
    for old in &keys[..3] {
        assert_eq!(
            w.store.get(old).await.unwrap().unwrap().state,
            RecordState::Pending,
            "the older transfers are still pending, and were not sent again"
        );
    }
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_backlog_larger_than_the_batch_is_walked_round_robin() {
    let w = World::new(Stub::new(false, [Fault::Async; 5]), true, |s| s);
    let mut keys = Vec::new();
    for i in 0..5 {
        // Two calls per claim time: a page boundary falls among records of one millisecond.
        if i % 2 == 0 {
            w.clock.advance(Duration::from_secs(1));
        }
        keys.push(
            w.call_for(&format!("customer-{i}"))
                .await
                .key()
                .unwrap()
                .clone(),
        );
    }
    let reconciler = Reconciler::new(&w.registry).batch(2);
    let mut visits = std::collections::HashMap::new();
    for pass in 0..5 {
        let decisions = reconciler.run_once().await.unwrap();
        assert_eq!(decisions.len(), 2, "pass {pass} uses its whole batch");
        assert_ne!(
            decisions[0].key, decisions[1].key,
            "no record twice in a pass"
        );
        for d in decisions {
            assert_eq!(d.action, Action::Waiting);
            *visits.entry(d.key).or_insert(0) += 1;
        }
    }
    // 5 passes × 2 = 10 looks at 5 records: each looked at exactly twice, none left out.
    for k in &keys {
        assert_eq!(
            visits.get(k),
            Some(&2),
            "{k} looked at twice in five passes"
        );
    }
}

#[tokio::test]
async fn a_one_shot_run_looks_at_every_record_however_small_the_batch() {
    let w = World::new(Stub::new(false, [Fault::Async; 5]), true, |s| s);
    let mut keys = Vec::new();
    for i in 0..5 {
        keys.push(
            w.call_for(&format!("customer-{i}"))
                .await
                .key()
                .unwrap()
                .clone(),
        );
        w.clock.advance(Duration::from_secs(1));
    }
    // The newest clears downstream: a one-shot run (the CLI, a cron job) with batch 2 must
    // reach it, not stop after the two oldest.
    let newest = keys.last().unwrap();
    w.stub.finish_pending_of(newest.as_str());
    let decisions = Reconciler::new(&w.registry)
        .batch(2)
        .run_all()
        .await
        .unwrap();
    let mut seen: Vec<_> = decisions.iter().map(|d| d.key.clone()).collect();
    seen.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(seen, expected, "each record looked at exactly once");
    assert_eq!(
        w.store.get(newest).await.unwrap().unwrap().state,
        RecordState::Completed
    );
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 5, "nothing sent again");
}

#[tokio::test]
async fn a_keyed_record_out_of_attempts_that_is_not_found_is_escalated_not_released() {
    let w = World::new(Stub::new(true, [Fault::InFlight; 4]), true, |s| {
        s.in_flight_bound(Duration::from_secs(1))
    });
    let first = w.call().await;
    for _ in 0..3 {
        assert_eq!(w.retry_pass().await, [Action::Retried]);
    }
    // Long past the bound: outside a keyed window "not found" would free the key. Inside
    // it, with the sends used up, a person decides.
    w.clock.advance(Duration::from_secs(600));
    assert_eq!(w.retry_pass().await, [Action::Escalated]);
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(record.read_backs.len(), 1);
    assert_eq!(record.read_backs[0].result, "not found");
    // The sends still on their way land: the record that says so is still there.
    w.stub.land();
    assert_eq!(w.stub.charges(), 1);
    assert_eq!(w.call().await.class(), Some(OutcomeClass::Escalated));
    assert_eq!(w.stub.sends.load(Ordering::SeqCst), 4);
}

/// A reconciler that dies between handing the escalation to the sink and recording the
/// record escalated (its pass is dropped at the settle): the person was told, and the record,
/// left running under the dead reconciler's takeover, lapses to unknown and is escalated
/// again, under the same id, by the next pass. Told twice, never not at all.
#[tokio::test]
async fn a_reconciler_killed_between_the_sink_and_the_settle_still_told_a_person() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    let key = first.key().unwrap().clone();
    w.trap.hang_escalated_settle.store(true, Ordering::SeqCst);
    let reconciler = Reconciler::new(&w.registry);
    let killed = tokio::time::timeout(Duration::from_millis(200), reconciler.run_once()).await;
    assert!(
        killed.is_err(),
        "the pass hung at the settle and was dropped"
    );
    {
        let told = w.escalations.lock().unwrap();
        assert_eq!(told.len(), 1, "delivered before the settle");
        assert_eq!(told[0].key, key);
        assert_eq!(told[0].state, RecordState::Escalated);
    }
    let record = w.store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::Running,
        "the settle never happened"
    );

    // The process is gone; its takeover lapses and the next reconciler escalates again.
    w.trap.hang_escalated_settle.store(false, Ordering::SeqCst);
    let lease = w.registry.get("charge").unwrap().spec().lease_duration();
    w.clock.advance(lease + Duration::from_secs(1));
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    let told = w.escalations.lock().unwrap().clone();
    assert_eq!(told.len(), 2, "told again: at least once, maybe twice");
    assert_eq!(told[0].id, told[1].id, "one id: a sink can drop the repeat");
    assert!(told[0].id.contains(key.as_str()), "{}", told[0].id);
    assert_eq!(
        w.pass().await,
        Vec::<Action>::new(),
        "escalated: not walked again"
    );
    assert_eq!(w.escalations.lock().unwrap().len(), 2);
}

/// The settle's store call fails (not applied) after the delivery: the same as a crash there,
/// the decision says so, and the record is escalated by a later pass.
#[tokio::test]
async fn an_escalated_settle_that_fails_after_the_delivery_is_escalated_again() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    w.trap.fail_escalated_settle.store(true, Ordering::SeqCst);
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.escalations.lock().unwrap().len(), 1);
    assert_eq!(w.state(&first).await, Some(RecordState::Running));
    let lease = w.registry.get("charge").unwrap().spec().lease_duration();
    w.clock.advance(lease + Duration::from_secs(1));
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert_eq!(w.escalations.lock().unwrap().len(), 2);
    assert_eq!(
        (w.stub.sends.load(Ordering::SeqCst), w.stub.charges()),
        (1, 1)
    );
}

/// A sink that refuses the escalation: the record is put back as it was (unknown, the
/// evidence kept), not escalated with nobody told, and the next pass delivers it.
#[tokio::test]
async fn a_refused_escalation_leaves_the_record_unknown_until_a_sink_takes_it() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    w.trap.sink_refusals.store(1, Ordering::SeqCst);
    assert_eq!(w.pass().await, [Action::Waiting]);
    assert!(w.escalations.lock().unwrap().is_empty());
    let record = w.store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(record.attempts.len(), 1, "the evidence stays");
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert_eq!(w.escalations.lock().unwrap().len(), 1);
}

/// A sink that never answers: the reconciler gives up on it at half the takeover's lease,
/// before the takeover can lapse, and puts the record back as it was; the next pass, with the
/// sink answering again, escalates it.
#[tokio::test(start_paused = true)]
async fn a_sink_that_hangs_is_a_refusal_before_the_takeover_lapses() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), false, |s| s);
    let first = w.call().await;
    w.trap.sink_hangs.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    assert_eq!(w.pass().await, [Action::Waiting]);
    let lease = w.registry.get("charge").unwrap().spec().lease_duration();
    assert!(
        started.elapsed() < lease,
        "gave up before the takeover's lease ran out"
    );
    let record = w.store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::Unknown,
        "put back, not left running"
    );
    w.trap.sink_hangs.store(false, Ordering::SeqCst);
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.state(&first).await, Some(RecordState::Escalated));
    assert_eq!(w.escalations.lock().unwrap().len(), 1);
}

/// Passes of a default reconciler, 30 s apart, until one escalates or settles the record of
/// `first` (or `max` passes): the actions taken.
async fn passes_until_decided(
    w: &World,
    first: &idem_runtime::call::ToolResult,
    max: usize,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for _ in 0..max {
        w.clock.advance(Duration::from_secs(30));
        actions.extend(w.pass().await);
        if w.state(first).await != Some(RecordState::Unknown) {
            break;
        }
    }
    actions
}

#[tokio::test]
async fn a_keyed_downstream_that_commits_late_is_settled_by_a_same_key_retry_not_escalated() {
    // The first send and the next five same-key retries reach a downstream that answers
    // "unknown" (the original still running past its bound); the seventh send lands.
    let w = World::new(Stub::new(true, [Fault::DroppedRequest; 6]), false, |s| s);
    let first = w.call().await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let actions = passes_until_decided(&w, &first, 40).await;
    assert!(!actions.contains(&Action::Escalated), "{actions:?}");
    assert_eq!(actions.iter().filter(|a| **a == Action::Retried).count(), 6);
    assert_eq!(w.state(&first).await, Some(RecordState::Completed));
    assert_eq!(w.stub.charges(), 1, "one effect");
    assert!(w.escalations.lock().unwrap().is_empty());
    assert!(w.call().await.replayed());
}

#[tokio::test]
async fn a_keyed_record_is_retried_over_the_patience_then_escalated_with_its_reason_kind() {
    let w = World::new(Stub::new(true, [Fault::DroppedRequest; 1000]), false, |s| {
        s.window(Duration::from_secs(3600))
    });
    let first = w.call().await;
    let created = record_of(&w, &first).await.created_at;
    let actions = passes_until_decided(&w, &first, 100).await;
    assert_eq!(actions.last(), Some(&Action::Escalated), "{actions:?}");
    let record = record_of(&w, &first).await;
    assert_eq!(record.state, RecordState::Escalated);
    // Sent again with growing waits, and never once the patience was over.
    let patience = idem_runtime::reconcile::DEFAULT_PATIENCE;
    let starts: Vec<_> = record.attempts.iter().map(|a| a.started_at).collect();
    assert!(
        starts.len() > 4,
        "more than a fixed few retries: {starts:?}"
    );
    assert!(
        starts.iter().all(|t| *t < created.plus(patience)),
        "{starts:?}"
    );
    let gaps: Vec<_> = starts.windows(2).map(|p| p[1].0 - p[0].0).collect();
    assert!(
        gaps.windows(2).all(|g| g[1] >= g[0]),
        "waits grow: {gaps:?}"
    );
    assert_eq!(w.stub.charges(), 0);
    // The reason kind, on the escalation and kept with the record.
    let detail = idem_runtime::escalation::EscalationDetail::of(&record);
    assert_eq!(
        detail.reason_kind,
        idem_runtime::escalation::ReasonKind::PatienceExhausted
    );
    let e = w.escalations.lock().unwrap()[0].clone();
    assert_eq!(e.kind, detail.reason_kind);
    assert!(e.reason.contains("patience"), "{}", e.reason);
}

#[tokio::test]
async fn a_partial_batch_is_escalated_with_what_landed() {
    let w = World::new(Stub::new(false, [Fault::LostAck]), true, |s| s);
    w.stub.partial.store(true, Ordering::SeqCst);
    let first = w.call().await;
    let actions = passes_until_decided(&w, &first, 10).await;
    assert_eq!(actions.last(), Some(&Action::Escalated), "{actions:?}");
    let record = record_of(&w, &first).await;
    let detail = idem_runtime::escalation::EscalationDetail::of(&record);
    assert_eq!(
        detail.reason_kind,
        idem_runtime::escalation::ReasonKind::PartialEffects
    );
    assert_eq!(detail.landed, ["item 1: ch_1"]);
    let e = w.escalations.lock().unwrap()[0].clone();
    assert_eq!(e.landed, detail.landed);
}
