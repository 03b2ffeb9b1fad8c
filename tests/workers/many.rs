//! Many workers on one durable store (a SQLite file, a Redis prefix, a Postgres schema),
//! each worker a `Registry` on its own handle: a handler that outlives its lease many times
//! over keeps its claim (renewed) while another worker asks for the same operation; a worker
//! that dies mid-handler leaves a claim that lapses to *unknown* under the eyes of a waiting
//! worker, which never executes it; two reconcilers running at once over the same unknown
//! and pending records retry a keyed operation once, settle a pending one once and escalate
//! an unkeyed one once.
//!
//! Every assertion is on the downstream's ledger, the store's records or what the
//! escalation sink received.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    escalation::{CallbackSink, Escalation},
    registry::RetryPolicy,
    store::RecordState,
    tool::{Downstream, ToolSpec, WriteTool},
    CallError, IdemStore, OutcomeClass, ReadBack, ReadBackCtx, Reconciler, Registry, ToolCall,
    ToolError, WriteCtx,
};
use idem_test::stores::durables;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct OrderArgs {
    order: String,
}

/// A downstream's ledger: every request, every effect, per key.
#[derive(Default)]
struct Ledger {
    requests: Mutex<BTreeMap<String, u32>>,
    effects: Mutex<BTreeMap<String, u32>>,
}

impl Ledger {
    fn request(&self, key: &str) -> u32 {
        let mut r = self.requests.lock().unwrap();
        let n = r.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }
    fn effect(&self, key: &str) {
        *self
            .effects
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default() += 1;
    }
    fn requests(&self) -> u32 {
        self.requests.lock().unwrap().values().sum()
    }
    fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
    fn effects_of(&self, key: &str) -> u32 {
        self.effects.lock().unwrap().get(key).copied().unwrap_or(0)
    }
    fn requests_of(&self, key: &str) -> u32 {
        self.requests.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// An unkeyed write whose handler, once it has sent its request, waits at `gate` (or
/// forever when the gate is never opened) before it answers.
struct Slow {
    ledger: Arc<Ledger>,
    gate: Arc<Semaphore>,
    lease: Duration,
}

impl WriteTool for Slow {
    type Args = OrderArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("ship")
            .description("Ships an order.")
            .downstream(Downstream::Unkeyed)
            .timeout(Duration::from_secs(20))
            .lease(self.lease)
    }
    async fn call(&self, ctx: WriteCtx, args: OrderArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        self.ledger.request(&key);
        self.ledger.effect(&key);
        let _permit = self.gate.acquire().await.expect("the gate stays");
        Ok(json!({"shipped": args.order}))
    }
}

fn ship_registry(store: Arc<dyn IdemStore>, tool: Slow, wait: Duration) -> Registry {
    Registry::builder()
        .shared_store(store)
        .in_flight_wait(wait)
        .tool(tool)
        .build()
        .expect("valid tools")
}

fn ship(order: &str) -> ToolCall {
    ToolCall::new("run-w", "ship", json!({"order": order}))
}

async fn running_keys(store: &Arc<dyn IdemStore>) -> Vec<idem::IdemKey> {
    store
        .list(RecordState::Running, 10)
        .await
        .expect("the store lists")
        .into_iter()
        .map(|r| r.key.clone())
        .collect()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
}

/// A handler held for about five lease lengths on worker A: its lease is renewed, so
/// worker B, asking again and again meanwhile, is told "in flight" and never executes; the
/// record stays running under A's claim the whole time (never unknown); a B that waits
/// long enough gets A's result once it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_outliving_its_lease_keeps_its_claim_and_runs_once() {
    // Short, but not so short that a renewal delayed by a busy machine (an fsync, a starved
    // thread) lets it lapse: that would be safe (unknown, never a second run) but not this
    // test's subject.
    let lease = Duration::from_millis(1000);
    for d in durables("lease") {
        let ledger = Arc::new(Ledger::default());
        let gate = Arc::new(Semaphore::new(0));
        let tool = || Slow {
            ledger: ledger.clone(),
            gate: gate.clone(),
            lease,
        };
        let a = ship_registry(d.open().await, tool(), Duration::from_millis(20));
        let b_store = d.open().await;
        let b = ship_registry(b_store.clone(), tool(), Duration::from_millis(20));
        let patient = ship_registry(d.open().await, tool(), Duration::from_secs(10));

        let first = tokio::spawn({
            let a = a.clone();
            async move { a.call(ship("o-1")).await }
        });
        until("the handler runs", || ledger.requests() == 1).await;
        let key = running_keys(&b_store).await.pop().expect("A's claim");
        let waiter = tokio::spawn({
            let patient = patient.clone();
            async move { patient.call(ship("o-1").call_id("toolu_p")).await }
        });

        // Five lease lengths with the handler alive: B asks every half lease.
        let start = std::time::Instant::now();
        while start.elapsed() < lease * 5 {
            let again = b.call(ship("o-1").call_id("toolu_b")).await;
            assert!(
                matches!(again.error(), Some(CallError::InFlight { .. })),
                "{}: {:?}",
                d.name,
                again.as_result()
            );
            let record = b_store.get(&key).await.unwrap().expect("the record");
            assert_eq!(
                record.state,
                RecordState::Running,
                "{}: renewed, never lapsed",
                d.name
            );
            tokio::time::sleep(lease / 2).await;
        }
        assert_eq!(ledger.requests(), 1, "{}: B never executed", d.name);

        gate.add_permits(10);
        let first = first.await.unwrap();
        assert!(first.is_completed(), "{}: {:?}", d.name, first.as_result());
        let waited = waiter.await.unwrap();
        assert!(
            waited.is_completed() && waited.replayed(),
            "{}: {:?}",
            d.name,
            waited.as_result()
        );
        let later = b.call(ship("o-1").call_id("toolu_c")).await;
        assert!(later.replayed() && later.is_completed(), "{}", d.name);
        assert_eq!(ledger.effects(), 1, "{}: one effect", d.name);
        let record = b_store.get(&key).await.unwrap().expect("the record");
        assert_eq!(record.state, RecordState::Completed, "{}", d.name);
    }
}

