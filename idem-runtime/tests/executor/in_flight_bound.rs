//! Every write tool has an in-flight bound: a timed-out handler that never finishes is
//! dropped that long after its timeout (the declared bound, else the registry's default,
//! else `default_in_flight_bound` of the timeout), the record says so in an `Abandoned`
//! attempt and stays unknown, and the reconciler waits for the same bound.
//!
//! Time is tokio's paused clock, with the store and the registry on a `TokioClock`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{AttemptKind, Timestamp, TokioClock};
use idem_runtime::tool::default_in_flight_bound;
use idem_runtime::{
    call::ToolCall,
    identity::IdemKey,
    outcome::OutcomeClass,
    reconcile::{Action, Reconciler},
    registry::{Registry, RegistryBuilder},
    store::{IdemStore, MemoryStore, Record, RecordState},
    tool::{ReadBack, ReadBackCtx, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(1);

/// Sets its flag when the handler's future is dropped.
struct DropGuard(Arc<AtomicBool>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A handler that never finishes; `dropped` says whether the executor let go of it.
struct Stuck {
    spec: ToolSpec,
    dropped: Arc<AtomicBool>,
    sends: Arc<AtomicU32>,
}

impl WriteTool for Stuck {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<String, ToolError> {
        let _guard = DropGuard(self.dropped.clone());
        self.sends.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        unreachable!("a pending future never resolves")
    }
    async fn read_back(&self, _ctx: ReadBackCtx, _args: Self::Args) -> Result<ReadBack, ToolError> {
        Ok(ReadBack::NotFound)
    }
}

struct World {
    registry: Registry,
    store: Arc<MemoryStore>,
    dropped: Arc<AtomicBool>,
    sends: Arc<AtomicU32>,
}

fn world(spec: ToolSpec, builder: impl FnOnce(RegistryBuilder) -> RegistryBuilder) -> World {
    let clock = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let store = Arc::new(MemoryStore::with_clock(clock));
    let dropped = Arc::new(AtomicBool::new(false));
    let sends = Arc::new(AtomicU32::new(0));
    let registry = builder(Registry::builder().shared_store(store.clone()))
        .tool(Stuck {
            spec,
            dropped: dropped.clone(),
            sends: sends.clone(),
        })
        .build()
        .unwrap();
    World {
        registry,
        store,
        dropped,
        sends,
    }
}

fn charge() -> ToolSpec {
    ToolSpec::new("charge").timeout(TIMEOUT)
}

impl World {
    /// Calls the tool, which times out after `TIMEOUT`: the record is unknown.
    async fn call_times_out(&self) -> IdemKey {
        let r = self
            .registry
            .call(ToolCall::new("run-1", "charge", json!({})))
            .await;
        assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{}", r.text());
        assert!(!self.dropped(), "dropped at its timeout already");
        r.key().unwrap().clone()
    }

    fn dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }

    async fn record(&self, key: &IdemKey) -> Record {
        self.store
            .get(key)
            .await
            .unwrap()
            .expect("the record is kept")
    }

    /// The record once the watcher has written what it saw (it runs on its own task).
    async fn record_with_abandonment(&self, key: &IdemKey) -> Record {
        for _ in 0..100 {
            let record = self.record(key).await;
            if record
                .attempts
                .iter()
                .any(|a| a.kind == AttemptKind::Abandoned)
            {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "no abandonment recorded: {:?}",
            self.record(key).await.attempts
        );
    }

    /// Asserts the handler is still held just before `bound` has passed after its
    /// timeout, and dropped just after; returns the record then.
    async fn dropped_at(&self, key: &IdemKey, bound: Duration) -> Record {
        // The call returned at the timeout; the watcher's bound runs from there.
        tokio::time::sleep(bound - Duration::from_millis(500)).await;
        assert!(!self.dropped(), "dropped before its bound {bound:?}");
        assert_eq!(self.record(key).await.attempts.len(), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(self.dropped(), "still held past its bound {bound:?}");
        self.record_with_abandonment(key).await
    }
}

/// The record holds the attempt that timed out and the abandonment of that same attempt,
/// and is still unknown: nothing says whether what the handler sent landed.
fn assert_abandoned_and_unknown(record: &Record) {
    assert_eq!(record.state, RecordState::Unknown, "{record:?}");
    let kinds: Vec<_> = record
        .attempts
        .iter()
        .map(|a| (a.attempt, a.kind))
        .collect();
    assert_eq!(
        kinds,
        [(1, AttemptKind::TimedOut), (1, AttemptKind::Abandoned)],
        "{:?}",
        record.attempts
    );
    let abandoned = &record.attempts[1];
    assert_eq!(abandoned.class, OutcomeClass::Unknown);
    assert!(abandoned.finished_at > record.attempts[0].finished_at);
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_never_finishes_is_dropped_at_the_default_bound() {
    let w = world(charge(), |b| b);
    let key = w.call_times_out().await;
    let bound = default_in_flight_bound(TIMEOUT);
    assert_eq!(
        bound,
        Duration::from_secs(120),
        "the floor, for a 1 s timeout"
    );
    let record = w.dropped_at(&key, bound).await;
    assert_abandoned_and_unknown(&record);
    // Still unknown for repeats: nothing was sent again.
    let again = w
        .registry
        .call(ToolCall::new("run-1", "charge", json!({})))
        .await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert_eq!(w.sends.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_declared_bound_overrides_the_default() {
    let bound = Duration::from_secs(5);
    let w = world(charge().in_flight_bound(bound), |b| b);
    let key = w.call_times_out().await;
    let record = w.dropped_at(&key, bound).await;
    assert_abandoned_and_unknown(&record);
}

#[tokio::test(start_paused = true)]
async fn the_registry_default_applies_to_tools_that_declare_none() {
    let bound = Duration::from_secs(10);
    let w = world(charge(), |b| b.default_in_flight_bound(bound));
    let key = w.call_times_out().await;
    let record = w.dropped_at(&key, bound).await;
    assert_abandoned_and_unknown(&record);
}

#[tokio::test(start_paused = true)]
async fn a_declared_bound_overrides_the_registry_default() {
    let bound = Duration::from_secs(3);
    let w = world(charge().in_flight_bound(bound), |b| {
        b.default_in_flight_bound(Duration::from_secs(600))
    });
    let key = w.call_times_out().await;
    let record = w.dropped_at(&key, bound).await;
    assert_abandoned_and_unknown(&record);
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_waits_for_the_default_bound_and_no_longer() {
    // No bound declared, none set on the registry: the reconciler holds the tool to the
    // same default bound (2 min) the executor dropped its handler at.
    let w = world(charge(), |b| b);
    let key = w.call_times_out().await;
    let reconciler = Reconciler::new(&w.registry);
    let actions = |d: Vec<idem_runtime::reconcile::Decision>| {
        d.into_iter().map(|d| d.action).collect::<Vec<_>>()
    };

    // Inside the bound: the handler may still report, so the read-back is not asked yet.
    tokio::time::sleep(Duration::from_secs(119)).await;
    assert_eq!(
        actions(reconciler.run_once().await.unwrap()),
        [Action::Waiting]
    );
    assert!(
        w.record(&key).await.read_backs.is_empty(),
        "read back too early"
    );

    // Past it: the handler was dropped; "not found" is noted, but the send may still land
    // downstream until start + timeout + twice the bound (1 s + 240 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(w.dropped());
    assert_eq!(
        actions(reconciler.run_once().await.unwrap()),
        [Action::Waiting]
    );
    let record = w.record_with_abandonment(&key).await;
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(record.read_backs.len(), 1);
    assert_eq!(record.read_backs[0].result, "not found");

    // 241 s after the send: nothing found, and by the default bound nothing can land any
    // more; but nobody declared that bound, so the key is not freed on it: a person decides.
    tokio::time::sleep(Duration::from_secs(120)).await; // t = 242 s
    assert_eq!(
        actions(reconciler.run_once().await.unwrap()),
        [Action::Escalated]
    );
    assert_eq!(w.record(&key).await.state, RecordState::Escalated);
    assert_eq!(w.sends.load(Ordering::SeqCst), 1);
}

/// `Duration::MAX` reads as "never abandon": it must not overflow the watcher's deadline
/// (a panic inside `Registry::call` would leave the claim running with nobody told).
#[tokio::test(start_paused = true)]
async fn an_unbounded_declaration_never_drops_the_handler_and_never_panics() {
    for (declared, registry_default) in [(Some(Duration::MAX), None), (None, Some(Duration::MAX))] {
        let spec = match declared {
            Some(bound) => charge().in_flight_bound(bound),
            None => charge(),
        };
        let w = world(spec, |b| match registry_default {
            Some(bound) => b.default_in_flight_bound(bound),
            None => b,
        });
        let key = w.call_times_out().await;
        tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
        assert!(!w.dropped(), "kept running: no bound was set");
        let record = w.record(&key).await;
        assert_eq!(record.state, RecordState::Unknown);
        assert!(record
            .attempts
            .iter()
            .all(|a| a.kind != AttemptKind::Abandoned));
    }
}
