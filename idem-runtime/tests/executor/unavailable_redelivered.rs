//! A downstream answers "unavailable, not executed" (503) while a copy of the same request,
//! redelivered by something in between, runs all the same. The caller is told nothing was
//! done and the key is freed; the reconciler must still find the effect, from the release
//! trace the executor keeps, and put a record back, so the effect is never left with no
//! record ("silently lost").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::{ManualClock, ReleaseNote, Timestamp};
use idem_runtime::{
    call::ToolCall,
    escalation::{Escalation, EscalationSink},
    outcome::OutcomeClass,
    reconcile::{Action, Reconciler},
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{Downstream, ReadBack, ReadBackCtx, ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;

/// What the downstream does with the copies of a request it refuses.
#[derive(Clone, Copy, PartialEq)]
enum Copy {
    /// No copy: the 503 is the whole truth.
    None,
    /// A copy runs at once.
    Runs,
    /// A copy runs when the test says ([`Billing::land_copies`]).
    Held,
    /// Two copies run at once (a downstream that does not deduplicate on the key).
    RunsTwice,
}

/// A billing service keyed on the idempotency key: its ledger is what happened.
struct Billing {
    copy: Mutex<Copy>,
    /// Answer 503 to the request itself.
    refuse: Mutex<bool>,
    requests: Mutex<u32>,
    read_backs: Mutex<u32>,
    /// The key of every read-back, in order.
    read_back_keys: Mutex<Vec<String>>,
    held: Mutex<Vec<String>>,
    ledger: Mutex<Vec<(String, String)>>,
}

impl Billing {
    fn new(copy: Copy) -> Arc<Billing> {
        Arc::new(Billing {
            copy: Mutex::new(copy),
            refuse: Mutex::new(true),
            requests: Mutex::new(0),
            read_backs: Mutex::new(0),
            read_back_keys: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
            ledger: Mutex::new(Vec::new()),
        })
    }

    /// Commits a charge for `key`, or (keyed) returns the one it already has.
    fn commit(&self, key: &str, dedupe: bool) -> String {
        let mut ledger = self.ledger.lock().unwrap();
        if dedupe {
            if let Some((_, id)) = ledger.iter().find(|(k, _)| k == key) {
                return id.clone();
            }
        }
        let id = format!("ch_{}", ledger.len() + 1);
        ledger.push((key.to_owned(), id.clone()));
        id
    }

    fn land_copies(&self) {
        for key in std::mem::take(&mut *self.held.lock().unwrap()) {
            self.commit(&key, true);
        }
    }

    fn charges(&self) -> Vec<(String, String)> {
        self.ledger.lock().unwrap().clone()
    }

    fn read_backs(&self) -> u32 {
        *self.read_backs.lock().unwrap()
    }

    /// How many read-backs asked about `key`.
    fn read_backs_of(&self, key: &idem_runtime::identity::IdemKey) -> usize {
        let keys = self.read_back_keys.lock().unwrap();
        keys.iter().filter(|k| **k == key.to_string()).count()
    }

    fn requests(&self) -> u32 {
        *self.requests.lock().unwrap()
    }
}

struct Charge(Arc<Billing>);

impl idem_runtime::tool::WriteTool for Charge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .downstream(Downstream::Keyed)
            .timeout(Duration::from_secs(10))
            .in_flight_bound(Duration::from_secs(60))
    }

    async fn call(&self, ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
        let b = &self.0;
        *b.requests.lock().unwrap() += 1;
        let key = ctx.key().to_string();
        match *b.copy.lock().unwrap() {
            Copy::None => {}
            Copy::Runs => {
                b.commit(&key, true);
            }
            Copy::Held => b.held.lock().unwrap().push(key.clone()),
            Copy::RunsTwice => {
                b.commit(&key, false);
                b.commit(&key, false);
            }
        }
        if *b.refuse.lock().unwrap() {
            return Err(ToolError::unavailable("503 overloaded"));
        }
        Ok(b.commit(&key, true))
    }

    async fn read_back(&self, ctx: ReadBackCtx, _args: Self::Args) -> Result<ReadBack, ToolError> {
        let b = &self.0;
        *b.read_backs.lock().unwrap() += 1;
        let key = ctx.key().to_string();
        b.read_back_keys.lock().unwrap().push(key.clone());
        let found: Vec<String> = b
            .charges()
            .into_iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, id)| id)
            .collect();
        Ok(match found.as_slice() {
            [] => ReadBack::NotFound,
            [id] => ReadBack::Completed {
                downstream_ref: Some(id.clone()),
                output: json!(id),
            },
            _ => ReadBack::Ambiguous {
                downstream_refs: found,
            },
        })
    }
}