/// Worker A dies with its handler mid-flight (its request sent, nothing settled, no more
/// renewals) while worker B is already waiting on the same operation: B sees the claim
/// lapse and is answered *unknown*; it never runs the handler, and the record reads unknown
/// on every handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_dying_mid_handler_leaves_unknown_for_a_waiting_worker() {
    let lease = Duration::from_millis(150);
    for d in durables("dies") {
        let ledger = Arc::new(Ledger::default());
        let gate = Arc::new(Semaphore::new(0));
        let tool = || Slow {
            ledger: ledger.clone(),
            gate: gate.clone(),
            lease,
        };
        let a = ship_registry(d.open().await, tool(), Duration::from_millis(20));
        let b_store = d.open().await;
        let b = ship_registry(b_store.clone(), tool(), Duration::from_secs(10));

        let doomed = tokio::spawn({
            let a = a.clone();
            async move { a.call(ship("o-9")).await }
        });
        until("the handler runs", || ledger.requests() == 1).await;
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.call(ship("o-9").call_id("toolu_b")).await }
        });
        // Let B start waiting on the running claim, then kill A.
        tokio::time::sleep(Duration::from_millis(30)).await;
        doomed.abort();
        assert!(doomed.await.unwrap_err().is_cancelled());
        drop(a);
        // Anything that would let the handler finish now is too late: it is gone.
        gate.add_permits(10);

        let answer = waiting.await.unwrap();
        assert_eq!(
            answer.class(),
            Some(OutcomeClass::Unknown),
            "{}: {:?}",
            d.name,
            answer.as_result()
        );
        assert_eq!(ledger.requests(), 1, "{}: B never executed", d.name);
        let key = answer.key().expect("a key");
        for store in [&b_store, &d.open().await] {
            let record = store.get(key).await.unwrap().expect("the record");
            assert_eq!(record.state, RecordState::Unknown, "{}", d.name);
        }
        let again = b.call(ship("o-9").call_id("toolu_c")).await;
        assert_eq!(again.class(), Some(OutcomeClass::Unknown), "{}", d.name);
        assert_eq!(ledger.requests(), 1, "{}", d.name);
    }
}

