//! The write executor against a counting fake downstream: each row of the outcome table,
//! lease expiry, concurrency, and bad input. Every test asserts on the downstream's ledger
//! and the store's record, not only on what the call returned.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::{ManualClock, Timestamp};
use idem_runtime::{
    call::{CallError, ToolCall},
    outcome::{Outcome, OutcomeClass},
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{Downstream, ReadCtx, ReadTool, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What the fake downstream does on its next request.
#[derive(Clone, Debug)]
enum Step {
    /// Commit and answer.
    Ok,
    /// Refuse before doing anything (a 400).
    Reject,
    /// Commit a declined charge and answer failed.
    Decline,
    /// Accept asynchronously: commit, answer pending.
    Pending,
    /// Commit, then the answer is lost (the handler sees a timeout / reset).
    LostAck,
    /// Commit, then panic in the handler.
    Panic,
    /// Hang for this long, then commit and answer.
    Slow(Duration),
    /// Hang until notified, then commit and answer.
    Until(Arc<tokio::sync::Notify>),
}

/// A downstream that records every effect; keyed mode deduplicates by idempotency key.
#[derive(Default)]
struct Ledger {
    effects: Mutex<Vec<(String, u64)>>,
    requests: AtomicU32,
    script: Mutex<VecDeque<Step>>,
    keyed: bool,
}

impl Ledger {
    fn new(keyed: bool, steps: impl IntoIterator<Item = Step>) -> Arc<Self> {
        Arc::new(Ledger {
            keyed,
            script: Mutex::new(steps.into_iter().collect()),
            ..Ledger::default()
        })
    }
    fn effects(&self) -> usize {
        self.effects.lock().unwrap().len()
    }
    fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }
    fn commit(&self, key: &str, cents: u64) {
        let mut e = self.effects.lock().unwrap();
        if self.keyed && e.iter().any(|(k, _)| k == key) {
            return; // replayed downstream
        }
        e.push((key.to_owned(), cents));
    }
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

struct Charge {
    ledger: Arc<Ledger>,
    spec: ToolSpec,
}

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = serde_json::Value;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<serde_json::Value, ToolError> {
        self.ledger.requests.fetch_add(1, Ordering::SeqCst);
        let step = self
            .ledger
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Ok);
        let key = ctx.key().as_str().to_owned();
        match step {
            Step::Ok => {
                self.ledger.commit(&key, args.cents);
                Ok(json!({"charge": "ch_1", "cents": args.cents}))
            }
            Step::Reject => Err(ToolError::rejected("card number invalid")),
            Step::Decline => {
                self.ledger.commit(&key, 0);
                Err(ToolError::failed_with_ref("card declined", "ch_declined"))
            }
            Step::Pending => {
                self.ledger.commit(&key, args.cents);
                Err(ToolError::pending("re_pending_1"))
            }
            Step::LostAck => {
                self.ledger.commit(&key, args.cents);
                Err(ToolError::unknown("connection reset after send"))
            }
            Step::Panic => {
                self.ledger.commit(&key, args.cents);
                panic!("bug in handler")
            }
            Step::Slow(d) => {
                tokio::time::sleep(d).await;
                self.ledger.commit(&key, args.cents);
                Ok(json!({"charge": "ch_slow", "cents": args.cents}))
            }
            Step::Until(go) => {
                go.notified().await;
                self.ledger.commit(&key, args.cents);
                Ok(json!({"charge": "ch_1", "cents": args.cents}))
            }
        }
    }
}

fn charge(ledger: &Arc<Ledger>) -> Charge {
    let spec = ToolSpec::new("charge").description("Charge a card.");
    let spec = if ledger.keyed {
        spec.downstream(Downstream::Keyed)
    } else {
        spec
    };
    Charge {
        ledger: ledger.clone(),
        spec,
    }
}

struct Setup {
    registry: Registry,
    store: Arc<MemoryStore>,
    clock: ManualClock,
}

