//! The outcome matrix again, on a durable store: every row runs its first call on one agent
//! process, then *restarts* — the registry and the SQLite store are dropped and the same
//! file is opened again — and asks again from the new process. What a repeat gets must not
//! depend on whether the process that made the record is still alive.
//!
//! As in `in_process.rs`, the service is the Stripe-like stub in `idem_test::payments` behind its
//! faulty proxy, the assertions come first on its ledger (charges, refunds, requests), and
//! time is tokio's paused clock, which idem's store reads too.

#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::time::Duration;

use idem::reconcile::{resolve, Action, Resolution};
use idem::store::{Clock, Retention};
use idem::{
    store::RecordState, CallError, IdemStore, Outcome, OutcomeClass, Reconciler, Registry,
    SqliteStore, ToolCall, ToolResult,
};
use idem_test::payments::{
    Keys, Leg, Misstep, Payments, Proxy, RefundStatus, STRIPE_KEY_RETENTION,
};
use idem_test::stores::TempDir;
use idem_test::tools::{ChargeTool, TOOL_TIMEOUT};
use serde_json::json;

use crate::world::{actions, charge, charge_id, clock, registry, service, DAY, HOUR, RUN};

/// One service and its proxy, a store file, and the agent process currently running on it.
struct World {
    payments: Payments,
    proxy: Proxy,
    clock: Arc<dyn Clock>,
    keys: Keys,
    dir: TempDir,
    store: Option<SqliteStore>,
    registry: Option<Registry>,
}

impl World {
    async fn new(name: &str, keys: Keys) -> World {
        let (payments, proxy) = service(keys);
        let clock = clock();
        let mut w = World {
            payments,
            proxy,
            clock,
            keys,
            dir: TempDir::new(&format!("matrix_{name}")),
            store: None,
            registry: None,
        };
        w.start().await;
        w
    }

    /// Starts an agent process on the store file.
    async fn start(&mut self) {
        let store = SqliteStore::builder(self.dir.path().join("idem.sqlite3"))
            .clock(self.clock.clone())
            .retention(Retention::default())
            .open()
            .await
            .expect("the store opens");
        let registry = registry(&self.proxy, &self.clock, Arc::new(store.clone()), self.keys);
        self.store = Some(store);
        self.registry = Some(registry);
    }

    /// The process dies (nothing of it survives but the file) and a new one starts.
    async fn restart(&mut self) {
        self.registry = None;
        self.store = None;
        self.start().await;
    }

    fn registry(&self) -> &Registry {
        self.registry.as_ref().expect("a process is running")
    }

    fn store(&self) -> &SqliteStore {
        self.store.as_ref().expect("a process is running")
    }

    async fn call(&self, call: ToolCall) -> ToolResult {
        self.registry().call(call).await
    }

    async fn state(&self, r: &ToolResult) -> Option<RecordState> {
        let key = r.key().expect("a write has a key");
        self.store().get(key).await.unwrap().map(|r| r.state)
    }

    fn charges(&self) -> usize {
        self.payments.charges().len()
    }
}

#[tokio::test(start_paused = true)]
async fn rejected_before_execution_then_restart_runs_once() {
    let mut w = World::new("rejected", Keys::Honoured).await;
    w.payments.script(Misstep::RejectBeforeExecution);
    let rejected = w.call(charge(4900)).await;
    assert_eq!(w.charges(), 0);
    assert_eq!(rejected.class(), Some(OutcomeClass::Rejected));
    assert_eq!(w.state(&rejected).await, None, "the claim was released");

    w.restart().await;
    let again = w.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert!(again.is_completed() && !again.replayed());
    w.restart().await;
    let third = w.call(charge(4900).call_id("toolu_3")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert!(third.replayed());
    assert_eq!(charge_id(&third), charge_id(&again));
}

#[tokio::test(start_paused = true)]
async fn response_lost_after_commit_then_restart_replays() {
    let mut w = World::new("lost", Keys::Honoured).await;
    w.proxy.then(Leg::DropResponse);
    let first = w.call(charge(4900)).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2, "one retry with the same key");
    assert_eq!(first.class(), Some(OutcomeClass::Completed));

    w.restart().await;
    let again = w.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert!(again.replayed());
    assert_eq!(charge_id(&again), w.payments.charges()[0].id);
}

