//! A key-format migration (`KeyMigration`) on durable stores, each build a worker with its
//! own handle: an operation claimed under one format is found under the other, in both
//! directions (a phase-2 build finds a v1 claim, a phase-1 build finds a v2 claim), while
//! it is still running and once it has settled; workers of the two phases racing on the
//! same operations run each once; and once the migration has ended, nothing is lost: the
//! operations claimed during it replay, and an *unknown* operation claimed under the old
//! format is retried by the reconciler with the key it was first sent with.
//!
//! Assertions are on the downstream's ledger (which key each request carried) and the
//! store's records.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    identity::{KeyFormat, KeyMigration},
    registry::RetryPolicy,
    store::RecordState,
    tool::{Downstream, ToolSpec, WriteTool},
    CallError, IdemStore, OutcomeClass, Reconciler, Registry, ToolCall, ToolError, WriteCtx,
};
use idem_test::stores::durables;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A keyed downstream: every request is logged with its key; the first request under a key
/// is the charge, a repeat with the same key gets it back. `lose_first` loses the answer to
/// each key's first request (the call ends unknown).
#[derive(Default)]
struct Bank {
    requests: Mutex<Vec<(String, String)>>,
    charges: Mutex<BTreeMap<String, String>>,
}

impl Bank {
    fn charges_of(&self, customer: &str) -> usize {
        self.charges
            .lock()
            .unwrap()
            .values()
            .filter(|c| *c == customer)
            .count()
    }
    fn keys_sent_for(&self, customer: &str) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, c)| c == customer)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

struct Charge {
    bank: Arc<Bank>,
    gate: Option<Arc<Semaphore>>,
    lose_first: bool,
}

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .description("Charges a customer.")
            .downstream(Downstream::Keyed)
    }
    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        self.bank
            .requests
            .lock()
            .unwrap()
            .push((key.clone(), args.customer.clone()));
        let first = {
            let mut charges = self.bank.charges.lock().unwrap();
            let first = !charges.contains_key(&key);
            charges.entry(key).or_insert(args.customer.clone());
            first
        };
        if let Some(gate) = &self.gate {
            let _p = gate.acquire().await.expect("the gate stays");
        }
        if first && self.lose_first {
            return Err(ToolError::unknown("connection reset after sending"));
        }
        Ok(json!({"charged": args.cents, "customer": args.customer}))
    }
}

fn build(
    store: Arc<dyn IdemStore>,
    bank: &Arc<Bank>,
    migration: KeyMigration,
    gate: Option<Arc<Semaphore>>,
    lose_first: bool,
) -> Registry {
    Registry::builder()
        .shared_store(store)
        .in_flight_wait(Duration::from_millis(50))
        .retry_policy(RetryPolicy::never())
        .key_migration(migration)
        .tool(Charge {
            bank: bank.clone(),
            gate,
            lose_first,
        })
        .build()
        .expect("valid tools")
}

fn charge(customer: &str, cents: u64) -> ToolCall {
    ToolCall::new(
        "run-m",
        "charge",
        json!({"customer": customer, "cents": cents}),
    )
}

fn old() -> KeyMigration {
    KeyMigration::claim_under(KeyFormat::V1)
}
fn phase_one() -> KeyMigration {
    KeyMigration::claim_previous(KeyFormat::V1)
}
fn phase_two() -> KeyMigration {
    KeyMigration::honour_previous(KeyFormat::V1)
}

/// The process restarts on the new build: the old build's handle is gone, and the new build
/// (phase 2, on a handle of its own over the same store) replays what the old one settled,
/// keyed by its arguments and by an intent id alike.
#[tokio::test]
async fn an_upgrade_across_a_restart_finds_the_records_of_the_old_build() {
    for d in durables("migration_restart") {
        let bank = Arc::new(Bank::default());
        {
            let old_build = build(d.open().await, &bank, old(), None, false);
            assert!(old_build.call(charge("acme", 4900)).await.is_completed());
            assert!(old_build
                .call(charge("globex", 100).intent("order-7"))
                .await
                .is_completed());
        }
        let new_build = build(d.open().await, &bank, phase_two(), None, false);
        let acme = new_build
            .call(charge("acme", 4900).call_id("toolu_r1"))
            .await;
        let globex = new_build
            .call(charge("globex", 100).intent("order-7").call_id("toolu_r2"))
            .await;
        assert!(acme.replayed(), "{}: {:?}", d.name, acme.as_result());
        assert!(globex.replayed(), "{}: {:?}", d.name, globex.as_result());
        assert_eq!(bank.keys_sent_for("acme").len(), 1, "{}", d.name);
        assert_eq!(bank.keys_sent_for("globex").len(), 1, "{}", d.name);
    }
}

