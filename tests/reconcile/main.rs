//! The reconciler and escalations through the facade, on tools declared with the macro
//! (`downstream = "keyed"`, `window`, `reconcile = …`, `in_flight`), on a manual clock: no
//! test sleeps. Every check is on the bank's ledger of effects (and of sends) or on the
//! store's record. `two_reconcilers`: two workers' reconcilers racing over every durable
//! store.

mod two_reconcilers;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::reconcile::{resolve, Action, Resolution};
use idem::{
    escalation::{CallbackSink, Escalation},
    registry::RetryPolicy,
    store::{ManualClock, Record, RecordState, Timestamp},
    toolbox, IdemKey, IdemStore, MemoryStore, OutcomeClass, ReadBack, ReadBackCtx, Reconciler,
    Registry, ToolCall, ToolError, ToolResult, WriteCtx,
};
use serde_json::json;

const T0: Timestamp = Timestamp(1_800_000_000_000);

#[idem::args]
struct Payment {
    account: String,
    cents: u64,
}

/// What the bank does with the next send.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Commits, and the answer is lost.
    LostAck,
    /// Never reaches the bank; the caller times out.
    Dropped,
    /// Reaches the bank later (`land`), after the caller gave up.
    Late,
}

/// A bank that deduplicates by key only where the tool says it does (`charge`); every send
/// is logged with its key, every effect is on the ledger.
#[derive(Default)]
struct Bank {
    faults: Mutex<VecDeque<Fault>>,
    sends: Mutex<Vec<(String, String)>>,
    ledger: Mutex<Vec<(String, String)>>,
    in_flight: Mutex<Vec<(String, String)>>,
    /// Payouts accepted and not final yet.
    payouts_pending: Mutex<Vec<String>>,
}

impl Bank {
    fn with(faults: impl IntoIterator<Item = Fault>) -> Arc<Bank> {
        Arc::new(Bank {
            faults: Mutex::new(faults.into_iter().collect()),
            ..Bank::default()
        })
    }
    fn ledger(&self) -> Vec<(String, String)> {
        self.ledger.lock().unwrap().clone()
    }
    fn sends(&self) -> Vec<(String, String)> {
        self.sends.lock().unwrap().clone()
    }
    fn found(&self, tool: &str, key: &str) -> bool {
        self.ledger().iter().any(|(t, k)| t == tool && k == key)
    }
    fn land(&self) {
        let landed = std::mem::take(&mut *self.in_flight.lock().unwrap());
        self.ledger.lock().unwrap().extend(landed);
    }
    /// One send of `tool` under `key`: the next fault decides what happens.
    fn send(&self, tool: &str, key: &str, dedupe: bool) -> Result<String, ToolError> {
        let entry = (tool.to_owned(), key.to_owned());
        self.sends.lock().unwrap().push(entry.clone());
        let fault = self.faults.lock().unwrap().pop_front();
        let commit = |entry: (String, String)| {
            let mut ledger = self.ledger.lock().unwrap();
            if !(dedupe && ledger.contains(&entry)) {
                ledger.push(entry);
            }
        };
        match fault {
            None => {
                commit(entry);
                Ok(format!("{tool}_ok"))
            }
            Some(Fault::LostAck) => {
                commit(entry);
                Err(ToolError::unknown(
                    "read timed out after the request was sent",
                ))
            }
            Some(Fault::Dropped) => Err(ToolError::unknown("connect timed out")),
            Some(Fault::Late) => {
                self.in_flight.lock().unwrap().push(entry);
                Err(ToolError::unknown("read timed out"))
            }
        }
    }
}

#[toolbox]
impl Bank {
    /// Send a notice by mail (no key contract, no read-back).
    #[tool(write)]
    async fn notify(&self, ctx: WriteCtx, _args: Payment) -> Result<String, ToolError> {
        self.send("notify", ctx.key().as_str(), false)
    }

    /// Charge through an API that honours idempotency keys for 1 hour.
    #[tool(write, downstream = "keyed", window = "1h")]
    async fn charge(&self, ctx: WriteCtx, _args: Payment) -> Result<String, ToolError> {
        self.send("charge", ctx.key().as_str(), true)
    }

    /// Transfer money (no key contract; found afterwards by the key in its reference).
    #[tool(write, reconcile = find_transfer, in_flight = "2m")]
    async fn transfer(&self, ctx: WriteCtx, _args: Payment) -> Result<String, ToolError> {
        self.send("transfer", ctx.key().as_str(), false)
    }

    /// Not a tool: the transfer's read-back.
    async fn find_transfer(&self, ctx: ReadBackCtx, _args: Payment) -> Result<ReadBack, ToolError> {
        Ok(if self.found("transfer", ctx.key().as_str()) {
            ReadBack::Completed {
                downstream_ref: Some("tr_1".into()),
                output: json!("tr_1"),
            }
        } else {
            ReadBack::NotFound
        })
    }

