//! Outcome classes at their edges, black-box through the facade and the `#[toolbox]` macro:
//! what the executor does with each class when attempts mix (unavailable, then a timeout;
//! a timeout, then a late answer of each class), and what concurrent duplicates are told
//! while the original is in each of those states.
//!
//! Every test asserts on what happened: the downstream's ledger (requests that reached it,
//! effects it committed) and the store's record read back through `IdemStore`. Time is
//! tokio's paused clock, with the store on a `TokioClock` so leases move with it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::escalation::CallbackSink;
use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::{
    ClaimToken, Clock, ListCursor, ReleaseNote, ReleaseRecord, StoreError, Timestamp, TokioClock,
};
use idem::{
    escalation::Escalation,
    registry::RetryPolicy,
    store::{Record, RecordState},
    toolbox, CallError, IdemKey, IdemStore, MemoryStore, Outcome, OutcomeClass, Reconciler,
    Registry, ToolCall, ToolError, ToolResult, WriteCtx,
};
use serde_json::json;

const RUN: &str = "run-outcomes";

/// What the downstream does with the next request; once the script is empty, `Commit`.
#[derive(Clone, Copy, Debug)]
enum Step {
    Commit,
    /// 503 with a Retry-After: nothing ran.
    Unavailable(Duration),
    /// Waits this long, then 503 with a Retry-After: nothing ran.
    UnavailableAfter(Duration, Duration),
    /// 400: nothing ran.
    Reject,
    /// Commits, then declines (terminal failure after the effect started).
    Fail,
    /// Waits this long, then commits.
    CommitAfter(Duration),
    /// Waits this long, then refuses (nothing ran, but the caller stopped waiting first).
    RejectAfter(Duration),
    /// Waits this long, then commits and declines.
    FailAfter(Duration),
}

/// A payment service: its script, every request it saw, and the effects it committed.
#[derive(Default)]
struct Bank {
    script: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<String>>,
    effects: Mutex<Vec<String>>,
}

impl Bank {
    fn new(script: impl IntoIterator<Item = Step>) -> Arc<Bank> {
        Arc::new(Bank {
            script: Mutex::new(script.into_iter().collect()),
            ..Bank::default()
        })
    }

    fn requests(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    fn effects(&self) -> usize {
        self.effects.lock().unwrap().len()
    }
}

#[idem::args]
struct PayArgs {
    customer: String,
    cents: u64,
}

struct Payments {
    bank: Arc<Bank>,
}

#[toolbox]
impl Payments {
    /// Charge a customer (unkeyed: the bank does not deduplicate).
    #[tool(write, timeout = "10s", in_flight = "1m")]
    async fn pay(&self, ctx: WriteCtx, args: PayArgs) -> Result<String, ToolError> {
        let bank = &self.bank;
        let step = bank
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Commit);
        bank.requests.lock().unwrap().push(ctx.key().to_string());
        let commit = |bank: &Bank| {
            let mut effects = bank.effects.lock().unwrap();
            effects.push(format!("{}:{}", args.customer, args.cents));
            format!("ch_{}", effects.len())
        };
        match step {
            Step::Commit => Ok(commit(bank)),
            Step::Unavailable(wait) => Err(ToolError::unavailable_for("503 overloaded", wait)),
            Step::UnavailableAfter(d, wait) => {
                tokio::time::sleep(d).await;
                Err(ToolError::unavailable_for("503 overloaded", wait))
            }
            Step::Reject => Err(ToolError::rejected("400 bad amount; nothing executed")),
            Step::Fail => Err(ToolError::failed_with_ref("card declined", commit(bank))),
            Step::CommitAfter(d) => {
                tokio::time::sleep(d).await;
                Ok(commit(bank))
            }
            Step::RejectAfter(d) => {
                tokio::time::sleep(d).await;
                Err(ToolError::rejected("400 bad amount; nothing executed"))
            }
            Step::FailAfter(d) => {
                tokio::time::sleep(d).await;
                Err(ToolError::failed_with_ref("card declined", commit(bank)))
            }
        }
    }
}

struct World {
    store: Arc<MemoryStore>,
    registry: Registry,
}

fn world(bank: &Arc<Bank>, retry: RetryPolicy, in_flight_wait: Duration) -> World {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(clock)
        .retry_policy(retry)
        .in_flight_wait(in_flight_wait)
        .toolbox(Arc::new(Payments { bank: bank.clone() }))
        .build()
        .expect("valid tools");
    World { store, registry }
}

fn no_jitter() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(5)
        .initial_backoff(Duration::from_millis(100))
        .jitter(0.0)
        .budget(Duration::from_secs(30))
}

