//! The outcome test matrix that every change keeps green: one test
//! per row, each against the Stripe-like stub in `idem_test::payments` behind its faulty
//! proxy.
//!
//! Every test asserts first on the service's objects — how many charges or refunds exist,
//! how many requests reached it — because that is what happened; the outcome class the
//! tool reported comes second. Time is tokio's paused clock (idem's store reads it too), so
//! timeouts, leases and a 25-hour wait cost nothing and always interleave the same way.
//! Rows whose record the executor leaves unsettled (still pending, no key contract, crash)
//! go on with one pass of the `Reconciler` and check what it did to the ledger too.
//!
//! `stub_contract` at the end pins the stub's own contract (A)–(E) and the proxy's faults:
//! a matrix against a wrong stub would prove nothing.

use std::sync::Arc;
use std::time::Duration;

use idem::reconcile::Action;
use idem::store::Clock;
use idem::{
    store::RecordState, CallError, IdemStore, MemoryStore, Outcome, OutcomeClass, Reconciler,
    Registry, ToolCall,
};
use idem_test::payments::{
    Keys, Leg, Misstep, Payments, Proxy, RefundStatus, STRIPE_KEY_RETENTION,
};
use idem_test::tools::TOOL_TIMEOUT;
use serde_json::json;

use crate::world::{actions, charge, charge_id, clock, registry, service, HOUR, RUN};

/// One service, its proxy, and an agent process (registry) on a store that outlives it.
struct World {
    payments: Payments,
    proxy: Proxy,
    clock: Arc<dyn Clock>,
    store: Arc<dyn IdemStore>,
    keys: Keys,
    registry: Registry,
}

impl World {
    fn new(keys: Keys) -> Self {
        let (payments, proxy) = service(keys);
        let clock = clock();
        let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
        let registry = registry(&proxy, &clock, store.clone(), keys);
        World {
            payments,
            proxy,
            clock,
            store,
            keys,
            registry,
        }
    }

    /// The process restarts: a new registry on the same (durable) store.
    fn restart(&self) -> Registry {
        registry(&self.proxy, &self.clock, self.store.clone(), self.keys)
    }

    fn charges(&self) -> usize {
        self.payments.charges().len()
    }
}

#[tokio::test(start_paused = true)]
async fn rejected_before_execution() {
    let w = World::new(Keys::Honoured);
    w.payments.script(Misstep::RejectBeforeExecution);

    let rejected = w.registry.call(charge(4900)).await;
    assert_eq!(
        w.charges(),
        0,
        "a request refused before execution creates nothing"
    );
    assert_eq!(rejected.class(), Some(OutcomeClass::Rejected));

    // The claim was released, not kept: the same intent may run again, and does.
    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(again.class(), Some(OutcomeClass::Completed));
    assert!(!again.replayed());
}

