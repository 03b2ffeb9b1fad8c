//! A person's decisions on a timed-out write. A completed one whose output nests deeper than
//! a record keeps is refused, changing nothing. A release is held to the reconciler's rule: while the
//! send may still commit downstream, a plain release is refused (the key stays claimed, a
//! repeat does not run the handler); a forced one frees it and the trace says it was forced,
//! and why. And when the send does commit after a forced release, the effect is recorded
//! again (the key is not left free for a second one) and the person hears of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::reconcile::{resolve_as, resolve_in, Resolution, ResolveError};
use idem_runtime::{
    call::ToolCall,
    escalation::{CallbackSink, Escalation},
    outcome::OutcomeClass,
    registry::{Registry, RetryPolicy},
    store::{
        AttemptKind, IdemStore, ManualClock, MemoryStore, RecordState, ReleaseNote, Timestamp,
    },
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::json;

const START: Timestamp = Timestamp(1_800_000_000_000);

/// How long after its start `SlowCharge`'s send may still land, by the tool's rule: its
/// timeout (1 s) plus twice its declared in-flight bound (2 h).
const MAY_LAND_FOR: Duration = Duration::from_secs(1 + 2 * 2 * 3600);

#[derive(Default)]
struct Bank {
    /// Requests the handler received.
    requests: Mutex<u32>,
    /// Charges committed.
    ledger: Mutex<Vec<String>>,
}

/// Times out (1 s) and commits an hour later, inside the two hours it declares its
/// downstream may take (undeclared, its handler would be dropped after the default bound).
struct SlowCharge(Arc<Bank>);

impl WriteTool for SlowCharge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .timeout(Duration::from_secs(1))
            .in_flight_bound(Duration::from_secs(2 * 3600))
    }
    async fn call(&self, ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
        *self.0.requests.lock().unwrap() += 1;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        self.0.ledger.lock().unwrap().push(ctx.key().to_string());
        Ok("ch_1".into())
    }
}

struct World {
    bank: Arc<Bank>,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    registry: Registry,
    /// The escalations the registry's sink received.
    notices: Arc<Mutex<Vec<Escalation>>>,
}

fn world() -> World {
    let bank = Arc::new(Bank::default());
    let clock = ManualClock::new(START);
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let notices: Arc<Mutex<Vec<Escalation>>> = Arc::default();
    let seen = notices.clone();
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(Arc::new(clock.clone()))
        .retry_policy(RetryPolicy::never())
        .escalation_sink(Arc::new(CallbackSink(move |e: &Escalation| {
            seen.lock().unwrap().push(e.clone())
        })))
        .tool(SlowCharge(bank.clone()))
        .build()
        .unwrap();
    World {
        bank,
        store,
        clock,
        registry,
        notices,
    }
}

fn charge() -> ToolCall {
    ToolCall::new("run", "charge", json!({"cents": 4900})).intent("order-1")
}