fn pay() -> ToolCall {
    ToolCall::new(RUN, "pay", json!({"customer": "acme", "cents": 4900}))
}

async fn state(w: &World, r: &ToolResult) -> Option<RecordState> {
    let key = r.key().expect("a write call has a key");
    w.store.get(key).await.unwrap().map(|rec| rec.state)
}

/// Lets spawned tasks (the late-result watcher) run at the current virtual instant.
async fn settle_tasks() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

// ---------------------------------------------------------------------------------------
// Unavailable
// ---------------------------------------------------------------------------------------

/// A Retry-After that ends past the call's budget is not waited out: the claim is released
/// at once, nothing was done, and a later call runs the charge once.
#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_budget_is_not_waited_out() {
    let bank = Bank::new([Step::Unavailable(Duration::from_secs(120))]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let started = tokio::time::Instant::now();
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unavailable), "{}", r.text());
    assert!(
        started.elapsed() <= Duration::from_secs(30),
        "the call spent {:?}, past its 30 s budget, waiting for a Retry-After of 120 s",
        started.elapsed()
    );
    assert_eq!(bank.requests(), 1, "one request, refused");
    assert_eq!(bank.effects(), 0);
    assert_eq!(state(&w, &r).await, None, "released: the key is free");

    tokio::time::advance(Duration::from_secs(120)).await;
    let later = w.registry.call(pay()).await;
    assert!(later.is_completed(), "{}", later.text());
    assert!(!later.replayed());
    assert_eq!(bank.effects(), 1);
    assert_eq!(state(&w, &later).await, Some(RecordState::Completed));
}

/// Unavailable, asked again, and the second attempt times out: the outcome is unknown, the
/// record stays (never released: the second request may have landed), and the charge is
/// never sent again.
#[tokio::test(start_paused = true)]
async fn unavailable_then_a_timeout_is_unknown_and_kept() {
    let bank = Bank::new([
        Step::Unavailable(Duration::from_secs(1)),
        Step::CommitAfter(Duration::from_secs(3600)),
    ]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{}", r.text());
    assert_eq!(bank.requests(), 2);
    assert_eq!(state(&w, &r).await, Some(RecordState::Unknown));

    let again = w.registry.call(pay()).await;
    assert_eq!(
        again.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        again.text()
    );
    assert!(again.replayed());
    assert_eq!(bank.requests(), 2, "not sent again");
}

// ---------------------------------------------------------------------------------------
// Late answers after a timeout
// ---------------------------------------------------------------------------------------

/// A timed-out attempt that later answers "rejected" proves nothing about the call the
/// caller gave up on: the record stays unknown, and repeats are not sent.
#[tokio::test(start_paused = true)]
async fn a_late_rejection_does_not_free_an_unknown_key() {
    let bank = Bank::new([Step::RejectAfter(Duration::from_secs(15))]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{}", r.text());

    tokio::time::advance(Duration::from_secs(10)).await;
    settle_tasks().await;
    let record = w.store.get(r.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert!(
        record.attempts.len() >= 2,
        "the late answer is kept as evidence: {:?}",
        record.attempts
    );

    let again = w.registry.call(pay()).await;
    assert_eq!(
        again.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        again.text()
    );
    assert_eq!(bank.requests(), 1, "never sent again");
}

/// A timed-out attempt that later commits and declines settles the unknown record as
/// failed; a repeat replays the failure without running.
#[tokio::test(start_paused = true)]
async fn a_late_failure_settles_the_unknown_record_as_failed() {
    let bank = Bank::new([Step::FailAfter(Duration::from_secs(15))]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{}", r.text());

    tokio::time::advance(Duration::from_secs(10)).await;
    settle_tasks().await;
    assert_eq!(bank.effects(), 1, "the late request landed");
    let record = w.store.get(r.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Failed, "{record:?}");
    assert_eq!(record.downstream_ref.as_deref(), Some("ch_1"));

    let again = w.registry.call(pay()).await;
    assert_eq!(
        again.class(),
        Some(OutcomeClass::Failed),
        "{}",
        again.text()
    );
    assert!(again.replayed());
    assert_eq!(bank.requests(), 1);
}

// ---------------------------------------------------------------------------------------
// Concurrent duplicates while the original is in each state
// ---------------------------------------------------------------------------------------

async fn duplicates(w: &World, n: usize) -> Vec<ToolResult> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let registry = w.registry.clone();
            tokio::spawn(async move { registry.call(pay().call_id(format!("toolu_{i}"))).await })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("no call panics"));
    }
    results
}

/// The original times out: every duplicate that waited for it is told unknown (or in
/// flight), none runs the charge again.
#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_of_a_call_that_times_out_never_run_twice() {
    let bank = Bank::new([Step::CommitAfter(Duration::from_secs(3600))]);
    let w = world(&bank, no_jitter(), Duration::from_secs(60));
    let results = duplicates(&w, 8).await;
    assert_eq!(bank.requests(), 1, "one request reached the bank");
    for r in &results {
        match (r.class(), r.error()) {
            (Some(OutcomeClass::Unknown), _) | (None, Some(CallError::InFlight { .. })) => {}
            other => panic!(
                "a duplicate of a timed-out call was told {other:?}: {}",
                r.text()
            ),
        }
    }
    assert_eq!(state(&w, &results[0]).await, Some(RecordState::Unknown));
}