#[tokio::test(start_paused = true)]
async fn unavailable_twice_then_served() {
    let w = World::new(Keys::Honoured);
    let retry_after = Duration::from_secs(2);
    w.payments.script(Misstep::Unavailable(retry_after));
    w.payments.script(Misstep::Unavailable(retry_after));

    let call = tokio::spawn({
        let registry = w.registry.clone();
        async move { registry.call(charge(4900)).await }
    });
    // Just before the second Retry-After has passed (the default backoff alone would have
    // sent twice more by now): two requests turned away, nothing sent again yet.
    tokio::time::sleep(retry_after * 2 - Duration::from_millis(100)).await;
    assert_eq!(
        w.payments.requests(),
        2,
        "not sent again before Retry-After"
    );
    assert_eq!(w.charges(), 0, "a 503 executes nothing");

    let result = call.await.expect("the call task ends");
    assert_eq!(w.charges(), 1, "charged once, by the third request");
    assert_eq!(w.payments.requests(), 3);
    assert_eq!(result.class(), Some(OutcomeClass::Completed));
    assert_eq!(result.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn unavailable_past_the_budget_then_a_later_call() {
    let w = World::new(Keys::Honoured);
    // Asked to wait 20 s twice: a second pause would end 40 s in, past the 30 s budget.
    let retry_after = Duration::from_secs(20);
    w.payments.script(Misstep::Unavailable(retry_after));
    w.payments.script(Misstep::Unavailable(retry_after));

    let result = w.registry.call(charge(4900)).await;
    assert_eq!(w.charges(), 0, "nothing was done");
    assert_eq!(
        w.payments.requests(),
        2,
        "asked again once, within the budget"
    );
    assert_eq!(result.class(), Some(OutcomeClass::Unavailable));
    let key = result.key().expect("a write has a key");
    assert!(
        w.store.get(key).await.unwrap().is_none(),
        "the claim is released, not kept"
    );

    // The model calls again later: the same intent runs, once.
    tokio::time::sleep(retry_after).await;
    let later = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 3);
    assert_eq!(later.class(), Some(OutcomeClass::Completed));
    assert!(!later.replayed());
}

#[tokio::test(start_paused = true)]
async fn response_lost_after_commit() {
    let w = World::new(Keys::Honoured);
    w.proxy.then(Leg::DropResponse);

    let result = w.registry.call(charge(4900)).await;

    // The executor timed out, retried with the same key, and the service replayed the charge
    // it had made: two requests, one charge.
    let charges = w.payments.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert_eq!(result.class(), Some(OutcomeClass::Completed));
    assert_eq!(result.attempts(), 2);
    assert_eq!(charge_id(&result), charges[0].id);
}

#[tokio::test(start_paused = true)]
async fn still_pending() {
    let w = World::new(Keys::Honoured);
    let charged = w.registry.call(charge(4900)).await;
    let refund = |call_id: &str| {
        ToolCall::new(
            RUN,
            "refund",
            json!({ "charge": charge_id(&charged), "amount": 4900 }),
        )
        .call_id(call_id)
    };

    let first = w.registry.call(refund("toolu_2")).await;
    let refunds = w.payments.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].status, RefundStatus::Pending);
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    assert!(
        matches!(first.outcome(), Some(Outcome::Pending { downstream_ref, .. }) if *downstream_ref == refunds[0].id)
    );

    // Asked again while pending: "pending, not sent again".
    let again = w.registry.call(refund("toolu_3")).await;
    assert_eq!(w.payments.refunds().len(), 1);
    assert_eq!(again.class(), Some(OutcomeClass::Pending));
    assert!(again.replayed());

    // The reconciler polls it; still pending downstream, so it waits and sends nothing.
    let reconciler = Reconciler::new(&w.registry);
    let decisions = reconciler.run_once().await.unwrap();
    assert_eq!(w.payments.refunds().len(), 1);
    assert_eq!(actions(&decisions), [Action::Waiting]);

    // The bank answers; the next poll settles the record from the read-back.
    w.payments
        .finish_refund(&refunds[0].id, RefundStatus::Succeeded)
        .expect("the refund was pending");
    let decisions = reconciler.run_once().await.unwrap();
    assert_eq!(actions(&decisions), [Action::Settled]);
    let settled = w.registry.call(refund("toolu_4")).await;
    assert_eq!(w.payments.refunds().len(), 1);
    assert_eq!(w.payments.requests(), 2, "one charge, one refund request");
    assert_eq!(settled.class(), Some(OutcomeClass::Completed));
    assert!(settled.replayed());
    assert_eq!(settled.output().unwrap()["status"], "succeeded");
}

