//! Edges where a retry, a late result or a reconciler decision could turn one operation into
//! two, lose a result, or panic. Simulated time: tokio's paused clock drives timeouts, and a
//! `TokioClock` makes the store's leases move with it. Each test asserts on a ledger.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::reconcile::Action;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{ClaimToken, Record, StoreError, Timestamp, TokioClock};
use idem_runtime::{
    call::ToolCall,
    identity::IdemKey,
    outcome::OutcomeClass,
    reconcile::Reconciler,
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{Downstream, ReadBack, ReadBackCtx, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::json;

/// What the handler does on each send, in order (then `Commit`).
#[derive(Clone, Copy, Debug)]
enum Send {
    /// Commit at once and answer.
    Commit,
    /// Commit after this long (the caller may have timed out by then).
    CommitAfter(Duration),
    /// Refuse before doing anything.
    Reject,
    /// Never answer, never commit.
    Hang,
}

#[derive(Default)]
struct Ledger {
    ledger: Mutex<Vec<String>>,
    sends: AtomicU32,
    script: Mutex<Vec<Send>>,
    keyed: bool,
}

impl Ledger {
    fn commit(&self, key: &str) {
        let mut l = self.ledger.lock().unwrap();
        if !(self.keyed && l.iter().any(|k| k == key)) {
            l.push(key.to_owned());
        }
    }
    fn effects(&self) -> usize {
        self.ledger.lock().unwrap().len()
    }
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    cents: u64,
}

struct Charge(Arc<Ledger>, ToolSpec, bool);

impl WriteTool for Charge {
    type Args = Args;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        self.1.clone()
    }
    async fn call(&self, ctx: WriteCtx, _args: Args) -> Result<String, ToolError> {
        let n = self.0.sends.fetch_add(1, Ordering::SeqCst) as usize;
        let step = self
            .0
            .script
            .lock()
            .unwrap()
            .get(n)
            .copied()
            .unwrap_or(Send::Commit);
        match step {
            Send::Commit => {}
            Send::CommitAfter(d) => tokio::time::sleep(d).await,
            Send::Reject => return Err(ToolError::rejected("429 slow down")),
            Send::Hang => std::future::pending::<()>().await,
        }
        self.0.commit(ctx.key().as_str());
        Ok("ch_1".into())
    }
    async fn read_back(&self, ctx: ReadBackCtx, _args: Args) -> Result<ReadBack, ToolError> {
        if !self.2 {
            return Ok(ReadBack::Unsupported);
        }
        let found = self
            .0
            .ledger
            .lock()
            .unwrap()
            .iter()
            .any(|k| k == ctx.key().as_str());
        Ok(if found {
            ReadBack::Completed {
                downstream_ref: Some("ch_1".into()),
                output: json!("ch_1"),
            }
        } else {
            ReadBack::NotFound
        })
    }
}

fn world(
    keyed: bool,
    script: Vec<Send>,
    spec: ToolSpec,
    read_back: bool,
    retry: RetryPolicy,
) -> (Registry, Arc<Ledger>, Arc<MemoryStore>) {
    let down = Arc::new(Ledger {
        keyed,
        script: Mutex::new(script),
        ..Ledger::default()
    });
    let clock = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let spec = if keyed {
        spec.downstream(Downstream::Keyed)
    } else {
        spec
    };
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(clock)
        .retry_policy(retry)
        .tool(Charge(down.clone(), spec, read_back))
        .build()
        .unwrap();
    (registry, down, store)
}

fn call() -> ToolCall {
    ToolCall::new("run-1", "charge", json!({"cents": 4900}))
}

async fn pass(registry: &Registry) -> Vec<Action> {
    Reconciler::new(registry)
        .run_once()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.action)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn not_found_is_not_trusted_while_the_timed_out_handler_may_still_send() {
    // Slow to send: the handler commits 10 s after it started, long after its 1 s timeout.
    let spec = ToolSpec::new("charge")
        .timeout(Duration::from_secs(1))
        .in_flight_bound(Duration::from_secs(5));
    let (registry, down, store) = world(
        false,
        vec![Send::CommitAfter(Duration::from_secs(10))],
        spec,
        true,
        RetryPolicy::never(),
    );
    let first = registry.call(call()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    tokio::time::sleep(Duration::from_secs(5)).await; // t = 6 s: past timeout + bound
    assert_eq!(
        pass(&registry).await,
        [Action::Waiting],
        "not found proves nothing yet"
    );
    // The executor dropped the handler at timeout + bound, so it never commits; once the
    // bound has passed for the downstream too, the key is freed and the intent runs once.
    tokio::time::sleep(Duration::from_secs(6)).await; // t = 12 s
    assert_eq!(pass(&registry).await, [Action::Released]);
    assert!(registry.call(call()).await.is_completed());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(down.effects(), 1, "one charge, ever");
    assert_eq!(
        store
            .get(first.key().unwrap())
            .await
            .unwrap()
            .unwrap()
            .state,
        RecordState::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejection_after_an_unknown_attempt_does_not_free_the_key() {
    let spec = ToolSpec::new("charge").timeout(Duration::from_secs(1));
    let retry = RetryPolicy::default()
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(100))
        .max_backoff(Duration::from_millis(100))
        .jitter(0.0);
    // Attempt 1 times out and commits later; attempt 2 is refused (429).
    let script = vec![Send::CommitAfter(Duration::from_secs(2)), Send::Reject];
    let (registry, down, store) = world(true, script, spec, false, retry);
    let r = registry.call(call()).await;
    assert_eq!(
        r.class(),
        Some(OutcomeClass::Unknown),
        "{:?}",
        r.as_result()
    );
    let rec = store
        .get(r.key().unwrap())
        .await
        .unwrap()
        .expect("the record is kept");
    assert_eq!(rec.attempts.len(), 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The late commit settled it; a repeat replays, never runs again.
    let again = registry.call(call()).await;
    assert!(
        again.replayed() && again.is_completed(),
        "{:?}",
        again.as_result()
    );
    assert_eq!(down.effects(), 1);
    assert_eq!(down.sends.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_late_result_is_not_lost_to_an_early_escalation() {
    let spec = ToolSpec::new("charge").timeout(Duration::from_secs(1));
    let (registry, down, store) = world(
        false,
        vec![Send::CommitAfter(Duration::from_secs(3))],
        spec,
        false,
        RetryPolicy::never(),
    );
    let first = registry.call(call()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pass(&registry).await,
        [Action::Waiting],
        "the original may still answer"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rec = store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(
        rec.state,
        RecordState::Completed,
        "the late result settled it"
    );
    assert!(pass(&registry).await.is_empty());
    assert_eq!(down.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_late_result_waits_for_a_long_retry_loop() {
    // Attempt 1 commits 1 s after its 30 s timeout; attempts 2–4 hang: the loop settles
    // unknown after ~2 minutes, and only then may the late result settle the record.
    let spec = ToolSpec::new("charge").timeout(Duration::from_secs(30));
    let retry = RetryPolicy::default()
        .max_attempts(4)
        .initial_backoff(Duration::from_secs(1))
        .max_backoff(Duration::from_secs(1))
        .jitter(0.0);
    let script = vec![
        Send::CommitAfter(Duration::from_secs(31)),
        Send::Hang,
        Send::Hang,
        Send::Hang,
    ];
    let (registry, down, store) = world(true, script, spec, false, retry);
    let r = registry.call(call()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    tokio::time::sleep(Duration::from_secs(120)).await;
    let rec = store.get(r.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed, "{rec:?}");
    assert_eq!(down.effects(), 1);
}

/// A memory store whose lease renewals fail while `down` is set: a store out of reach.
#[derive(Debug)]
struct RenewalOutage {
    store: Arc<MemoryStore>,
    down: AtomicBool,
}

#[async_trait::async_trait]
impl IdemStore for RenewalOutage {
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

    fn clock(&self) -> Arc<dyn idem_runtime::store::Clock> {
        self.store.clock()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(req).await
    }
    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("store unreachable".into()));
        }
        self.store.renew(key, token, lease).await
    }
    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        self.store.settle(key, token, settlement).await
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        self.store.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        self.store.reclaim(key, expected, lease).await
    }
    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        self.store.get(key).await
    }
    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.store.list(state, limit).await
    }
}

fn backoff_3s() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(3)
        .initial_backoff(Duration::from_secs(3))
        .max_backoff(Duration::from_secs(3))
        .jitter(0.0)
}

#[tokio::test(start_paused = true)]
async fn a_backoff_longer_than_the_lease_keeps_the_claim() {
    // The backoff (3 s) outlasts the lease (1 s): the executor renews the lease through it,
    // so the retry goes out under the same live claim instead of finding it lapsed.
    let spec = ToolSpec::new("charge")
        .timeout(Duration::from_millis(500))
        .lease(Duration::from_secs(1));
    let (registry, down, store) = world(
        true,
        vec![Send::Hang, Send::Commit],
        spec,
        false,
        backoff_3s(),
    );
    let r = registry.call(call()).await;
    assert!(r.is_completed(), "{r:?}");
    assert_eq!(down.sends.load(Ordering::SeqCst), 2);
    assert_eq!(down.effects(), 1);
    let record = store.get(r.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    let classes: Vec<_> = record.attempts.iter().map(|a| a.class).collect();
    assert_eq!(classes, [OutcomeClass::Unknown, OutcomeClass::Completed]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_not_sent_once_the_claim_is_lost_and_what_was_sent_is_kept() {
    // The store is out of reach through the backoff, so the lease (1 s) lapses and the
    // record turns unknown; when the store answers again, the claim is no longer ours. The
    // executor must not send again under it, and the attempt it did send (which may have
    // landed) must be in the record for the reconciler and a person.
    let spec = ToolSpec::new("charge")
        .timeout(Duration::from_millis(500))
        .lease(Duration::from_secs(1))
        .downstream(Downstream::Keyed);
    let down = Arc::new(Ledger {
        keyed: true,
        script: Mutex::new(vec![Send::Hang, Send::Commit]),
        ..Ledger::default()
    });
    let clock = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let memory = Arc::new(MemoryStore::with_clock(clock.clone()));
    let outage = Arc::new(RenewalOutage {
        store: memory.clone(),
        down: AtomicBool::new(true),
    });
    let registry = Registry::builder()
        .shared_store(outage.clone())
        .clock(clock)
        .retry_policy(backoff_3s())
        .tool(Charge(down.clone(), spec, false))
        .build()
        .unwrap();
    let call = tokio::spawn({
        let registry = registry.clone();
        async move { registry.call(call()).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    outage.down.store(false, Ordering::SeqCst);
    let r = call.await.unwrap();
    assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{r:?}");
    assert_eq!(
        down.sends.load(Ordering::SeqCst),
        1,
        "no send after the claim was lost"
    );
    let record = memory.get(r.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(
        record.attempts.len(),
        1,
        "the sent attempt is evidence: {record:?}"
    );
    assert_eq!(record.attempts[0].class, OutcomeClass::Unknown);
}

#[tokio::test(start_paused = true)]
async fn huge_durations_do_not_panic() {
    let spec = ToolSpec::new("charge").timeout(Duration::MAX);
    let (registry, down, _) = world(false, vec![], spec, false, RetryPolicy::never());
    assert!(registry.call(call()).await.is_completed());
    let (registry, hanging, _) = world(
        false,
        vec![Send::Hang],
        ToolSpec::new("charge"),
        false,
        RetryPolicy::never(),
    );
    let waiting = Registry::builder()
        .shared_store(registry.store().clone())
        .in_flight_wait(Duration::MAX)
        .tool(Charge(down.clone(), ToolSpec::new("charge"), false))
        .build()
        .unwrap();
    let first = tokio::spawn({
        let registry = registry.clone();
        async move { registry.call(call()).await }
    });
    // The first call holds the key (its handler hangs) before the duplicate is made.
    while hanging.sends.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let sent_before = down.sends.load(Ordering::SeqCst);
    let dup = tokio::time::timeout(Duration::from_secs(5), waiting.call(call())).await;
    assert!(
        dup.is_err(),
        "still waiting for the first call, without a panic"
    );
    assert_eq!(
        down.sends.load(Ordering::SeqCst),
        sent_before,
        "the duplicate waited; it did not run"
    );
    first.abort();
}