/// The original is rejected (nothing ran): the key is free again, so a duplicate that
/// waited for it may run the same intent; every request the bank saw was answered, and no
/// caller was told "unknown".
#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_of_a_rejected_call_are_never_told_unknown() {
    let bank = Bank::new([Step::RejectAfter(Duration::from_secs(2)), Step::Reject]);
    let w = world(&bank, no_jitter(), Duration::from_secs(60));
    let results = duplicates(&w, 4).await;
    for r in &results {
        assert!(
            matches!(
                r.class(),
                Some(OutcomeClass::Rejected | OutcomeClass::Completed)
            ),
            "{:?}: {}",
            r.class(),
            r.text()
        );
    }
    assert!(bank.effects() <= 1, "at most the one charge");
}

/// The original is refused as unavailable at every attempt within its budget: duplicates
/// that waited are told what is true (nothing was done, or the saved outcome of a run of
/// their own), never "unknown; do not retry" about a call that provably did nothing.
#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_of_an_unavailable_call_are_never_told_unknown() {
    // The first request is asked again after 1 s; every later one gets a Retry-After past
    // the budget. More refusals than the callers can use: a waiter freed by the release
    // runs the intent itself and is refused too.
    let bank = Bank::new(
        std::iter::once(Step::Unavailable(Duration::from_secs(1))).chain(std::iter::repeat_n(
            Step::Unavailable(Duration::from_secs(100)),
            20,
        )),
    );
    let w = world(&bank, no_jitter(), Duration::from_secs(60));
    let results = duplicates(&w, 5).await;
    for r in &results {
        assert!(
            !matches!(r.class(), Some(OutcomeClass::Unknown)),
            "a duplicate of a call that did nothing was told: {}",
            r.text()
        );
    }
    assert_eq!(bank.effects(), 0);
    assert!(bank.requests() >= 2);
}

/// A completed record with another `Outcome` than the saved output never reaches a repeat:
/// replays carry the first call's output byte for byte.
#[tokio::test(start_paused = true)]
async fn a_failure_replays_with_its_downstream_ref() {
    let bank = Bank::new([Step::Fail]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let first = w.registry.call(pay()).await;
    let again = w.registry.call(pay().call_id("toolu_again")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Failed));
    assert_eq!(again.class(), Some(OutcomeClass::Failed));
    match (first.outcome(), again.outcome()) {
        (Some(Outcome::Failed { .. }), Some(Outcome::Failed { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        format!("{:?}", first.outcome()),
        format!("{:?}", again.outcome())
    );
    assert_eq!(bank.requests(), 1);
}

/// The same, on a multi-threaded runtime where a waiter runs while the original records its
/// attempts and releases the key (one atomic step: it never sees the record in between).
/// Repeated, since a two-step release's window would be short.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_of_an_unavailable_call_on_many_threads_are_never_told_unknown() {
    for round in 0..50 {
        let bank = Bank::new(std::iter::repeat_n(
            Step::UnavailableAfter(Duration::from_millis(2), Duration::from_secs(100)),
            64,
        ));
        let registry = Registry::builder()
            .retry_policy(RetryPolicy::never())
            .in_flight_wait(Duration::from_secs(10))
            .toolbox(Arc::new(Payments { bank: bank.clone() }))
            .build()
            .unwrap();
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let registry = registry.clone();
                tokio::spawn(async move {
                    registry
                        .call(pay().call_id(format!("toolu_{round}_{i}")))
                        .await
                })
            })
            .collect();
        for task in tasks {
            let r = task.await.unwrap();
            assert!(
                !matches!(r.class(), Some(OutcomeClass::Unknown)),
                "round {round}: a duplicate of a call that did nothing was told: {}",
                r.text()
            );
        }
        assert_eq!(bank.effects(), 0);
    }
}