/// The reconcilers' tools, one per kind of record left behind:
/// - `charge`, keyed: its first request commits and the answer is lost (unknown); the
///   downstream keeps one charge per key and answers a repeat with it;
/// - `refund`, unkeyed, accepted downstream as pending; its read-back finds it completed;
/// - `email`, unkeyed, no read-back: the answer is lost (unknown).
struct Multi {
    name: &'static str,
    ledger: Arc<Ledger>,
    read_backs: Arc<AtomicU32>,
}

impl WriteTool for Multi {
    type Args = OrderArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        let downstream = if self.name == "charge" {
            Downstream::Keyed
        } else {
            Downstream::Unkeyed
        };
        ToolSpec::new(self.name)
            .description("A write of the reconciler test.")
            .downstream(downstream)
            .in_flight_bound(Duration::from_millis(50))
    }
    async fn call(&self, ctx: WriteCtx, args: OrderArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        let n = self.ledger.request(&key);
        // Keyed: the downstream deduplicates, so only the first request is an effect.
        if self.name != "charge" || n == 1 {
            self.ledger.effect(&key);
        }
        // Slow enough for the other reconciler's pass to overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        match (self.name, n) {
            ("charge", 1) | ("email", _) => Err(ToolError::unknown("connection reset")),
            ("charge", _) => Ok(json!({"charge": args.order})),
            _ => Err(ToolError::pending(format!("re_{}", args.order))),
        }
    }
    async fn read_back(&self, ctx: ReadBackCtx, args: OrderArgs) -> Result<ReadBack, ToolError> {
        if self.name != "refund" {
            return Ok(ReadBack::Unsupported);
        }
        self.read_backs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(ctx.downstream_ref().is_some());
        Ok(ReadBack::Completed {
            downstream_ref: Some(format!("re_{}", args.order)),
            output: json!({"refunded": args.order}),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_at_once_retry_settle_and_escalate_each_record_once() {
    for d in durables("reconcilers") {
        let ledger = Arc::new(Ledger::default());
        let read_backs = Arc::new(AtomicU32::new(0));
        let escalations: Arc<Mutex<Vec<Escalation>>> = Arc::default();
        let worker = |store: Arc<dyn IdemStore>| {
            let sink = {
                let escalations = escalations.clone();
                CallbackSink(move |e: &Escalation| escalations.lock().unwrap().push(e.clone()))
            };
            let mut b = Registry::builder()
                .shared_store(store)
                .retry_policy(RetryPolicy::never())
                .escalation_sink(Arc::new(sink));
            for name in ["charge", "refund", "email"] {
                b = b.tool(Multi {
                    name,
                    ledger: ledger.clone(),
                    read_backs: read_backs.clone(),
                });
            }
            b.build().expect("valid tools")
        };
        let a = worker(d.open().await);
        let b = worker(d.open().await);
        let store = a.store().clone();

        let mut keys: BTreeMap<&str, Vec<idem::IdemKey>> = BTreeMap::new();
        for tool in ["charge", "refund", "email"] {
            for i in 0..4 {
                let r = a
                    .call(ToolCall::new(
                        "run-r",
                        tool,
                        json!({"order": format!("o{i}")}),
                    ))
                    .await;
                let want = if tool == "refund" {
                    OutcomeClass::Pending
                } else {
                    OutcomeClass::Unknown
                };
                assert_eq!(
                    r.class(),
                    Some(want),
                    "{}: {tool}: {:?}",
                    d.name,
                    r.as_result()
                );
                keys.entry(tool).or_default().push(r.key().unwrap().clone());
            }
        }
        assert_eq!(ledger.effects(), 12, "{}", d.name);

        // Two reconcilers, on two workers, at once; then once more each (nothing left).
        for _ in 0..2 {
            let (ra, rb) = (Reconciler::new(&a), Reconciler::new(&b));
            let (da, db) = tokio::join!(ra.run_all(), rb.run_all());
            da.expect("a pass");
            db.expect("a pass");
        }

        for key in &keys["charge"] {
            let k = key.as_str();
            assert_eq!(ledger.effects_of(k), 1, "{}: one charge", d.name);
            assert_eq!(
                ledger.requests_of(k),
                2,
                "{}: the original and exactly one retry with the same key",
                d.name
            );
            let r = store.get(key).await.unwrap().expect("the record");
            assert_eq!(r.state, RecordState::Completed, "{}", d.name);
        }
        for key in &keys["refund"] {
            assert_eq!(
                ledger.requests_of(key.as_str()),
                1,
                "{}: never sent again",
                d.name
            );
            let r = store.get(key).await.unwrap().expect("the record");
            assert_eq!(r.state, RecordState::Completed, "{}", d.name);
            let found: Vec<_> = r
                .read_backs
                .iter()
                .filter(|rb| rb.result.contains("found completed"))
                .collect();
            assert_eq!(
                found.len(),
                1,
                "{}: settled once: {:?}",
                d.name,
                r.read_backs
            );
        }
        let delivered = escalations.lock().unwrap().clone();
        for key in &keys["email"] {
            assert_eq!(
                ledger.requests_of(key.as_str()),
                1,
                "{}: never sent again",
                d.name
            );
            let r = store.get(key).await.unwrap().expect("the record");
            assert_eq!(r.state, RecordState::Escalated, "{}", d.name);
            let to_person = delivered.iter().filter(|e| &e.key == key).count();
            assert_eq!(to_person, 1, "{}: escalated once: {delivered:?}", d.name);
        }
        assert_eq!(delivered.len(), 4, "{}: {delivered:?}", d.name);
    }
}

/// A send refused as "unavailable" on every attempt, whose copy redelivered by a proxy ran
/// anyway: the executor freed the key with a release trace, and the read-back finds the
/// effect.
struct Redelivered {
    ledger: Arc<Ledger>,
}

impl WriteTool for Redelivered {
    type Args = OrderArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("notify")
            .description("Notifies a customer.")
            .in_flight_bound(Duration::from_millis(50))
    }
    async fn call(&self, ctx: WriteCtx, _args: OrderArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        self.ledger.request(&key);
        // The redelivered copy: the effect lands though this request is refused.
        if self.ledger.effects_of(&key) == 0 {
            self.ledger.effect(&key);
        }
        Err(ToolError::unavailable("503 Service Unavailable"))
    }
    async fn read_back(&self, ctx: ReadBackCtx, args: OrderArgs) -> Result<ReadBack, ToolError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(if self.ledger.effects_of(ctx.key().as_str()) > 0 {
            ReadBack::Completed {
                downstream_ref: Some(format!("n_{}", args.order)),
                output: json!({"notified": args.order}),
            }
        } else {
            ReadBack::NotFound
        })
    }
}

/// Two reconcilers at once over the same release traces: each effect found is recorded
/// again once (one completed record, one notice to a person), and nothing is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_record_a_redelivered_effect_once() {
    for d in durables("released") {
        let ledger = Arc::new(Ledger::default());
        let notices: Arc<Mutex<Vec<Escalation>>> = Arc::default();
        let worker = |store: Arc<dyn IdemStore>| {
            let notices = notices.clone();
            Registry::builder()
                .shared_store(store)
                .retry_policy(RetryPolicy::never())
                .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
                    notices.lock().unwrap().push(e.clone())
                })))
                .tool(Redelivered {
                    ledger: ledger.clone(),
                })
                .build()
                .expect("valid tools")
        };
        let (a, b) = (worker(d.open().await), worker(d.open().await));
        let mut keys = Vec::new();
        for i in 0..3 {
            let r = a
                .call(ToolCall::new(
                    "run-u",
                    "notify",
                    json!({"order": format!("o{i}")}),
                ))
                .await;
            assert_eq!(
                r.class(),
                Some(OutcomeClass::Unavailable),
                "{}: {:?}",
                d.name,
                r.as_result()
            );
            let key = r.key().unwrap().clone();
            assert!(
                a.store().get(&key).await.unwrap().is_none(),
                "{}: freed",
                d.name
            );
            keys.push(key);
        }
        let (ra, rb) = (Reconciler::new(&a), Reconciler::new(&b));
        let (da, db) = tokio::join!(ra.run_all(), rb.run_all());
        da.expect("a pass");
        db.expect("a pass");

        let notices = notices.lock().unwrap().clone();
        for key in &keys {
            let r = a.store().get(key).await.unwrap().expect("recorded again");
            assert_eq!(r.state, RecordState::Completed, "{}", d.name);
            assert_eq!(
                ledger.requests_of(key.as_str()),
                1,
                "{}: not sent again",
                d.name
            );
            let told = notices.iter().filter(|e| &e.key == key).count();
            assert_eq!(told, 1, "{}: one notice: {notices:?}", d.name);
        }
        let again = b
            .call(ToolCall::new("run-u", "notify", json!({"order": "o0"})))
            .await;
        assert!(
            again.replayed() && again.is_completed(),
            "{}: {:?}",
            d.name,
            again.as_result()
        );
        assert_eq!(ledger.requests(), 3, "{}", d.name);
    }
}