#[tokio::test(start_paused = true)]
async fn original_still_running_past_the_timeout_then_commits() {
    let w = World::new(Keys::Honoured);
    // The service takes three timeouts to commit the first request.
    w.payments.script(Misstep::Slow(TOOL_TIMEOUT * 3));

    let result = w.registry.call(charge(4900)).await;
    // The first attempt timed out; each retry with the same key met the running original
    // (409). Nothing has committed yet, and nobody can know it will: unknown, not failed.
    assert_eq!(w.charges(), 0);
    assert_eq!(w.payments.requests(), 3);
    assert_eq!(result.class(), Some(OutcomeClass::Unknown));

    // The original commits, then everything in flight has an hour to land.
    w.payments.created(1).await;
    tokio::time::sleep(HOUR).await;
    let charges = w.payments.charges();
    assert_eq!(charges.len(), 1);

    // The original's late result settled the record; a repeat replays it and sends nothing.
    let repeat = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 3);
    assert_eq!(repeat.class(), Some(OutcomeClass::Completed));
    assert!(repeat.replayed());
    assert_eq!(charge_id(&repeat), charges[0].id);
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates() {
    let w = World::new(Keys::Honoured);
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..8 {
        let registry = w.registry.clone();
        workers.spawn(async move {
            registry
                .call(charge(4900).call_id(format!("toolu_{i}")))
                .await
        });
    }
    let results = workers.join_all().await;

    let charges = w.payments.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(
        w.payments.requests(),
        1,
        "the duplicates never reached the service"
    );
    for r in &results {
        assert_eq!(r.class(), Some(OutcomeClass::Completed), "{r:?}");
        assert_eq!(charge_id(r), charges[0].id);
    }
    assert_eq!(results.iter().filter(|r| !r.replayed()).count(), 1);
}

#[tokio::test(start_paused = true)]
async fn same_key_changed_params() {
    let w = World::new(Keys::Honoured);
    let first = w.registry.call(charge(4900).intent("order-7")).await;
    let changed = w
        .registry
        .call(charge(9900).intent("order-7").call_id("toolu_2"))
        .await;

    let charges = w.payments.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].amount, 4900);
    assert_eq!(
        w.payments.requests(),
        1,
        "the changed call never reached the service"
    );
    assert_eq!(first.class(), Some(OutcomeClass::Completed));
    assert!(
        matches!(changed.error(), Some(CallError::ChangedParams { key }) if Some(key) == first.key()),
        "{changed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_key_expiry() {
    let w = World::new(Keys::Honoured);
    let first = w.registry.call(charge(4900)).await;
    let key = first.key().expect("a write has a key").clone();
    assert_eq!(w.charges(), 1);

    // A day and an hour later both the service's key and idem's saved result are gone.
    tokio::time::sleep(STRIPE_KEY_RETENTION + HOUR).await;
    assert!(
        !w.payments.remembers_key(key.as_str()),
        "precondition: the service would execute this key again"
    );

    let retry = w.registry.call(charge(4900).call_id("toolu_2")).await;
    // idem's tombstone outlives the result: "already done", never a second charge.
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(
        retry.outcome(),
        Some(&Outcome::ResultExpired {
            was: OutcomeClass::Completed
        })
    );
    assert!(retry.replayed());
}

#[tokio::test(start_paused = true)]
async fn two_intended_actions_with_equal_params() {
    let w = World::new(Keys::Honoured);
    // Two orders of the same amount: equal arguments, two intents minted by the caller.
    let a = w.registry.call(charge(4900).intent("order-1")).await;
    let b = w.registry.call(charge(4900).intent("order-2")).await;
    // Each one asked again.
    let a_again = w
        .registry
        .call(charge(4900).intent("order-1").call_id("toolu_2"))
        .await;
    let b_again = w
        .registry
        .call(charge(4900).intent("order-2").call_id("toolu_3"))
        .await;

    assert_eq!(
        w.charges(),
        2,
        "two intended actions are two charges, not one"
    );
    assert_eq!(w.payments.requests(), 2);
    assert_ne!(a.key(), b.key());
    assert_ne!(charge_id(&a), charge_id(&b));
    assert_eq!(charge_id(&a_again), charge_id(&a));
    assert_eq!(charge_id(&b_again), charge_id(&b));
    assert!(a_again.replayed() && b_again.replayed());
}

#[tokio::test(start_paused = true)]
async fn downstream_with_no_key_contract() {
    let w = World::new(Keys::Ignored);
    w.proxy.then(Leg::DropResponse);

    let result = w.registry.call(charge(4900)).await;
    // A retry would charge again (the service ignores keys), so the executor never retries
    // an unkeyed write: the outcome stays unknown.
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(result.class(), Some(OutcomeClass::Unknown));
    assert_eq!(result.attempts(), 1);

    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    tokio::time::sleep(HOUR).await;
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert!(again.replayed());

    // No key contract and no read-back: the reconciler cannot settle it without risking a
    // second charge, so it hands it to a person.
    let decisions = Reconciler::new(&w.registry).run_once().await.unwrap();
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(actions(&decisions), [Action::Escalated]);
    let escalated = w.registry.call(charge(4900).call_id("toolu_3")).await;
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(escalated.class(), Some(OutcomeClass::Escalated));
}