fn setup_with(
    tool: Charge,
    configure: impl FnOnce(
        idem_runtime::registry::RegistryBuilder,
    ) -> idem_runtime::registry::RegistryBuilder,
) -> Setup {
    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let builder = Registry::builder()
        .shared_store(store.clone())
        .clock(Arc::new(clock.clone()))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .initial_backoff(Duration::from_millis(10))
                .max_backoff(Duration::from_millis(50))
                .jitter(0.0),
        )
        .tool(tool);
    Setup {
        registry: configure(builder).build().unwrap(),
        store,
        clock,
    }
}

fn setup(tool: Charge) -> Setup {
    setup_with(tool, |b| b)
}

fn acme() -> ToolCall {
    ToolCall::new(
        "run-1",
        "charge",
        json!({"customer": "acme", "cents": 4900}),
    )
}

async fn record_of(s: &Setup, r: &idem_runtime::call::ToolResult) -> idem_runtime::store::Record {
    s.store
        .get(r.key().expect("a key"))
        .await
        .unwrap()
        .expect("a record")
}

#[tokio::test]
async fn completed_is_saved_and_replayed_without_running_again() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let first = s.registry.call(acme().call_id("toolu_1")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Completed));
    assert!(!first.replayed());
    // The model re-issues the call next turn with a new tool_use_id.
    let again = s.registry.call(acme().call_id("toolu_2")).await;
    assert!(again.replayed());
    assert_eq!(again.output(), first.output());
    assert_eq!(again.key(), first.key());
    assert_eq!((ledger.effects(), ledger.requests()), (1, 1));
    assert_eq!(record_of(&s, &first).await.state, RecordState::Completed);
    assert!(again.text().contains("already completed"));
}

#[tokio::test]
async fn rejected_before_execution_releases_the_claim() {
    let ledger = Ledger::new(false, [Step::Reject]);
    let s = setup(charge(&ledger));
    let first = s.registry.call(acme()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Rejected));
    assert_eq!(ledger.effects(), 0);
    assert!(
        s.store.get(first.key().unwrap()).await.unwrap().is_none(),
        "claim released"
    );
    // The same intent may run again, and this time it does.
    let second = s.registry.call(acme()).await;
    assert_eq!(second.class(), Some(OutcomeClass::Completed));
    assert_eq!((ledger.effects(), ledger.requests()), (1, 2));
}

#[tokio::test]
async fn failed_after_execution_is_saved_and_replayed() {
    let ledger = Ledger::new(false, [Step::Decline]);
    let s = setup(charge(&ledger));
    let first = s.registry.call(acme()).await;
    assert!(
        matches!(first.outcome(), Some(Outcome::Failed { downstream_ref: Some(r), .. }) if r == "ch_declined")
    );
    let again = s.registry.call(acme()).await;
    assert_eq!(again.class(), Some(OutcomeClass::Failed));
    assert!(again.replayed());
    assert_eq!(ledger.requests(), 1);
    let rec = record_of(&s, &first).await;
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.downstream_ref.as_deref(), Some("ch_declined"));
}