#[tokio::test(start_paused = true)]
async fn still_pending_across_restarts_is_polled_to_terminal() {
    let mut w = World::new("pending", Keys::Honoured).await;
    let charged = w.call(charge(4900)).await;
    let id = charge_id(&charged);
    let refund = |call_id: &str| {
        ToolCall::new(RUN, "refund", json!({ "charge": id, "amount": 4900 })).call_id(call_id)
    };
    let first = w.call(refund("toolu_2")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    let refunds = w.payments.refunds();
    assert_eq!(refunds.len(), 1);

    // Days pass with the refund pending: the record never expires, and a repeat from a new
    // process is told "pending" without sending anything.
    tokio::time::sleep(40 * DAY).await;
    w.restart().await;
    let again = w.call(refund("toolu_3")).await;
    assert_eq!(w.payments.refunds().len(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert_eq!(again.class(), Some(OutcomeClass::Pending));
    assert!(again.replayed());

    let decisions = Reconciler::new(w.registry()).run_once().await.unwrap();
    assert_eq!(actions(&decisions), [Action::Waiting]);
    w.payments
        .finish_refund(&refunds[0].id, RefundStatus::Succeeded)
        .unwrap();
    w.restart().await;
    let decisions = Reconciler::new(w.registry()).run_once().await.unwrap();
    assert_eq!(actions(&decisions), [Action::Settled]);
    w.restart().await;
    let settled = w.call(refund("toolu_4")).await;
    assert_eq!(w.payments.refunds().len(), 1);
    assert_eq!(w.payments.requests(), 2, "one charge, one refund request");
    assert_eq!(settled.class(), Some(OutcomeClass::Completed));
    assert_eq!(settled.output().unwrap()["status"], "succeeded");
}

#[tokio::test(start_paused = true)]
async fn original_running_past_the_timeout_commits_late_and_settles_the_file() {
    let mut w = World::new("late", Keys::Honoured).await;
    w.payments.script(Misstep::Slow(TOOL_TIMEOUT * 3));
    let result = w.call(charge(4900)).await;
    assert_eq!(w.charges(), 0);
    assert_eq!(result.class(), Some(OutcomeClass::Unknown));
    assert_eq!(w.state(&result).await, Some(RecordState::Unknown));

    // The original lands while this process still watches it; its late result is written.
    w.payments.created(1).await;
    tokio::time::sleep(HOUR).await;
    assert_eq!(w.charges(), 1);
    w.restart().await;
    assert_eq!(w.state(&result).await, Some(RecordState::Completed));
    let repeat = w.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 3);
    assert!(repeat.replayed());
    assert_eq!(charge_id(&repeat), w.payments.charges()[0].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_from_two_processes_on_one_file_charge_once() {
    // Real time here: a paused clock needs a current-thread runtime.
    let dir = TempDir::new("concurrent");
    let payments = Payments::with(Keys::Ignored, STRIPE_KEY_RETENTION);
    let proxy = Proxy::new(payments.clone());
    let open = || async {
        let store = SqliteStore::open(dir.0.join("idem.sqlite3")).await.unwrap();
        Registry::builder()
            .store(store)
            .tool(ChargeTool::unkeyed(proxy.clone()))
            .build()
            .unwrap()
    };
    // Two processes on the same file (the store's own locking must hold across handles).
    let registries = [open().await, open().await];
    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let registry = registries[i % 2].clone();
        set.spawn(async move {
            registry
                .call(charge(4900).call_id(format!("toolu_{i}")))
                .await
        });
    }
    let results = set.join_all().await;
    let charges = payments.charges();
    assert_eq!(charges.len(), 1, "a service without keys charged once");
    assert_eq!(payments.requests(), 1);
    for r in &results {
        match r.as_result() {
            Ok(_) => {
                assert_eq!(r.class(), Some(OutcomeClass::Completed), "{r:?}");
                assert_eq!(charge_id(r), charges[0].id);
            }
            // A duplicate that waited its bound for the original may be told "in flight";
            // never anything that ran.
            Err(e) => assert!(matches!(e, CallError::InFlight { .. }), "{e:?}"),
        }
    }
    assert_eq!(
        results
            .iter()
            .filter(|r| !r.replayed() && r.is_completed())
            .count(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn same_key_changed_params_is_refused_after_a_restart() {
    let mut w = World::new("changed", Keys::Honoured).await;
    let first = w.call(charge(4900).intent("order-7")).await;
    assert!(first.is_completed());
    w.restart().await;
    let changed = w
        .call(charge(9900).intent("order-7").call_id("toolu_2"))
        .await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.charges()[0].amount, 4900);
    assert_eq!(w.payments.requests(), 1);
    assert!(
        matches!(changed.error(), Some(CallError::ChangedParams { key }) if Some(key) == first.key()),
        "{changed:?}"
    );
    // The refusal changed nothing on the record.
    assert_eq!(w.state(&first).await, Some(RecordState::Completed));
}

#[tokio::test(start_paused = true)]
async fn retry_after_key_expiry_is_a_tombstone_never_a_second_charge() {
    let mut w = World::new("expiry", Keys::Honoured).await;
    let first = w.call(charge(4900)).await;
    let key = first.key().unwrap().clone();
    assert_eq!(w.charges(), 1);

    // Past the service's key retention and idem's result retention, and the store swept.
    tokio::time::sleep(STRIPE_KEY_RETENTION + HOUR).await;
    assert!(!w.payments.remembers_key(key.as_str()));
    w.store().sweep().await.unwrap();
    w.restart().await;
    let retry = w.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(
        retry.outcome(),
        Some(&Outcome::ResultExpired {
            was: OutcomeClass::Completed
        })
    );
    assert!(
        retry.text().contains("no longer kept"),
        "the model is told the result is gone: {}",
        retry.text()
    );
    let tombstone = w.store().get(&key).await.unwrap().unwrap();
    assert!(tombstone.result_expired && tombstone.payload.is_none());
}

#[tokio::test(start_paused = true)]
async fn unknown_and_escalated_records_never_expire() {
    let mut w = World::new("never-expire", Keys::Ignored).await;
    // No key contract and a lost response: unknown, not retried; the reconciler escalates it.
    w.proxy.then(Leg::DropResponse);
    let escalated = w.call(charge(7700)).await;
    assert_eq!(escalated.class(), Some(OutcomeClass::Unknown));
    // Once nothing sent can still land, the reconciler hands it to a person.
    tokio::time::sleep(HOUR).await;
    let decisions = Reconciler::new(w.registry()).run_once().await.unwrap();
    assert_eq!(actions(&decisions), [Action::Escalated]);
    // Another operation, left unknown (no reconciler runs again).
    w.proxy.then(Leg::DropResponse);
    let unknown = w.call(charge(4900)).await;
    assert_eq!(unknown.class(), Some(OutcomeClass::Unknown));
    assert_eq!(w.charges(), 2);

    // Well past both retentions (24 h results, 30 days tombstones), with sweeps.
    for _ in 0..4 {
        tokio::time::sleep(20 * DAY).await;
        w.store().sweep().await.unwrap();
        w.restart().await;
    }
    for (r, amount, state, class) in [
        (&unknown, 4900, RecordState::Unknown, OutcomeClass::Unknown),
        (
            &escalated,
            7700,
            RecordState::Escalated,
            OutcomeClass::Escalated,
        ),
    ] {
        assert_eq!(w.state(r).await, Some(state), "kept");
        let again = w.call(charge(amount).call_id("toolu_9")).await;
        assert_eq!(again.class(), Some(class));
        assert!(again.replayed());
    }
    assert_eq!(w.charges(), 2, "never sent again");
    assert_eq!(w.payments.requests(), 2);

    // A person decides from a new process; the repeat replays the decision.
    w.restart().await;
    let key = unknown.key().unwrap();
    resolve(
        w.store(),
        key,
        Resolution::Completed {
            downstream_ref: w.payments.charges()[0].id.clone(),
            output: None,
        },
        "checked the dashboard",
    )
    .await
    .unwrap();
    w.restart().await;
    let replay = w.call(charge(4900).call_id("toolu_10")).await;
    assert_eq!(replay.class(), Some(OutcomeClass::Completed));
    assert!(replay.replayed());
    assert_eq!(w.payments.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn two_intents_with_equal_params_across_a_restart() {
    let mut w = World::new("intents", Keys::Honoured).await;
    let a = w.call(charge(4900).intent("order-1")).await;
    w.restart().await;
    let b = w.call(charge(4900).intent("order-2")).await;
    w.restart().await;
    let a_again = w
        .call(charge(4900).intent("order-1").call_id("toolu_2"))
        .await;
    let b_again = w
        .call(charge(4900).intent("order-2").call_id("toolu_3"))
        .await;
    assert_eq!(w.charges(), 2);
    assert_eq!(w.payments.requests(), 2);
    assert_ne!(charge_id(&a), charge_id(&b));
    assert_eq!(charge_id(&a_again), charge_id(&a));
    assert_eq!(charge_id(&b_again), charge_id(&b));
}

#[tokio::test(start_paused = true)]
async fn model_reissues_with_a_new_tool_use_id_after_a_restart() {
    let mut w = World::new("reissue", Keys::Honoured).await;
    let first = w.call(charge(4900)).await;
    w.restart().await;
    let reissued = w
        .call(
            ToolCall::from_json(RUN, "charge", r#"{ "amount": 4900, "customer": "acme" }"#)
                .call_id("toolu_9"),
        )
        .await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert!(reissued.replayed());
    assert_eq!(reissued.key(), first.key());
}

#[tokio::test(start_paused = true)]
async fn crash_between_claim_and_complete_on_a_keyed_service_is_retried_with_the_same_key() {
    let mut w = World::new("crash", Keys::Honoured).await;
    w.proxy.then(Leg::DropResponse);
    let worker = {
        let registry = w.registry().clone();
        tokio::spawn(async move { registry.call(charge(4900)).await })
    };
    w.payments.created(1).await;
    worker.abort();
    assert!(worker.await.unwrap_err().is_cancelled());

    // The process dies; a new one starts before the lease has passed: in flight, not sent.
    w.restart().await;
    let running = w.store().list(RecordState::Running, 10).await.unwrap();
    assert_eq!(running.len(), 1, "the claim survived the crash");
    assert!(running[0].operation.is_some(), "with what was asked for");
    let key = running[0].key.clone();

    // After the lease: unknown, never free.
    tokio::time::sleep(TOOL_TIMEOUT + Duration::from_secs(60)).await;
    let result = w.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(result.class(), Some(OutcomeClass::Unknown));
    assert_eq!(result.key(), Some(&key));

    // The reconciler of yet another process retries with the same key: the service replays.
    w.restart().await;
    let decisions = Reconciler::new(w.registry()).run_once().await.unwrap();
    assert_eq!(actions(&decisions), [Action::Retried]);
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2);
    w.restart().await;
    let settled = w.call(charge(4900).call_id("toolu_3")).await;
    assert_eq!(settled.class(), Some(OutcomeClass::Completed));
    assert!(settled.replayed());
    assert_eq!(charge_id(&settled), w.payments.charges()[0].id);
}