/// The same downstream behind a tool whose copies may land for two hours.
struct SlowCharge(Arc<Billing>);

impl idem_runtime::tool::WriteTool for SlowCharge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("slow_charge")
            .downstream(Downstream::Keyed)
            .timeout(Duration::from_secs(10))
            .in_flight_bound(Duration::from_secs(3600))
    }

    async fn call(&self, ctx: WriteCtx, args: Self::Args) -> Result<String, ToolError> {
        idem_runtime::tool::WriteTool::call(&Charge(self.0.clone()), ctx, args).await
    }

    async fn read_back(&self, ctx: ReadBackCtx, args: Self::Args) -> Result<ReadBack, ToolError> {
        idem_runtime::tool::WriteTool::read_back(&Charge(self.0.clone()), ctx, args).await
    }
}

#[derive(Debug, Default)]
struct Sink(Mutex<Vec<Escalation>>);

#[async_trait::async_trait]
impl EscalationSink for Sink {
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        self.0.lock().unwrap().push(e.clone());
        Ok(())
    }
}

struct World {
    billing: Arc<Billing>,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    sink: Arc<Sink>,
    registry: Registry,
}

impl World {
    fn new(copy: Copy) -> World {
        let billing = Billing::new(copy);
        let clock = ManualClock::new(Timestamp(1_800_000_000_000));
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let sink = Arc::new(Sink::default());
        let registry = Registry::builder()
            .shared_store(store.clone())
            .clock(Arc::new(clock.clone()))
            .retry_policy(RetryPolicy::never())
            .escalation_sink(sink.clone())
            .tool(Charge(billing.clone()))
            .tool(SlowCharge(billing.clone()))
            .build()
            .unwrap();
        World {
            billing,
            store,
            clock,
            sink,
            registry,
        }
    }

    async fn call(&self) -> idem_runtime::call::ToolResult {
        self.registry
            .call(ToolCall::new("run-1", "charge", json!({"order": 7})))
            .await
    }

    /// Calls once; the downstream refuses it. Returns the key it was released under.
    async fn refused(&self) -> idem_runtime::identity::IdemKey {
        let told = self.call().await;
        assert_eq!(
            told.class(),
            Some(OutcomeClass::Unavailable),
            "{}",
            told.text()
        );
        let key = told.key().unwrap().clone();
        assert_eq!(
            self.store.get(&key).await.unwrap(),
            None,
            "the key is freed"
        );
        key
    }
}

#[tokio::test]
async fn the_release_keeps_a_trace_of_the_attempts() {
    let w = World::new(Copy::None);
    let key = w.refused().await;
    let releases = w.store.releases(&key).await.unwrap();
    assert_eq!(releases.len(), 1, "{releases:?}");
    let trace = &releases[0];
    assert_eq!(trace.by, ReleaseNote::EXECUTOR);
    assert_eq!(trace.record.attempts.len(), 1);
    assert_eq!(trace.record.attempts[0].class, OutcomeClass::Unavailable);
    let saved: &serde_json::Value = &trace.record.operation.as_ref().unwrap().args;
    assert_eq!(*saved, json!({"order": 7}));
}