/// Direction 1: an old (v1) build's claim, running and then settled, is found by a phase-2
/// build (which claims under v2). Direction 2: a phase-2 build's claim (under v2) is found by
/// a phase-1 build (which claims under v1). Neither is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_under_either_format_is_found_under_the_other() {
    for d in durables("migration_found") {
        let bank = Arc::new(Bank::default());
        let gate = Arc::new(Semaphore::new(0));
        let v1_worker = build(d.open().await, &bank, old(), Some(gate.clone()), false);
        let v2_worker = build(d.open().await, &bank, phase_two(), None, false);

        // Direction 1, running: the old build's handler is held mid-flight.
        let running = tokio::spawn({
            let w = v1_worker.clone();
            async move { w.call(charge("acme", 4900)).await }
        });
        while bank.keys_sent_for("acme").is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let meanwhile = v2_worker
            .call(charge("acme", 4900).call_id("toolu_2"))
            .await;
        assert!(
            matches!(meanwhile.error(), Some(CallError::InFlight { .. })),
            "{}: {:?}",
            d.name,
            meanwhile.as_result()
        );
        gate.add_permits(100);
        let first = running.await.unwrap();
        assert!(first.is_completed(), "{}", d.name);
        // ... and settled.
        let replay = v2_worker
            .call(charge("acme", 4900).call_id("toolu_3"))
            .await;
        assert!(
            replay.replayed() && replay.is_completed(),
            "{}: {:?}",
            d.name,
            replay.as_result()
        );
        // Changed parameters against the v1 claim (same customer under an intent id) are refused.
        assert!(v1_worker
            .call(charge("initech", 100).intent("order-9"))
            .await
            .is_completed());
        let changed = v2_worker
            .call(charge("initech", 999).intent("order-9"))
            .await;
        assert!(
            matches!(changed.error(), Some(CallError::ChangedParams { .. })),
            "{}: {:?}",
            d.name,
            changed.as_result()
        );
        assert_eq!(bank.charges_of("acme"), 1, "{}", d.name);
        assert_eq!(
            bank.keys_sent_for("acme").len(),
            1,
            "{}: never sent again",
            d.name
        );
        assert_eq!(bank.charges_of("initech"), 1, "{}", d.name);

        // Direction 2: claimed under v2 by phase 2, found by phase 1 under v1.
        let v1_phase_one = build(d.open().await, &bank, phase_one(), None, false);
        assert!(v2_worker.call(charge("globex", 100)).await.is_completed());
        let found = v1_phase_one
            .call(charge("globex", 100).call_id("toolu_4"))
            .await;
        assert!(
            found.replayed() && found.is_completed(),
            "{}: {:?}",
            d.name,
            found.as_result()
        );
        assert_eq!(bank.keys_sent_for("globex").len(), 1, "{}", d.name);
    }
}

/// Phase-1 and phase-2 workers, on their own handles, fire the same operations at once:
/// one effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_of_both_phases_racing_run_each_operation_once() {
    const OPS: usize = 12;
    for d in durables("migration_race") {
        let bank = Arc::new(Bank::default());
        let a = build(d.open().await, &bank, phase_one(), None, false);
        let b = build(d.open().await, &bank, phase_two(), None, false);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..OPS {
            for w in [a.clone(), b.clone(), a.clone(), b.clone()] {
                set.spawn(async move { w.call(charge(&format!("c{i}"), 1)).await });
            }
        }
        for r in set.join_all().await {
            assert!(
                r.is_completed() || matches!(r.error(), Some(CallError::InFlight { .. })),
                "{}: {:?}",
                d.name,
                r.as_result()
            );
        }
        for i in 0..OPS {
            let c = format!("c{i}");
            assert!(b.call(charge(&c, 1)).await.is_completed(), "{}", d.name);
            assert_eq!(bank.charges_of(&c), 1, "{}: {c} ran once", d.name);
            assert_eq!(bank.keys_sent_for(&c).len(), 1, "{}: {c} sent once", d.name);
        }
    }
}

/// After the migration ends (a build with no migration, claiming under v2 only): what
/// phase 2 claimed under v2 replays; an operation the old build left *unknown* under its v1
/// key is still there, and the reconciler retries it with that same v1 key, so the keyed
/// downstream answers with the charge it already made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_migration_ends_nothing_is_lost() {
    for d in durables("migration_end") {
        let bank = Arc::new(Bank::default());
        let v1 = build(d.open().await, &bank, old(), None, true);
        let lost = v1.call(charge("acme", 4900)).await;
        assert_eq!(
            lost.class(),
            Some(OutcomeClass::Unknown),
            "{}: {:?}",
            d.name,
            lost.as_result()
        );
        let v1_key = lost.key().unwrap().clone();
        let p2 = build(d.open().await, &bank, phase_two(), None, false);
        let during = p2.call(charge("globex", 100)).await;
        assert!(during.is_completed(), "{}", d.name);
        let blocked = p2.call(charge("acme", 4900).call_id("toolu_2")).await;
        assert_eq!(blocked.class(), Some(OutcomeClass::Unknown), "{}", d.name);
        assert_eq!(
            blocked.key(),
            Some(&v1_key),
            "{}: found under the v1 key",
            d.name
        );

        // The migration ends.
        let now = build(d.open().await, &bank, KeyMigration::none(), None, false);
        let replay = now.call(charge("globex", 100).call_id("toolu_3")).await;
        assert!(
            replay.replayed() && replay.is_completed(),
            "{}: {:?}",
            d.name,
            replay.as_result()
        );
        assert_eq!(bank.keys_sent_for("globex").len(), 1, "{}", d.name);

        let store = now.store().clone();
        let record = store
            .get(&v1_key)
            .await
            .unwrap()
            .expect("the v1 record is kept");
        assert_eq!(record.state, RecordState::Unknown, "{}", d.name);
        Reconciler::new(&now).run_all().await.expect("a pass");
        let sent = bank.keys_sent_for("acme");
        assert_eq!(
            sent.len(),
            2,
            "{}: the original and one retry: {sent:?}",
            d.name
        );
        assert!(
            sent.iter().all(|k| k == v1_key.as_str()),
            "{}: the retry carried the key first sent: {sent:?}",
            d.name
        );
        assert_eq!(bank.charges_of("acme"), 1, "{}", d.name);
        let record = store.get(&v1_key).await.unwrap().expect("the record");
        assert_eq!(record.state, RecordState::Completed, "{}", d.name);
    }
}