/// A keyed send whose first answer is lost: the executor retries it with the same key
/// after a backoff.
struct KeyedRetry {
    ledger: Arc<Ledger>,
    lease: Duration,
}

impl WriteTool for KeyedRetry {
    type Args = OrderArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .description("Charges an order.")
            .downstream(Downstream::Keyed)
            .timeout(Duration::from_secs(10))
            .lease(self.lease)
    }
    async fn call(&self, ctx: WriteCtx, args: OrderArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        if self.ledger.request(&key) == 1 {
            self.ledger.effect(&key);
            return Err(ToolError::unknown("connection reset after sending"));
        }
        Ok(json!({"charged": args.order}))
    }
}

/// Worker A's keyed retry waits out a backoff several times the lease: the claim is
/// renewed through the backoff, so worker B, asking meanwhile, is told "in flight" and
/// neither sends nor reads the record as unknown; A's retry (same key) completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_retry_backoff_longer_than_the_lease_keeps_the_claim() {
    let lease = Duration::from_millis(1000);
    for d in durables("backoff") {
        let ledger = Arc::new(Ledger::default());
        let worker = |store: Arc<dyn IdemStore>, policy: RetryPolicy| {
            Registry::builder()
                .shared_store(store)
                .retry_policy(policy)
                .in_flight_wait(Duration::from_millis(20))
                .tool(KeyedRetry {
                    ledger: ledger.clone(),
                    lease,
                })
                .build()
                .expect("valid tools")
        };
        let backoff = lease * 5;
        let a = worker(
            d.open().await,
            RetryPolicy::default()
                .max_attempts(2)
                .initial_backoff(backoff)
                .max_backoff(backoff)
                .jitter(0.0),
        );
        let b_store = d.open().await;
        let b = worker(b_store.clone(), RetryPolicy::never());
        let call = ToolCall::new("run-k", "charge", json!({"order": "o-1"}));
        let first = tokio::spawn({
            let (a, call) = (a.clone(), call.clone());
            async move { a.call(call).await }
        });
        until("the first send", || ledger.requests() == 1).await;
        let key = running_keys(&b_store).await.pop().expect("A's claim");
        let start = std::time::Instant::now();
        while start.elapsed() < backoff - lease {
            let again = b.call(call.clone().call_id("toolu_b")).await;
            assert!(
                matches!(again.error(), Some(CallError::InFlight { .. })),
                "{}: {:?}",
                d.name,
                again.as_result()
            );
            let record = b_store.get(&key).await.unwrap().expect("the record");
            assert_eq!(
                record.state,
                RecordState::Running,
                "{}: renewed through the backoff",
                d.name
            );
            tokio::time::sleep(lease / 2).await;
        }
        let first = first.await.unwrap();
        assert!(first.is_completed(), "{}: {:?}", d.name, first.as_result());
        assert_eq!(
            ledger.requests_of(key.as_str()),
            2,
            "{}: the send and one retry",
            d.name
        );
        assert_eq!(ledger.effects(), 1, "{}", d.name);
        let replay = b.call(call.clone().call_id("toolu_c")).await;
        assert!(replay.replayed() && replay.is_completed(), "{}", d.name);
    }
}