#[tokio::test]
async fn a_copy_that_ran_is_found_and_recorded_again() {
    let w = World::new(Copy::Runs);
    let key = w.refused().await;
    assert_eq!(w.billing.charges().len(), 1, "the redelivered copy ran");

    let decisions = Reconciler::new(&w.registry).run_once().await.unwrap();
    assert!(
        decisions
            .iter()
            .any(|d| d.action == Action::Settled && d.key == key),
        "{decisions:?}"
    );
    let record = w.store.get(&key).await.unwrap().expect("recorded again");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.payload, Some(json!("ch_1")));
    assert_eq!(record.downstream_ref.as_deref(), Some("ch_1"));
    assert_eq!(record.attempts.len(), 1, "the refused attempt is kept");
    assert_eq!(
        record.read_backs.len(),
        1,
        "and the read-back that found it"
    );
    let told = w.sink.0.lock().unwrap().clone();
    assert_eq!(told.len(), 1, "a person is told the caller heard otherwise");
    assert_eq!(told[0].key, key);

    // A repeat replays what was found; the downstream is not asked again.
    let requests = w.billing.requests();
    let again = w.call().await;
    assert!(again.is_completed() && again.replayed(), "{}", again.text());
    assert_eq!(w.billing.requests(), requests);
    assert_eq!(w.billing.charges().len(), 1);
}

#[tokio::test]
async fn a_copy_that_lands_late_is_found_on_a_later_pass() {
    let w = World::new(Copy::Held);
    let key = w.refused().await;
    let reconciler = Reconciler::new(&w.registry);

    let first = reconciler.run_once().await.unwrap();
    assert!(
        first
            .iter()
            .any(|d| d.action == Action::Waiting && d.key == key),
        "not found yet, and a copy may still land: {first:?}"
    );
    assert_eq!(w.store.get(&key).await.unwrap(), None);

    w.billing.land_copies();
    w.clock.advance(Duration::from_secs(30));
    reconciler.run_once().await.unwrap();
    let record = w.store.get(&key).await.unwrap().expect("recorded again");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(w.billing.charges().len(), 1);
}