#[tokio::test(start_paused = true)]
async fn a_release_inside_the_in_flight_bound_is_refused_and_frees_nothing() {
    let w = world();
    let first = w.registry.call(charge()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().unwrap().clone();
    let before = w.store.get(&key).await.unwrap().unwrap();

    let refused = resolve_in(
        &w.registry,
        &key,
        Resolution::Release,
        "ops",
        "not in the ledger",
    )
    .await
    .unwrap_err();
    let until = START.plus(MAY_LAND_FOR);
    match &refused {
        ResolveError::MayStillLand { until: u, .. } => assert_eq!(*u, until),
        other => panic!("not refused for the bound: {other}"),
    }
    assert!(
        refused.to_string().contains(&until.to_string()),
        "{refused}"
    );
    // Without the registry, the largest defaults: refused all the same.
    assert!(matches!(
        resolve_as(
            &*w.store,
            &key,
            Resolution::Release,
            "ops",
            "not in the ledger"
        )
        .await,
        Err(ResolveError::MayStillLand { .. })
    ));
    // A forced release with nothing said for it frees nothing either.
    let no_reason = Resolution::ForceRelease { reason: " ".into() };
    assert!(matches!(
        resolve_in(&w.registry, &key, no_reason, "ops", "").await,
        Err(ResolveError::NoReason)
    ));

    assert_eq!(w.store.get(&key).await.unwrap().as_ref(), Some(&before));
    assert!(w.store.releases(&key).await.unwrap().is_empty());
    // The key is still claimed: a repeat does not send again.
    let _ = w.registry.call(charge()).await;
    assert_eq!(*w.bank.requests.lock().unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_forced_release_frees_the_key_and_its_trace_says_why() {
    let w = world();
    let first = w.registry.call(charge()).await;
    let key = first.key().unwrap().clone();
    let reason = "the bank says request 77 was dropped at its gateway";
    resolve_in(
        &w.registry,
        &key,
        Resolution::ForceRelease {
            reason: reason.into(),
        },
        "ops",
        "not in the ledger",
    )
    .await
    .unwrap();
    assert_eq!(w.store.get(&key).await.unwrap(), None);
    let releases = w.store.releases(&key).await.unwrap();
    assert_eq!(releases.len(), 1);
    let trace = &releases[0];
    assert_eq!(trace.by, "ops");
    assert!(ReleaseNote::is_forced(&trace.note), "{}", trace.note);
    assert!(trace.note.contains(reason), "{}", trace.note);
    assert!(trace.note.contains("not in the ledger"), "{}", trace.note);
    let until = START.plus(MAY_LAND_FOR);
    assert!(trace.note.contains(&until.to_string()), "{}", trace.note);
}

#[tokio::test(start_paused = true)]
async fn a_release_after_the_bound_frees_the_key_unforced() {
    let w = world();
    let first = w.registry.call(charge()).await;
    let key = first.key().unwrap().clone();
    w.clock.advance(MAY_LAND_FOR);
    resolve_in(
        &w.registry,
        &key,
        Resolution::Release,
        "ops",
        "not in the ledger",
    )
    .await
    .unwrap();
    assert_eq!(w.store.get(&key).await.unwrap(), None);
    let releases = w.store.releases(&key).await.unwrap();
    assert_eq!(releases[0].note, "not in the ledger");
}

#[tokio::test(start_paused = true)]
async fn a_late_result_after_a_forced_release_is_recorded_again_and_reported() {
    let w = world();
    let first = w.registry.call(charge()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().unwrap().clone();

    // A person, seeing nothing in the ledger yet, frees the key: inside the bound, so only
    // by forcing it.
    let reason = "the bank's log shows no request";
    let force = Resolution::ForceRelease {
        reason: reason.into(),
    };
    resolve_in(&w.registry, &key, force, "ops", "not in the ledger")
        .await
        .unwrap();
    assert_eq!(w.store.get(&key).await.unwrap(), None);

    // The charge lands after all.
    tokio::time::sleep(Duration::from_secs(3700)).await;
    assert_eq!(w.bank.ledger.lock().unwrap().len(), 1);
    let record = w
        .store
        .get(&key)
        .await
        .unwrap()
        .expect("the late result is recorded again");
    assert_eq!(record.state, RecordState::Completed);
    assert!(
        record.attempts.iter().any(|a| a.kind == AttemptKind::Late),
        "{:?}",
        record.attempts
    );
    let notices = w.notices.lock().unwrap().clone();
    assert!(
        notices
            .iter()
            .any(|n| n.reason.contains("after its key was released")),
        "{notices:?}"
    );

    // The model asks again: replayed, not charged twice.
    let again = w.registry.call(charge()).await;
    assert!(again.replayed() && again.is_completed(), "{}", again.text());
    assert_eq!(*w.bank.requests.lock().unwrap(), 1);
    assert_eq!(w.bank.ledger.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_completed_resolution_too_deep_to_keep_is_refused_and_changes_nothing() {
    let w = world();
    let first = w.registry.call(charge()).await;
    let key = first.key().unwrap().clone();
    let before = w.store.get(&key).await.unwrap().unwrap();
    let mut output = json!("ch_1");
    for _ in 0..100 {
        output = serde_json::Value::Array(vec![output]);
    }
    let deep = Resolution::Completed {
        downstream_ref: "ch_1".into(),
        output: Some(output),
    };
    let refused = resolve_in(&w.registry, &key, deep, "ops", "found it").await;
    assert!(
        matches!(refused, Err(ResolveError::OutputTooDeep { limit: 64 })),
        "{refused:?}"
    );
    assert_eq!(w.store.get(&key).await.unwrap().as_ref(), Some(&before));
}