#[tokio::test(start_paused = true)]
async fn model_reissues_the_call_with_a_new_tool_use_id() {
    let w = World::new(Keys::Honoured);
    let first = w.registry.call(charge(4900)).await;
    // Next turn the model calls again: a new tool_use_id, the fields in another order.
    let reissued = w
        .registry
        .call(
            ToolCall::from_json(RUN, "charge", r#"{"amount": 4900, "customer": "acme"}"#)
                .call_id("toolu_9"),
        )
        .await;

    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(reissued.class(), Some(OutcomeClass::Completed));
    assert!(reissued.replayed());
    assert_eq!(reissued.key(), first.key());
    assert_eq!(charge_id(&reissued), charge_id(&first));
}

#[tokio::test(start_paused = true)]
async fn crash_between_claim_and_complete_then_restart() {
    let w = World::new(Keys::Honoured);
    // The worker is still waiting for its response when it dies.
    w.proxy.then(Leg::DropResponse);
    let worker = {
        let registry = w.registry.clone();
        tokio::spawn(async move { registry.call(charge(4900)).await })
    };
    w.payments.created(1).await;
    worker.abort();
    assert!(worker
        .await
        .expect_err("the worker was killed")
        .is_cancelled());

    // It comes back after its claim's lease (timeout + 30 s) has passed, and is asked again.
    tokio::time::sleep(TOOL_TIMEOUT + Duration::from_secs(60)).await;
    let restarted = w.restart();
    let result = restarted.call(charge(4900)).await;

    // The dead worker's claim became unknown, never free: the charge is not sent again.
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 1);
    assert_eq!(result.class(), Some(OutcomeClass::Unknown));
    assert!(result.replayed());
    let key = result.key().expect("a write has a key");
    let record = w.store.get(key).await.unwrap().expect("the claim is kept");
    assert_eq!(record.state, RecordState::Unknown);

    // The reconciler retries with the same key; the service replays the charge it made.
    let decisions = Reconciler::new(&restarted).run_once().await.unwrap();
    assert_eq!(w.charges(), 1);
    assert_eq!(w.payments.requests(), 2);
    assert_eq!(actions(&decisions), [Action::Retried]);
    let settled = restarted.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(settled.class(), Some(OutcomeClass::Completed));
    assert_eq!(charge_id(&settled), w.payments.charges()[0].id);
}

/// The stub's own contract. If one of these fails, the matrix above proves nothing.
mod stub_contract {
    use super::*;
    use idem_test::payments::{Object, Request};