#[tokio::test]
async fn pending_is_saved_and_not_sent_again() {
    let ledger = Ledger::new(false, [Step::Pending]);
    let s = setup(charge(&ledger));
    let first = s.registry.call(acme()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    let again = s.registry.call(acme()).await;
    assert!(
        matches!(again.outcome(), Some(Outcome::Pending { downstream_ref, .. }) if downstream_ref == "re_pending_1")
    );
    assert!(again.text().contains("not sent again"));
    // Not a success the model may build on: every integration reports it as an error.
    assert!(first.is_error() && again.is_error());
    assert_eq!((ledger.effects(), ledger.requests()), (1, 1));
    assert_eq!(record_of(&s, &first).await.state, RecordState::Pending);
}

#[tokio::test]
async fn unknown_on_an_unkeyed_downstream_is_never_resent() {
    let ledger = Ledger::new(false, [Step::LostAck]);
    let s = setup(charge(&ledger));
    let first = s.registry.call(acme()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    assert_eq!(first.attempts(), 1, "unkeyed: no automatic retry");
    let again = s.registry.call(acme().call_id("toolu_new")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert!(again.text().contains("not sent again"));
    assert_eq!((ledger.effects(), ledger.requests()), (1, 1));
    let rec = record_of(&s, &first).await;
    assert_eq!(rec.state, RecordState::Unknown);
    assert_eq!(rec.attempts.len(), 1);
    assert_eq!(rec.attempts[0].class, OutcomeClass::Unknown);
}

#[tokio::test]
async fn unknown_on_a_keyed_downstream_is_retried_with_the_same_key() {
    let ledger = Ledger::new(true, [Step::LostAck, Step::LostAck, Step::Ok]);
    let s = setup(charge(&ledger));
    let r = s.registry.call(acme()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Completed));
    assert_eq!(r.attempts(), 3);
    assert_eq!(ledger.requests(), 3);
    // Three sends, one key, one effect: the downstream replayed.
    assert_eq!(ledger.effects(), 1);
    let rec = record_of(&s, &r).await;
    assert_eq!(
        rec.attempts.iter().map(|a| a.class).collect::<Vec<_>>(),
        [
            OutcomeClass::Unknown,
            OutcomeClass::Unknown,
            OutcomeClass::Completed
        ]
    );
}

#[tokio::test]
async fn keyed_retries_are_bounded_then_unknown() {
    let ledger = Ledger::new(
        true,
        [Step::LostAck, Step::LostAck, Step::LostAck, Step::Ok],
    );
    let s = setup(charge(&ledger));
    let r = s.registry.call(acme()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    assert_eq!(ledger.requests(), 3);
    assert_eq!(record_of(&s, &r).await.state, RecordState::Unknown);
    let again = s.registry.call(acme()).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert_eq!(ledger.requests(), 3, "a repeat does not send again");
}

#[tokio::test]
async fn a_handler_panic_is_unknown_not_failed() {
    let ledger = Ledger::new(true, [Step::Panic]);
    let s = setup(charge(&ledger));
    let r = s.registry.call(acme()).await;
    assert!(
        matches!(r.outcome(), Some(Outcome::Unknown { reason }) if reason.contains("panicked"))
    );
    assert_eq!(ledger.requests(), 1, "a panic is a bug: not retried");
    assert_eq!(record_of(&s, &r).await.state, RecordState::Unknown);
    let again = s.registry.call(acme()).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    // This downstream deduplicates by key, so its effects alone cannot tell a resend from
    // none: the request count can. The repeat reads the unknown record and sends nothing.
    assert_eq!((ledger.effects(), ledger.requests()), (1, 1));
    assert_eq!(record_of(&s, &r).await.attempts.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn timeout_is_unknown_and_the_late_commit_settles_the_record() {
    let ledger = Ledger::new(false, [Step::Slow(Duration::from_secs(90))]);
    let mut tool = charge(&ledger);
    tool.spec = tool.spec.timeout(Duration::from_secs(30));
    let s = setup(tool);
    let r = s.registry.call(acme()).await;
    assert!(
        matches!(r.outcome(), Some(Outcome::Unknown { reason }) if reason.contains("timed out"))
    );
    assert_eq!(ledger.effects(), 0, "still in flight");
    assert_eq!(record_of(&s, &r).await.state, RecordState::Unknown);
    // A repeat while the original is still running: not sent again.
    let again = s.registry.call(acme()).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    // The original lands 90 s after it was sent; its result settles the unknown record.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(ledger.effects(), 1);
    let rec = record_of(&s, &r).await;
    assert_eq!(rec.state, RecordState::Completed);
    assert!(rec.attempts.iter().any(|a| a
        .message
        .as_deref()
        .unwrap_or("")
        .contains("late result")));
    let after = s.registry.call(acme()).await;
    assert_eq!(after.output().unwrap()["charge"], "ch_slow");
    assert_eq!((ledger.effects(), ledger.requests()), (1, 1));
}

#[tokio::test]
async fn escalated_records_are_reported_and_not_run() {
    let ledger = Ledger::new(false, [Step::LostAck]);
    let s = setup(charge(&ledger));
    let r = s.registry.call(acme()).await;
    let rec = record_of(&s, &r).await;
    let key = r.key().unwrap();
    let token = s
        .store
        .reclaim(key, rec.token, Duration::from_secs(60))
        .await
        .unwrap();
    s.store
        .settle(
            key,
            token,
            idem_runtime::store::backend::Settlement::new(RecordState::Escalated)
                .message("no key contract and no read-back"),
        )
        .await
        .unwrap();
    let again = s.registry.call(acme()).await;
    assert!(
        matches!(again.outcome(), Some(Outcome::Escalated { reason }) if reason.contains("read-back"))
    );
    assert_eq!(ledger.requests(), 1);
}

#[tokio::test]
async fn an_expired_result_is_already_done_never_run_again() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let call = |cents: u64| {
        ToolCall::new(
            "run-1",
            "charge",
            json!({"customer": "acme", "cents": cents}),
        )
        .intent("order-1")
    };
    s.registry.call(call(4900)).await;
    s.clock.advance(Duration::from_secs(25 * 3600));
    let later = s.registry.call(call(4900)).await;
    assert!(matches!(
        later.outcome(),
        Some(Outcome::ResultExpired {
            was: OutcomeClass::Completed
        })
    ));
    assert!(later.text().contains("no longer kept"));
    let rec = record_of(&s, &later).await;
    assert!(
        rec.result_expired && rec.payload.is_none(),
        "only the tombstone is left"
    );
    // The tombstone still knows the fingerprint: same key, other params is refused.
    let changed = s.registry.call(call(9900)).await;
    assert!(matches!(
        changed.error(),
        Some(CallError::ChangedParams { .. })
    ));
    assert_eq!(ledger.requests(), 1);
    // Past the tombstone window (30 days) the key is forgotten and would run again.
    s.clock.advance(Duration::from_secs(30 * 24 * 3600));
    assert!(s.store.get(later.key().unwrap()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_lapsed_lease_turns_into_unknown_and_never_runs_again() {
    // The worker dies between claim and settle: its call future is dropped mid-handler.
    let ledger = Ledger::new(false, [Step::Slow(Duration::from_secs(3600))]);
    let mut tool = charge(&ledger);
    tool.spec = tool
        .spec
        .timeout(Duration::from_secs(7200))
        .lease(Duration::from_secs(10));
    let s = setup(tool);
    let registry = s.registry.clone();
    let crashed = tokio::spawn(async move { registry.call(acme()).await });
    while ledger.requests() == 0 {
        tokio::task::yield_now().await;
    }
    crashed.abort();
    let _ = crashed.await;
    let running = s.store.list(RecordState::Running, 10).await.unwrap();
    assert_eq!(running.len(), 1, "the claim outlives its worker");
    // The lease passes: the claim becomes unknown — never free.
    s.clock.advance(Duration::from_secs(11));
    let again = s.registry.call(acme()).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert!(again.text().contains("not sent again"));
    assert_eq!(
        ledger.requests(),
        1,
        "the handler did not run a second time"
    );
    assert_eq!(record_of(&s, &again).await.state, RecordState::Unknown);
    assert!(s
        .store
        .list(RecordState::Running, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A `MemoryStore` that counts the claims which found the key held by a running call, and
/// says when `expected` of them have.
#[derive(Debug)]
struct WatchClaims {
    inner: MemoryStore,
    held: std::sync::atomic::AtomicUsize,
    expected: usize,
    all_held: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl IdemStore for WatchClaims {
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

    async fn claim(
        &self,
        req: &idem_runtime::store::backend::ClaimRequest,
    ) -> Result<idem_runtime::store::backend::ClaimOutcome, idem_runtime::store::StoreError> {
        let outcome = self.inner.claim(req).await;
        if let Ok(idem_runtime::store::backend::ClaimOutcome::Existing(r)) = &outcome {
            if r.state == RecordState::Running
                && self.held.fetch_add(1, Ordering::SeqCst) + 1 == self.expected
            {
                self.all_held.notify_one();
            }
        }
        outcome
    }
    async fn renew(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
        lease: Duration,
    ) -> Result<(), idem_runtime::store::StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
        settlement: idem_runtime::store::backend::Settlement,
    ) -> Result<(), idem_runtime::store::StoreError> {
        self.inner.settle(key, token, settlement).await
    }
    async fn release(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
    ) -> Result<(), idem_runtime::store::StoreError> {
        self.inner.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &idem_runtime::identity::IdemKey,
        expected: idem_runtime::store::ClaimToken,
        lease: Duration,
    ) -> Result<idem_runtime::store::ClaimToken, idem_runtime::store::StoreError> {
        self.inner.reclaim(key, expected, lease).await
    }
    async fn get(
        &self,
        key: &idem_runtime::identity::IdemKey,
    ) -> Result<Option<idem_runtime::store::Record>, idem_runtime::store::StoreError> {
        self.inner.get(key).await
    }
    async fn list(
        &self,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<idem_runtime::store::Record>, idem_runtime::store::StoreError> {
        self.inner.list(state, limit).await
    }
    async fn wait_settled(
        &self,
        key: &idem_runtime::identity::IdemKey,
        timeout: Duration,
    ) -> Result<Option<idem_runtime::store::Record>, idem_runtime::store::StoreError> {
        self.inner.wait_settled(key, timeout).await
    }
}

/// 64 calls at once: the first one's handler is held until the store has seen all 63 others
/// find the key held by it, so the overlap is proven, not likely. One request, one effect,
/// and all 64 see the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_calls_run_the_handler_once() {
    let all_held = Arc::new(tokio::sync::Notify::new());
    let ledger = Ledger::new(false, [Step::Until(all_held.clone())]);
    let store = Arc::new(WatchClaims {
        inner: MemoryStore::new(),
        held: Default::default(),
        expected: 63,
        all_held,
    });
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(charge(&ledger))
        .build()
        .unwrap();
    let calls = (0..64).map(|i| {
        let registry = registry.clone();
        tokio::spawn(async move { registry.call(acme().call_id(format!("toolu_{i}"))).await })
    });
    let results = tokio::time::timeout(Duration::from_secs(120), futures_join(calls))
        .await
        .expect("the 63 duplicates never all found the first call running");
    assert_eq!(
        store.held.load(Ordering::SeqCst),
        63,
        "all 63 overlapped it"
    );
    assert_eq!(ledger.requests(), 1);
    assert_eq!(ledger.effects(), 1);
    let first = results[0].output().cloned();
    assert!(first.is_some());
    assert!(
        results.iter().all(|r| r.output().cloned() == first),
        "all 64 see the same result"
    );
    assert_eq!(results.iter().filter(|r| !r.replayed()).count(), 1);
}

async fn futures_join(
    handles: impl Iterator<Item = tokio::task::JoinHandle<idem_runtime::call::ToolResult>>,
) -> Vec<idem_runtime::call::ToolResult> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_duplicate_past_its_wait_gets_in_flight() {
    let ledger = Ledger::new(false, [Step::Slow(Duration::from_secs(5))]);
    let s = setup_with(charge(&ledger), |b| {
        b.in_flight_wait(Duration::from_millis(20))
    });
    let registry = s.registry.clone();
    let first = tokio::spawn(async move { registry.call(acme()).await });
    while ledger.requests() == 0 {
        tokio::task::yield_now().await;
    }
    let dup = s.registry.call(acme()).await;
    assert!(matches!(dup.error(), Some(CallError::InFlight { .. })));
    assert_eq!(ledger.requests(), 1);
    first.abort();
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_runs() {
    let ledger = Ledger::new(false, []);
    let s = setup_with(charge(&ledger), |b| b.max_args_bytes(256));
    type Expect = fn(&CallError) -> bool;
    let cases: Vec<(ToolCall, Expect)> = vec![
        (
            ToolCall::from_json("run-1", "charge", r#"{"customer": "acme", "cents": "#),
            |e| matches!(e, CallError::MalformedJson { .. }),
        ),
        (
            ToolCall::new("run-1", "charge_card", json!({})),
            |e| matches!(e, CallError::UnknownTool { name } if name == "charge_card"),
        ),
        (
            ToolCall::new(
                "run-1",
                "charge",
                json!({"customer": "acme", "cents": "4900"}),
            ),
            |e| matches!(e, CallError::InvalidArgs { message, .. } if message.contains("invalid type")),
        ),
        (
            ToolCall::new("run-1", "charge", json!({"customer": "acme"})),
            |e| matches!(e, CallError::InvalidArgs { message, .. } if message.contains("cents")),
        ),
        (
            ToolCall::new(
                "run-1",
                "charge",
                json!({"customer": "a".repeat(300), "cents": 1}),
            ),
            |e| matches!(e, CallError::ArgsTooLarge { limit: 256, .. }),
        ),
        (
            ToolCall::from_json(
                "run-1",
                "charge",
                format!(r#"{{"customer":"{}","cents":1}}"#, "a".repeat(300)),
            ),
            |e| matches!(e, CallError::ArgsTooLarge { .. }),
        ),
        (
            ToolCall::new("", "charge", json!({"customer": "acme", "cents": 1})),
            |e| matches!(e, CallError::InvalidCall { .. }),
        ),
        (
            ToolCall::new("run-1", "charge", json!({"customer": "acme", "cents": 1})).intent(""),
            |e| matches!(e, CallError::InvalidCall { .. }),
        ),
    ];
    for (call, expected) in cases {
        let r = s.registry.call(call).await;
        let err = r
            .error()
            .unwrap_or_else(|| panic!("refused, got {:?}", r.outcome()));
        assert!(expected(err), "unexpected error {err:?}");
        assert!(!r.text().is_empty());
    }
    assert_eq!(ledger.requests(), 0);
    assert!(s.store.is_empty(), "nothing claimed");
}

#[tokio::test]
async fn the_key_is_the_documented_derivation_of_scope_tool_and_canonical_args() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let r = s.registry.call(acme()).await;
    let expected = idem_runtime::identity::IdemKey::derive(
        &idem_runtime::identity::Scope::run("run-1"),
        "charge",
        idem_runtime::identity::KeyMaterial::Args(br#"{"cents":4900,"customer":"acme"}"#),
    );
    assert_eq!(r.key(), Some(&expected));
    let record = record_of(&s, &r).await;
    assert_eq!(
        record.fingerprint,
        idem_runtime::identity::Fingerprint::of_canonical(br#"{"cents":4900,"customer":"acme"}"#)
    );
    let op = record
        .operation
        .expect("the operation is saved with the claim");
    assert_eq!(op.args.as_str(), r#"{"cents":4900,"customer":"acme"}"#);
    assert_eq!(op.args["cents"], 4900);
}

#[tokio::test]
async fn text_and_value_arguments_are_one_operation_and_refused_alike() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    // The model's text, in another field order and spacing, is the same operation as the
    // caller's value: one effect, the second call replays.
    let first = s
        .registry
        .call(ToolCall::from_json(
            "run-1",
            "charge",
            r#" { "cents" : 4900, "customer": "acme" } "#,
        ))
        .await;
    assert!(first.is_completed(), "{:?}", first.error());
    let second = s.registry.call(acme()).await;
    assert!(second.replayed());
    assert_eq!(first.key(), second.key());
    assert_eq!(ledger.effects(), 1);
    // A field given twice in the text is ambiguous (parsers disagree on which one wins):
    // refused as serde refuses it, nothing run, not read as either operation.
    let dup = s
        .registry
        .call(ToolCall::from_json(
            "run-1",
            "charge",
            r#"{"customer": "zed", "cents": 4900, "customer": "acme"}"#,
        ))
        .await;
    assert!(
        matches!(dup.error(), Some(CallError::InvalidArgs { message, .. }) if message.contains("duplicate field `customer`")),
        "{:?}",
        dup.as_result()
    );
    assert_eq!(ledger.effects(), 1);
    // Refusals: trailing garbage is malformed, wrong types are invalid, for text as for values.
    type Expect = fn(&CallError) -> bool;
    let cases: [(&str, Expect); 4] = [
        (r#"{"customer": "acme", "cents": 1} x"#, |e| {
            matches!(e, CallError::MalformedJson { .. })
        }),
        ("", |e| matches!(e, CallError::MalformedJson { .. })),
        (
            r#"{"customer": "acme", "cents": "1"}"#,
            |e| matches!(e, CallError::InvalidArgs { message, .. } if message.contains("invalid type")),
        ),
        (r#"[1, 2]"#, |e| matches!(e, CallError::InvalidArgs { .. })),
    ];
    for (text, expected) in cases {
        let r = s
            .registry
            .call(ToolCall::from_json("run-2", "charge", text))
            .await;
        let err = r
            .error()
            .unwrap_or_else(|| panic!("{text}: {:?}", r.outcome()));
        assert!(expected(err), "{text}: {err:?}");
    }
    assert_eq!(
        ledger.requests(),
        1,
        "nothing refused reached the downstream"
    );
    assert_eq!(s.store.len(), 1, "nothing refused was claimed");
}

#[tokio::test]
async fn same_key_with_changed_params_is_refused() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let call = |cents: u64| {
        ToolCall::new(
            "run-1",
            "charge",
            json!({"customer": "acme", "cents": cents}),
        )
        .intent("order-17")
    };
    assert!(s.registry.call(call(4900)).await.is_completed());
    let changed = s.registry.call(call(9900)).await;
    assert!(matches!(
        changed.error(),
        Some(CallError::ChangedParams { .. })
    ));
    assert!(changed.text().contains("different parameters"));
    assert_eq!(ledger.effects(), 1);
    assert_eq!(ledger.effects.lock().unwrap()[0].1, 4900);
    assert!(s
        .store
        .list(RecordState::Running, 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn two_intended_actions_with_equal_params_are_two_operations() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let a = s.registry.call(acme().intent("subscription-jan")).await;
    let b = s.registry.call(acme().intent("subscription-feb")).await;
    let a_again = s
        .registry
        .call(acme().intent("subscription-jan").call_id("toolu_9"))
        .await;
    assert_ne!(a.key(), b.key());
    assert!(a_again.replayed());
    assert_eq!(ledger.effects(), 2);
}

#[tokio::test]
async fn scopes_do_not_share_results() {
    let ledger = Ledger::new(false, []);
    let s = setup(charge(&ledger));
    let args = json!({"customer": "acme", "cents": 4900});
    s.registry
        .call(ToolCall::new("run-1", "charge", args.clone()))
        .await;
    s.registry
        .call(ToolCall::new("run-2", "charge", args.clone()))
        .await;
    s.registry
        .call(ToolCall::new("run-1", "charge", args.clone()).tenant("t1"))
        .await;
    s.registry
        .call(ToolCall::new("run-1", "charge", args.clone()).tenant("t1"))
        .await;
    assert_eq!(ledger.effects(), 3);
}

#[tokio::test]
async fn key_fields_make_other_fields_changed_params() {
    let ledger = Ledger::new(false, []);
    let mut tool = charge(&ledger);
    tool.spec = tool.spec.key_fields(["customer"]);
    let s = setup(tool);
    assert!(s.registry.call(acme()).await.is_completed());
    let r = s
        .registry
        .call(ToolCall::new(
            "run-1",
            "charge",
            json!({"customer": "acme", "cents": 100}),
        ))
        .await;
    assert!(matches!(r.error(), Some(CallError::ChangedParams { .. })));
    assert_eq!(ledger.effects(), 1);
}

struct Lookup(Arc<AtomicU32>);

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct LookupArgs {
    customer: String,
}

impl ReadTool for Lookup {
    type Args = LookupArgs;
    type Output = Vec<u64>;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("list_charges").description("List charges.")
    }
    async fn call(&self, _ctx: ReadCtx, _args: LookupArgs) -> Result<Vec<u64>, ToolError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            Err(ToolError::unknown("flaky read"))
        } else {
            Ok(vec![4900])
        }
    }
}

#[tokio::test]
async fn reads_run_without_a_claim_and_are_retried() {
    let count = Arc::new(AtomicU32::new(0));
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store.clone())
        .retry_policy(RetryPolicy::default().initial_backoff(Duration::from_millis(1)))
        .tool(Lookup(count.clone()))
        .build()
        .unwrap();
    let r = registry
        .call(ToolCall::new(
            "run-1",
            "list_charges",
            json!({"customer": "acme"}),
        ))
        .await;
    assert_eq!(r.output(), Some(&json!([4900])));
    assert_eq!(r.attempts(), 2);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert!(r.key().is_none());
    assert!(store.is_empty());
}

#[test]
fn duplicate_and_invalid_names_fail_the_build() {
    let ledger = Ledger::new(false, []);
    let dup = Registry::builder()
        .tool(charge(&ledger))
        .tool(charge(&ledger))
        .build();
    assert_eq!(
        dup.unwrap_err(),
        idem_runtime::registry::BuildError::DuplicateName("charge".into())
    );
    let mut bad = charge(&ledger);
    bad.spec = ToolSpec::new("charge card");
    assert!(matches!(
        Registry::builder().tool(bad).build(),
        Err(idem_runtime::registry::BuildError::InvalidName(_))
    ));
    let mut typo = charge(&ledger);
    typo.spec = typo.spec.key_fields(["customer_id"]);
    let err = Registry::builder().tool(typo).build().unwrap_err();
    assert!(err.to_string().contains("key field `customer_id`"), "{err}");
    let mut long = charge(&ledger);
    long.spec = ToolSpec::new("x".repeat(65));
    assert!(Registry::builder().tool(long).build().is_err());
}

/// A tool without arguments: models send `{}` (the schema is an empty object), callers may
/// send `{}` or null, as text or as a value. All of them call it, and so does an object with
/// members, which the schema allows and the tool ignores (as the macro's no-argument tools
/// and any args struct ignore unknown members).
#[tokio::test]
async fn a_tool_without_arguments_accepts_an_empty_object_as_text_or_value() {
    struct Now;
    impl ReadTool for Now {
        type Args = ();
        type Output = &'static str;
        fn spec(&self) -> ToolSpec {
            ToolSpec::new("now")
        }
        async fn call(&self, _ctx: ReadCtx, _args: ()) -> Result<&'static str, ToolError> {
            Ok("12:00")
        }
    }
    let registry = Registry::builder().tool(Now).build().unwrap();
    for call in [
        ToolCall::from_json("run-1", "now", "{}"),
        ToolCall::from_json("run-1", "now", " null "),
        ToolCall::new("run-1", "now", json!({})),
        ToolCall::new("run-1", "now", serde_json::Value::Null),
    ] {
        let r = registry.call(call).await;
        assert_eq!(r.output(), Some(&json!("12:00")), "{:?}", r.error());
    }
    let r = registry
        .call(ToolCall::from_json("run-1", "now", r#"{"x": 1}"#))
        .await;
    assert_eq!(r.output(), Some(&json!("12:00")), "{:?}", r.error());
    // Anything but an object or null is still refused.
    for text in ["[]", "1", "\"now\""] {
        let r = registry
            .call(ToolCall::from_json("run-1", "now", text))
            .await;
        assert!(
            matches!(r.error(), Some(CallError::InvalidArgs { .. })),
            "{text}: {r:?}"
        );
    }
}