    /// Reserve funds; the bank confirms later, and there is no way to ask it.
    #[tool(write)]
    async fn reserve(&self, ctx: WriteCtx, _args: Payment) -> Result<String, ToolError> {
        self.send("reserve", ctx.key().as_str(), false)?;
        Err(ToolError::pending("rsv_42"))
    }

    /// Pay out; the bank confirms later.
    #[tool(write, reconcile = find_payout)]
    async fn payout(&self, ctx: WriteCtx, _args: Payment) -> Result<String, ToolError> {
        self.send("payout", ctx.key().as_str(), false)?;
        self.payouts_pending
            .lock()
            .unwrap()
            .push(ctx.key().to_string());
        Err(ToolError::pending("po_1"))
    }

    /// Not a tool: the payout's read-back.
    async fn find_payout(&self, ctx: ReadBackCtx, _args: Payment) -> Result<ReadBack, ToolError> {
        let pending = self
            .payouts_pending
            .lock()
            .unwrap()
            .iter()
            .any(|k| k == ctx.key().as_str());
        Ok(match (pending, ctx.downstream_ref()) {
            (true, Some(r)) => ReadBack::Pending {
                downstream_ref: r.to_owned(),
            },
            (false, Some(r)) => ReadBack::Completed {
                downstream_ref: Some(r.to_owned()),
                output: json!({"payout": r, "status": "paid"}),
            },
            (_, None) => ReadBack::NotFound,
        })
    }
}

struct World {
    bank: Arc<Bank>,
    registry: Registry,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    escalations: Arc<Mutex<Vec<Escalation>>>,
}

impl World {
    fn new(bank: Arc<Bank>) -> World {
        let clock = ManualClock::new(T0);
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let escalations = Arc::new(Mutex::new(Vec::new()));
        let seen = escalations.clone();
        let registry = Registry::builder()
            .shared_store(store.clone())
            .clock(Arc::new(clock.clone()))
            // The executor's own keyed retries would sleep; the reconciler's are the subject.
            .retry_policy(RetryPolicy::never())
            .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
                seen.lock().unwrap().push(e.clone())
            })))
            .toolbox(bank.clone())
            .build()
            .unwrap();
        World {
            bank,
            registry,
            store,
            clock,
            escalations,
        }
    }

    fn call(&self, tool: &str) -> ToolCall {
        ToolCall::new("run-1", tool, json!({"account": "acc_1", "cents": 4900}))
    }

    async fn record(&self, key: &IdemKey) -> Record {
        self.store.get(key).await.unwrap().expect("a record")
    }

    async fn pass(&self) -> Vec<Action> {
        Reconciler::new(&self.registry)
            .run_all()
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.action)
            .collect()
    }
}

fn key(r: &ToolResult) -> IdemKey {
    r.key().cloned().expect("a key")
}

/// An unknown send to a downstream without a key contract is never sent again: not by the
/// executor (even with its default retry policy), not by any number of reconciler passes
/// over days, not by the model's repeats. It goes to a person.
#[tokio::test]
async fn an_unkeyed_unknown_is_never_sent_again() {
    let bank = Bank::with([Fault::LostAck]);
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(Arc::new(clock.clone()))
        .retry_policy(RetryPolicy::default())
        .toolbox(bank.clone())
        .build()
        .unwrap();
    let call = || ToolCall::new("run-1", "notify", json!({"account": "acc_1", "cents": 1}));
    let first = registry.call(call()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    assert_eq!(bank.sends().len(), 1, "the executor did not retry");

    let mut actions = Vec::new();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(24 * 3600));
        actions.extend(
            Reconciler::new(&registry)
                .run_all()
                .await
                .unwrap()
                .into_iter()
                .map(|d| d.action),
        );
        let again = registry.call(call()).await;
        assert!(
            again.is_error() && again.attempts() == 0,
            "{}",
            again.text()
        );
    }
    assert!(!actions.contains(&Action::Retried), "{actions:?}");
    assert_eq!(
        actions,
        [Action::Escalated],
        "escalated once, then left to a person"
    );
    assert_eq!(bank.sends().len(), 1, "sent once in all");
    assert_eq!(bank.ledger().len(), 1);
    let rec = store.get(&key(&first)).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Escalated);
    assert_eq!(rec.attempts.len(), 1);
}