// ---------------------------------------------------------------------------------------
// An unavailable operation whose release fails half-way: unknown, nothing ran
// ---------------------------------------------------------------------------------------

/// A memory store whose `release_unsettled` fails while `fail_release` is set, and which
/// keeps the default (two-step) `release_traced`.
#[derive(Debug)]
struct NoRelease {
    inner: Arc<MemoryStore>,
    fail_release: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl IdemStore for NoRelease {
    // A traced release settles and then releases, in two steps; no trace is listed.
    async fn release_traced(
        &self,
        key: &idem::IdemKey,
        token: idem::store::ClaimToken,
        settlement: idem::store::backend::Settlement,
        note: &idem::store::ReleaseNote,
    ) -> Result<(), idem::store::StoreError> {
        idem::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    async fn list_releases(
        &self,
        _after: Option<&idem::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem::store::ReleaseRecord>, idem::store::StoreError> {
        Ok(Vec::new())
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(req).await
    }
    async fn renew(&self, key: &IdemKey, token: ClaimToken, lease: Duration) -> StoreResult {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(&self, key: &IdemKey, token: ClaimToken, s: Settlement) -> StoreResult {
        self.inner.settle(key, token, s).await
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> StoreResult {
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
    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> StoreResult {
        if self.fail_release.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unavailable("connection reset".into()));
        }
        self.inner.release_unsettled(key, expected, note).await
    }
    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        self.inner.releases(key).await
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
}

type StoreResult = Result<(), StoreError>;

/// The release of an unavailable operation fails half-way (a custom store without an atomic
/// `release_traced`: the record is settled unknown, then its release fails), leaving it
/// unknown: the safe side. A repeat is told "unknown" and nothing is sent; the reconciler,
/// with no read-back to settle it, hands it to a person; it is never sent again.
#[tokio::test(start_paused = true)]
async fn an_unavailable_operation_whose_release_fails_stays_unknown_for_a_person() {
    let bank = Bank::new(std::iter::repeat_n(
        Step::Unavailable(Duration::from_secs(100)),
        8,
    ));
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let store = Arc::new(NoRelease {
        inner: Arc::new(MemoryStore::with_clock(clock.clone())),
        fail_release: true.into(),
    });
    let escalations = Arc::new(Mutex::new(Vec::<Escalation>::new()));
    let sink = {
        let escalations = escalations.clone();
        CallbackSink(move |e: &Escalation| escalations.lock().unwrap().push(e.clone()))
    };
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(clock)
        .retry_policy(no_jitter())
        .escalation_sink(Arc::new(sink))
        .toolbox(Arc::new(Payments { bank: bank.clone() }))
        .build()
        .unwrap();

    let first = registry.call(pay()).await;
    assert_eq!(
        first.class(),
        Some(OutcomeClass::Unavailable),
        "{}",
        first.text()
    );
    let key = first.key().unwrap().clone();
    let left = store
        .get(&key)
        .await
        .unwrap()
        .expect("left unknown: the release failed");
    assert_eq!(left.state, RecordState::Unknown);

    // A repeat reports what the store says; nothing is sent.
    let repeat = registry.call(pay()).await;
    assert_eq!(
        repeat.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        repeat.text()
    );
    assert_eq!(bank.requests(), 1);

    // No read-back to settle it: a person decides.
    Reconciler::new(&registry).run_all().await.unwrap();
    assert_eq!(escalations.lock().unwrap().len(), 1);
    assert_eq!(bank.requests(), 1, "never sent again");
    assert_eq!(bank.effects(), 0);
}

/// The model is told when it may call again no sooner than the downstream asked: a
/// Retry-After of 90.5 s is "in 91s", never "in 90s".
#[tokio::test(start_paused = true)]
async fn the_model_is_never_told_to_call_again_before_retry_after() {
    let bank = Bank::new([Step::Unavailable(Duration::from_millis(90_500))]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unavailable), "{}", r.text());
    assert!(r.text().contains("in 91s or later"), "{}", r.text());
    assert_eq!(bank.effects(), 0);
    assert_eq!(state(&w, &r).await, None, "released");

    // The longest Retry-After there is: told, never a panic.
    let bank = Bank::new([Step::Unavailable(Duration::MAX)]);
    let w = world(&bank, no_jitter(), Duration::from_secs(10));
    let r = w.registry.call(pay()).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unavailable), "{}", r.text());
    assert!(
        r.text().contains(&format!("in {}s or later", u64::MAX)),
        "{}",
        r.text()
    );
    assert_eq!(bank.effects(), 0);
}