    fn create(amount: u64) -> Request {
        Request::CreateCharge {
            customer: "acme".into(),
            amount,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_same_key_and_params_replay_the_saved_response_server_errors_included() {
        let p = Payments::new();
        let first = p.handle(Some("k1"), create(4900)).await.unwrap();
        let again = p.handle(Some("k1"), create(4900)).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(p.charges().len(), 1);

        p.script(Misstep::ErrorAfterCommit);
        let error = p.handle(Some("k2"), create(4900)).await.unwrap_err();
        assert_eq!(error.status, 500);
        let replayed = p.handle(Some("k2"), create(4900)).await.unwrap_err();
        assert_eq!(replayed, error);
        assert_eq!(
            p.charges().len(),
            2,
            "the 500 came after a charge; its replay adds none"
        );

        // Refused before execution: nothing saved, so the key executes next time.
        p.script(Misstep::RejectBeforeExecution);
        assert_eq!(
            p.handle(Some("k3"), create(4900)).await.unwrap_err().status,
            429
        );
        assert!(p.handle(Some("k3"), create(4900)).await.is_ok());
        assert_eq!(p.charges().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn b_same_key_while_executing_conflicts_and_is_not_saved() {
        let p = Payments::new();
        p.script(Misstep::Slow(Duration::from_secs(5)));
        let original = tokio::spawn({
            let p = p.clone();
            async move { p.handle(Some("k"), create(4900)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let conflict = p.handle(Some("k"), create(4900)).await.unwrap_err();
        assert_eq!(conflict.status, 409);

        let original = original.await.unwrap().unwrap();
        let after = p.handle(Some("k"), create(4900)).await.unwrap();
        assert_eq!(after, original, "the 409 was not saved under the key");
        assert_eq!(p.charges().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn c_same_key_other_params_is_refused() {
        let p = Payments::new();
        p.handle(Some("k"), create(4900)).await.unwrap();
        let refused = p.handle(Some("k"), create(9900)).await.unwrap_err();
        assert_eq!((refused.status, refused.kind), (400, "idempotency_error"));
        assert_eq!(p.charges().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn d_keys_are_pruned_after_the_retention() {
        let p = Payments::with(Keys::Honoured, HOUR);
        p.handle(Some("k"), create(4900)).await.unwrap();
        tokio::time::sleep(HOUR / 2).await;
        p.handle(Some("k"), create(4900)).await.unwrap();
        assert_eq!(p.charges().len(), 1, "within the retention: replayed");

        tokio::time::sleep(HOUR).await;
        assert!(!p.remembers_key("k"));
        p.handle(Some("k"), create(4900)).await.unwrap();
        assert_eq!(
            p.charges().len(),
            2,
            "after the retention the key executes again"
        );

        // Without a key, or on a service without a key contract, every request executes.
        p.handle(None, create(4900)).await.unwrap();
        let ignoring = Payments::with(Keys::Ignored, HOUR);
        ignoring.handle(Some("k"), create(4900)).await.unwrap();
        ignoring.handle(Some("k"), create(4900)).await.unwrap();
        assert_eq!(p.charges().len(), 3);
        assert_eq!(ignoring.charges().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn e_refunds_are_asynchronous_with_terminal_states() {
        let p = Payments::new();
        let refund = Request::CreateRefund {
            charge: "ch_1".into(),
            amount: 4900,
        };
        let Ok(Object::Refund(created)) = p.handle(Some("r"), refund.clone()).await else {
            panic!("a refund is created");
        };
        assert_eq!(created.status, RefundStatus::Pending);
        p.handle(Some("r"), refund).await.unwrap();
        assert_eq!(p.refunds().len(), 1);

        let done = p
            .finish_refund(&created.id, RefundStatus::Succeeded)
            .unwrap();
        assert_eq!(done.status, RefundStatus::Succeeded);
        assert_eq!(
            p.refund(&created.id).unwrap().status,
            RefundStatus::Succeeded
        );
        assert_eq!(
            p.finish_refund(&created.id, RefundStatus::Failed),
            Err(RefundStatus::Succeeded),
            "a terminal refund never changes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn proxy_drops_and_delays() {
        let patience = Duration::from_secs(30);
        let proxy = Proxy::new(Payments::new());
        let send = |key: &'static str| {
            let proxy = proxy.clone();
            async move { tokio::time::timeout(patience, proxy.send(Some(key), create(4900))).await }
        };

        proxy.then(Leg::DropRequest);
        assert!(
            send("k1").await.is_err(),
            "a dropped request is never answered"
        );
        assert_eq!(proxy.payments().charges().len(), 0, "…and never executed");

        proxy.then(Leg::DropResponse);
        assert!(
            send("k2").await.is_err(),
            "a dropped response is never answered"
        );
        assert_eq!(
            proxy.payments().charges().len(),
            1,
            "…but the request executed"
        );

        proxy.then(Leg::DelayResponse(patience * 2));
        assert!(send("k3").await.is_err());
        assert_eq!(proxy.payments().charges().len(), 2);

        proxy.then(Leg::DelayRequest(patience * 2));
        assert!(send("k4").await.is_err());
        assert_eq!(
            proxy.payments().charges().len(),
            2,
            "the request has not arrived yet"
        );
        tokio::time::sleep(patience * 2).await;
        assert_eq!(proxy.payments().charges().len(), 3, "…and then it does");

        assert!(send("k5").await.unwrap().is_ok(), "then the proxy passes");
    }
}