/// A keyed downstream: the reconciler sends again with the same key while the window lasts;
/// once the window has passed, it sends nothing and escalates, with everything a person
/// needs: the intent, the key, every attempt with its times and errors.
#[tokio::test]
async fn a_keyed_unknown_is_retried_with_its_key_inside_the_window_and_escalated_after_it() {
    let w = World::new(Bank::with([Fault::Dropped, Fault::Dropped]));
    let first = w
        .registry
        .call(w.call("charge").intent("order-7-charge"))
        .await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));

    w.clock.advance(Duration::from_secs(10 * 60));
    assert_eq!(w.pass().await, [Action::Retried]);
    let sends = w.bank.sends();
    assert_eq!(sends.len(), 2);
    assert!(
        sends.iter().all(|(_, k)| k == key(&first).as_str()),
        "one key: {sends:?}"
    );
    assert_eq!(w.record(&key(&first)).await.state, RecordState::Unknown);

    // 1 h after the first claim the bank has forgotten the key: no send may go out.
    w.clock.advance(Duration::from_secs(50 * 60));
    assert_eq!(w.pass().await, [Action::Escalated]);
    assert_eq!(w.bank.sends().len(), 2, "nothing sent after the window");
    assert!(w.bank.ledger().is_empty());

    let rec = w.record(&key(&first)).await;
    assert_eq!(rec.state, RecordState::Escalated);
    let escalations = w.escalations.lock().unwrap().clone();
    assert_eq!(escalations.len(), 1);
    let e = &escalations[0];
    assert_eq!(e.key, key(&first));
    assert_eq!(e.tool, "charge");
    assert!(e.reason.contains("window"), "{}", e.reason);
    let op = e.operation.as_ref().expect("the operation");
    assert_eq!(op.intent.as_deref(), Some("order-7-charge"));
    assert_eq!(op.args["cents"], 4900);
    assert_eq!(e.created_at, T0);
    assert_eq!(e.escalated_at, T0.plus(Duration::from_secs(3600)));
    let times: Vec<Timestamp> = e.attempts.iter().map(|a| a.started_at).collect();
    assert_eq!(times, [T0, T0.plus(Duration::from_secs(600))]);
    assert!(
        e.attempts.iter().all(|a| a
            .message
            .as_deref()
            .is_some_and(|m| m.contains("connect timed out"))),
        "{:?}",
        e.attempts
    );
    assert!(e.attempts.iter().all(|a| a.class == OutcomeClass::Unknown));

    // The model asks again: told it is escalated, nothing sent.
    let again = w
        .registry
        .call(w.call("charge").intent("order-7-charge"))
        .await;
    assert_eq!(again.class(), Some(OutcomeClass::Escalated));
    assert_eq!(w.bank.sends().len(), 2);
}

/// A transfer whose request is still on its way: "not found" means "not yet" until the last
/// send's start + timeout + twice the in-flight bound; the effect then lands, the read-back
/// finds it and settles completed. Nothing is sent again in between.
#[tokio::test]
async fn not_found_only_counts_once_the_original_can_no_longer_commit() {
    let w = World::new(Bank::with([Fault::Late]));
    let first = w.registry.call(w.call("transfer")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    // Default timeout 30 s, `in_flight = "2m"`: not found means nothing before 4 m 30 s.
    let limit = Duration::from_secs(30 + 2 * 120);
    w.clock.advance(limit - Duration::from_millis(1));
    assert_eq!(w.pass().await, [Action::Waiting]);
    let rec = w.record(&key(&first)).await;
    assert_eq!(rec.state, RecordState::Unknown);
    assert_eq!(rec.read_backs.len(), 1);
    assert!(
        rec.read_backs[0].result.contains("not found"),
        "{:?}",
        rec.read_backs
    );

    w.bank.land();
    w.clock.advance(Duration::from_millis(2));
    assert_eq!(w.pass().await, [Action::Settled]);
    let rec = w.record(&key(&first)).await;
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.downstream_ref.as_deref(), Some("tr_1"));
    let again = w.registry.call(w.call("transfer")).await;
    assert!(again.replayed() && again.output() == Some(&json!("tr_1")));
    assert_eq!(w.bank.sends().len(), 1);
    assert_eq!(w.bank.ledger().len(), 1);
}

/// The same transfer whose request never arrived: past the bound, "not found" frees the key,
/// and the next call runs it once.
#[tokio::test]
async fn not_found_past_the_bound_frees_the_intent_to_run_once_more() {
    let w = World::new(Bank::with([Fault::Dropped]));
    let first = w.registry.call(w.call("transfer")).await;
    w.clock
        .advance(Duration::from_secs(30 + 2 * 120) + Duration::from_millis(1));
    assert_eq!(w.pass().await, [Action::Released]);
    assert!(w.store.get(&key(&first)).await.unwrap().is_none());
    let rerun = w.registry.call(w.call("transfer")).await;
    assert!(
        rerun.is_completed() && !rerun.replayed(),
        "{}",
        rerun.text()
    );
    assert_eq!(rerun.key(), first.key(), "the same key");
    assert_eq!(w.bank.sends().len(), 2);
    assert_eq!(w.bank.ledger().len(), 1, "one transfer");
    // The release left a trace.
    let releases = w.store.releases(&key(&first)).await.unwrap();
    assert_eq!(releases.len(), 1);
}