#[tokio::test]
async fn nothing_ran_is_read_back_until_no_copy_can_land_then_left_alone() {
    let w = World::new(Copy::None);
    let key = w.refused().await;
    let reconciler = Reconciler::new(&w.registry);

    reconciler.run_once().await.unwrap();
    assert_eq!(w.billing.read_backs(), 1);
    w.clock.advance(Duration::from_secs(60));
    reconciler.run_once().await.unwrap();
    assert_eq!(
        w.billing.read_backs(),
        2,
        "a copy may land until 10 s + 2 × 60 s"
    );

    // Past last send + timeout + 2 × bound: one more look, for good.
    w.clock.advance(Duration::from_secs(71));
    let decisions = reconciler.run_once().await.unwrap();
    assert_eq!(w.billing.read_backs(), 3);
    assert!(decisions.is_empty(), "nothing to report: {decisions:?}");
    reconciler.run_once().await.unwrap();
    assert_eq!(
        w.billing.read_backs(),
        3,
        "looked at for good: not read back again"
    );
    assert_eq!(
        w.store.get(&key).await.unwrap(),
        None,
        "nothing ran: the key stays free"
    );

    // A reconciler that starts later looks back over its window once; with no window, never.
    Reconciler::new(&w.registry).run_all().await.unwrap();
    assert_eq!(w.billing.read_backs(), 4);
    Reconciler::new(&w.registry)
        .watch_released_for(Duration::ZERO)
        .run_all()
        .await
        .unwrap();
    assert_eq!(w.billing.read_backs(), 4);
    w.clock.advance(Duration::from_secs(25 * 3600));
    Reconciler::new(&w.registry).run_all().await.unwrap();
    assert_eq!(
        w.billing.read_backs(),
        4,
        "out of the default window of a day"
    );
    assert!(w.billing.charges().is_empty());
    assert!(w.sink.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_key_claimed_again_is_left_to_its_new_record() {
    let w = World::new(Copy::Runs);
    let key = w.refused().await;
    // The caller tries again later; the keyed downstream answers with the charge it has.
    *w.billing.refuse.lock().unwrap() = false;
    *w.billing.copy.lock().unwrap() = Copy::None;
    let again = w.call().await;
    assert!(
        again.is_completed() && !again.replayed(),
        "{}",
        again.text()
    );
    let before = w.store.get(&key).await.unwrap().unwrap();

    let decisions = Reconciler::new(&w.registry).run_once().await.unwrap();
    assert!(decisions.is_empty(), "{decisions:?}");
    assert_eq!(
        w.billing.read_backs(),
        0,
        "the new record speaks for the operation"
    );
    assert_eq!(w.store.get(&key).await.unwrap().unwrap(), before);
    assert_eq!(w.billing.charges().len(), 1);
    assert!(w.sink.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn two_effects_behind_a_refusal_go_to_a_person() {
    let w = World::new(Copy::RunsTwice);
    let key = w.refused().await;
    assert_eq!(w.billing.charges().len(), 2);

    let decisions = Reconciler::new(&w.registry).run_once().await.unwrap();
    assert!(
        decisions
            .iter()
            .any(|d| d.action == Action::Escalated && d.key == key),
        "{decisions:?}"
    );
    let record = w.store.get(&key).await.unwrap().expect("recorded again");
    assert_eq!(record.state, RecordState::Escalated);
    assert_eq!(record.read_backs.len(), 1);
    let told = w.sink.0.lock().unwrap().clone();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].key, key);
    // Escalated, not sent again: a repeat is refused the send.
    let requests = w.billing.requests();
    let again = w.call().await;
    assert_eq!(
        again.class(),
        Some(OutcomeClass::Escalated),
        "{}",
        again.text()
    );
    assert_eq!(w.billing.requests(), requests);
}

/// A release still inside its horizon holds the reconciler's place; the releases after it
/// that were looked at for good are not read back again on every pass behind it.
#[tokio::test]
async fn a_release_looked_at_for_good_is_not_read_back_again_behind_one_still_watched() {
    let w = World::new(Copy::None);
    let refused = |tool: &'static str| {
        let registry = &w.registry;
        async move {
            let told = registry
                .call(ToolCall::new("run-1", tool, json!({"order": 7})))
                .await;
            assert_eq!(
                told.class(),
                Some(OutcomeClass::Unavailable),
                "{}",
                told.text()
            );
            told.key().unwrap().clone()
        }
    };
    // The slow one is released first, so it sorts first among the releases.
    let slow = refused("slow_charge").await;
    w.clock.advance(Duration::from_secs(1));
    let fast = refused("charge").await;
    let reconciler = Reconciler::new(&w.registry);

    reconciler.run_once().await.unwrap();
    assert_eq!(
        (
            w.billing.read_backs_of(&slow),
            w.billing.read_backs_of(&fast)
        ),
        (1, 1)
    );
    // Past the fast tool's horizon (10 s + 2 × 60 s), far inside the slow one's.
    w.clock.advance(Duration::from_secs(131));
    reconciler.run_once().await.unwrap();
    assert_eq!(
        (
            w.billing.read_backs_of(&slow),
            w.billing.read_backs_of(&fast)
        ),
        (2, 2),
        "both read back: the slow one still watched, the fast one once more, for good"
    );
    for pass in 3..=5 {
        w.clock.advance(Duration::from_secs(60));
        reconciler.run_once().await.unwrap();
        assert_eq!(
            (
                w.billing.read_backs_of(&slow),
                w.billing.read_backs_of(&fast)
            ),
            (pass, 2),
            "pass {pass}: only the release still inside its horizon is read back"
        );
    }
    // Past the slow one's horizon: its last look, then neither is read back again.
    w.clock.advance(Duration::from_secs(2 * 3600));
    reconciler.run_once().await.unwrap();
    reconciler.run_once().await.unwrap();
    assert_eq!(
        (
            w.billing.read_backs_of(&slow),
            w.billing.read_backs_of(&fast)
        ),
        (6, 2)
    );
    assert!(w.billing.charges().is_empty());
}
