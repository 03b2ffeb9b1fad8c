//! Two reconcilers over one durable store, each through its own handle (two workers on
//! one SQLite file, one Redis prefix, one Postgres schema): an unknown record is retried
//! once, not twice.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::store::{ManualClock, Record, RecordState, Retention};
use idem::IdemStore;
use idem::{IdemKey, OutcomeClass};
use idem_test::stores::durables;
use serde_json::{json, Value};

const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

/// A keyed downstream: counts every request, keeps one charge per key. Its first request
/// commits and loses the response (the call ends unknown); every later request waits at
/// `gate` before it answers, so a retry is held inside the handler while the other
/// reconciler makes its pass.
struct KeyedCharge {
    requests: Arc<AtomicU64>,
    charges: Arc<std::sync::Mutex<BTreeSet<String>>>,
    gate: Arc<tokio::sync::Semaphore>,
    entered: Arc<tokio::sync::Notify>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct RaceArgs {
    cents: u64,
}

impl idem::tool::WriteTool for KeyedCharge {
    type Args = RaceArgs;
    type Output = Value;

    fn spec(&self) -> idem::tool::ToolSpec {
        idem::tool::ToolSpec::new("charge").downstream(idem::tool::Downstream::Keyed)
    }

    async fn call(&self, ctx: idem::WriteCtx, _args: RaceArgs) -> Result<Value, idem::ToolError> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst);
        self.charges
            .lock()
            .unwrap()
            .insert(ctx.key().as_str().to_owned());
        if n == 0 {
            return Err(idem::ToolError::unknown("response lost"));
        }
        self.entered.notify_one();
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        Ok(json!({"charge": "ch_1"}))
    }
}

/// Two workers' reconcilers (each a registry on its own handle onto one location) race for
/// the same unknown record of a keyed downstream. Exactly one takes it over and retries:
/// two requests in all (the original and one retry), one charge, the record completed. The
/// retry is held inside the handler until the other reconciler's pass is over, so the two
/// passes certainly overlap.
async fn two_reconcilers_retry_once(
    a: Arc<dyn IdemStore>,
    b: Arc<dyn IdemStore>,
    clock: &ManualClock,
) {
    let requests = Arc::new(AtomicU64::new(0));
    let charges = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let tool = || KeyedCharge {
        requests: requests.clone(),
        charges: charges.clone(),
        gate: gate.clone(),
        entered: entered.clone(),
    };
    let registry = |store: Arc<dyn IdemStore>| {
        idem::Registry::builder()
            .store(store)
            .clock(Arc::new(clock.clone()))
            .retry_policy(idem::registry::RetryPolicy::never())
            .tool(tool())
            .build()
            .expect("a registry")
    };
    let (ra, rb) = (registry(a), registry(b));
    let call = idem::ToolCall::new("run-race", "charge", json!({"cents": 4900}));
    let first = ra.call(call.clone()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().expect("a key").clone();

    let pass = |r: &idem::Registry| {
        let r = r.clone();
        tokio::spawn(async move {
            idem::Reconciler::new(&r)
                .run_once()
                .await
                .expect("a reconciliation pass")
        })
    };
    let (mut pa, mut pb) = (pass(&ra), pass(&rb));
    // The pass that retries is held inside the handler, so the first pass to finish is the
    // other one, and it ran while the retry was in flight. If both took the record over,
    // both retries are held, and the third request says so.
    let both_inside = async {
        loop {
            entered.notified().await;
            if requests.load(Ordering::SeqCst) >= 3 {
                break;
            }
        }
    };
    let (first, d) = tokio::select! {
        d = &mut pa => ("a", d),
        d = &mut pb => ("b", d),
        () = both_inside => panic!("both reconcilers took the record over and retried"),
    };
    let mut done = vec![d.expect("a pass")];
    gate.add_permits(2);
    let other = if first == "a" { pb.await } else { pa.await };
    done.push(other.expect("the other pass"));
    let retried: usize = done
        .iter()
        .flatten()
        .filter(|d| d.key == key && d.action == idem::reconcile::Action::Retried)
        .count();
    assert_eq!(retried, 1, "exactly one reconciler retried: {done:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "the original request and one retry reached the downstream"
    );
    assert_eq!(charges.lock().unwrap().len(), 1, "one charge");
    let record = a_record(&ra, &key).await;
    assert_eq!(record.state, RecordState::Completed);
}

async fn a_record(r: &idem::Registry, key: &IdemKey) -> Record {
    r.store().get(key).await.expect("get").expect("the record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_retry_an_unknown_record_once() {
    for d in durables("two_reconcilers") {
        let clock = ManualClock::starting_now();
        let a = d.open_on(Some(clock.clone()), RETENTION).await;
        let b = d.open_on(Some(clock.clone()), RETENTION).await;
        eprintln!("two reconcilers on {}", d.name);
        two_reconcilers_retry_once(a, b, &clock).await;
    }
}