/// A pending payout is polled until it is final; the polls that still find it pending do not
/// grow the record, and nothing is sent again.
#[tokio::test]
async fn pending_is_polled_to_terminal() {
    let w = World::new(Bank::with([]));
    let first = w.registry.call(w.call("payout")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    for _ in 0..4 {
        w.clock.advance(Duration::from_secs(60));
        assert_eq!(w.pass().await, [Action::Waiting]);
    }
    let rec = w.record(&key(&first)).await;
    assert_eq!(rec.state, RecordState::Pending);
    assert!(rec.read_backs.len() <= 1, "{:?}", rec.read_backs);

    w.bank.payouts_pending.lock().unwrap().clear();
    w.clock.advance(Duration::from_secs(60));
    assert_eq!(w.pass().await, [Action::Settled]);
    let again = w.registry.call(w.call("payout")).await;
    assert_eq!(
        again.output(),
        Some(&json!({"payout": "po_1", "status": "paid"}))
    );
    assert_eq!(
        w.pass().await,
        Vec::<Action>::new(),
        "nothing left to reconcile"
    );
    assert_eq!(w.bank.sends().len(), 1);
}

/// A person decides an escalated notice failed terminally: every repeat then gets that
/// failure, signed, and nothing is sent. A person who finds another never happened releases
/// it: it runs once more.
#[tokio::test]
async fn a_resolved_escalation_is_what_repeats_see() {
    let w = World::new(Bank::with([Fault::LostAck, Fault::Dropped]));
    let a = w.registry.call(w.call("notify")).await;
    let b = w
        .registry
        .call(ToolCall::new(
            "run-1",
            "notify",
            json!({"account": "acc_2", "cents": 1}),
        ))
        .await;
    assert_eq!(w.pass().await, [Action::Escalated, Action::Escalated]);

    let store: &dyn IdemStore = w.store.as_ref();
    resolve(
        store,
        &key(&a),
        Resolution::Failed {
            reason: "bounced: mailbox full".into(),
        },
        "seen in the mail log",
    )
    .await
    .unwrap();
    let again = w.registry.call(w.call("notify")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Failed));
    assert!(again.replayed());
    assert!(again.text().contains("mailbox full"), "{}", again.text());

    resolve(
        store,
        &key(&b),
        // Sent just now: only a forced release frees it inside the in-flight bound.
        Resolution::ForceRelease {
            reason: "the mail provider never accepted it".into(),
        },
        "not in the mail log",
    )
    .await
    .unwrap();
    let rerun = w
        .registry
        .call(ToolCall::new(
            "run-1",
            "notify",
            json!({"account": "acc_2", "cents": 1}),
        ))
        .await;
    assert!(
        rerun.is_completed() && !rerun.replayed(),
        "{}",
        rerun.text()
    );
    assert_eq!(w.bank.sends().len(), 3);
    assert_eq!(w.bank.ledger().len(), 2, "one notice each");
    // A decided record is not decided again.
    assert!(
        resolve(store, &key(&a), Resolution::Release, "changed my mind")
            .await
            .is_err()
    );
    assert_eq!(w.record(&key(&a)).await.state, RecordState::Failed);
}

/// A pending record nothing can poll goes to a person with the downstream's reference for
/// it, so the person knows where to look; nothing is sent again.
#[tokio::test]
async fn an_escalated_pending_record_carries_its_downstream_ref() {
    let w = World::new(Bank::with([]));
    let first = w.registry.call(w.call("reserve")).await;
    assert_eq!(first.class(), Some(OutcomeClass::Pending));
    assert_eq!(w.pass().await, [Action::Escalated]);
    let e = w.escalations.lock().unwrap()[0].clone();
    assert_eq!(e.key, key(&first));
    assert_eq!(e.downstream_ref.as_deref(), Some("rsv_42"));
    assert_eq!(e.attempts.len(), 1);
    assert_eq!(e.attempts[0].class, OutcomeClass::Pending);
    let rec = w.record(&key(&first)).await;
    assert_eq!(rec.state, RecordState::Escalated);
    assert_eq!(rec.downstream_ref.as_deref(), Some("rsv_42"));
    let again = w.registry.call(w.call("reserve")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Escalated));
    assert_eq!(w.bank.sends().len(), 1);
}
