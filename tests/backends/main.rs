//! Matrix rows that depend on what a store keeps, on every backend, in real time with short
//! windows: a result past its retention is a tombstone ("already done; result no longer
//! kept"), never a second execution; unknown, pending and escalated records never expire,
//! past the tombstone window and after the store's own clean-up; a claim whose worker died
//! is unknown for the next process, never free; duplicates from two processes on one store
//! execute once; a changed repeat is refused after a reconnect.
//!
//! Each test opens a "process" (a registry on a fresh connection to the store) as often as
//! it needs. Redis and Postgres need `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` (the tests say
//! why they skip without them, and fail under `IDEM_REQUIRE_BACKENDS=1`).

mod inputs;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::Retention;
use idem::{
    store::RecordState,
    tool::{Downstream, ToolSpec, WriteTool},
    CallError, IdemStore, MemoryStore, Outcome, OutcomeClass, Reconciler, Registry, ToolCall,
    ToolError, WriteCtx,
};
use serde_json::json;

/// What the downstream does with a request.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Commit,
    /// Commits, then the answer is lost.
    LostAnswer,
    /// Accepted, not terminal.
    Pending,
    /// Never answers.
    Hang,
}

#[derive(Default)]
struct Ledger {
    effects: Mutex<Vec<(String, u64)>>,
    requests: AtomicU32,
}

impl Ledger {
    fn effects(&self) -> usize {
        self.effects.lock().unwrap().len()
    }
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct PayArgs {
    order: String,
    cents: u64,
}

struct Pay {
    ledger: Arc<Ledger>,
    mode: Arc<Mutex<Mode>>,
}

impl WriteTool for Pay {
    type Args = PayArgs;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("pay")
            .description("Pay for an order.")
            .downstream(Downstream::Unkeyed)
            .timeout(Duration::from_secs(5))
            .lease(Duration::from_millis(300))
            .in_flight_bound(Duration::from_millis(50))
    }
    async fn call(&self, ctx: WriteCtx, args: PayArgs) -> Result<String, ToolError> {
        self.ledger.requests.fetch_add(1, Ordering::SeqCst);
        let mode = *self.mode.lock().unwrap();
        if mode == Mode::Hang {
            std::future::pending::<()>().await;
        }
        let id = {
            let mut effects = self.ledger.effects.lock().unwrap();
            effects.push((ctx.key().as_str().to_owned(), args.cents));
            format!("pay_{}", effects.len())
        };
        match mode {
            Mode::Commit | Mode::Hang => Ok(id),
            Mode::LostAnswer => Err(ToolError::unknown("connection reset after sending")),
            Mode::Pending => Err(ToolError::pending(id)),
        }
    }
}

/// Opens a new connection to one backend's store (a new process's view of it).
type Opening = std::pin::Pin<Box<dyn std::future::Future<Output = Arc<dyn IdemStore>> + Send>>;
type Open = Arc<dyn Fn(Retention) -> Opening + Send + Sync>;

struct Backend {
    name: &'static str,
    open: Open,
}

/// The backends this run can reach: memory (one store shared by "processes", as a
/// long-lived in-process store is), SQLite on a file, and Redis and Postgres when
/// configured.
fn backends(test: &str) -> Vec<Backend> {
    // Names the test's SQLite file, Redis prefix and Postgres schema.
    let _ = test;
    let mut out = Vec::new();
    let memory: Arc<Mutex<Option<Arc<dyn IdemStore>>>> = Arc::default();
    out.push(Backend {
        name: "memory",
        open: Arc::new(move |retention| {
            let memory = memory.clone();
            Box::pin(async move {
                memory
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| Arc::new(MemoryStore::new().retention(retention)))
                    .clone()
            })
        }),
    });
    #[cfg(feature = "sqlite")]
    {
        // The directory goes when the last opener (the backend) is dropped.
        let dir = Arc::new(idem_test::stores::TempDir::new(&format!("backends_{test}")));
        out.push(Backend {
            name: "sqlite",
            open: Arc::new(move |retention| {
                let path = dir.path().join("idem.sqlite3");
                Box::pin(async move {
                    let store = idem::SqliteStore::builder(path)
                        .retention(retention)
                        .open()
                        .await
                        .expect("the SQLite store opens");
                    store.sweep().await.expect("the sweep runs");
                    Arc::new(store) as Arc<dyn IdemStore>
                })
            }),
        });
    }
    #[cfg(feature = "redis")]
    if let Some(prefix) =
        idem_test::stores::RedisPrefix::new(&format!("backends-{test}"), "backend checks on Redis")
    {
        let prefix = Arc::new(prefix);
        out.push(Backend {
            name: "redis",
            open: Arc::new(move |retention| {
                let prefix = prefix.clone();
                Box::pin(
                    async move { Arc::new(prefix.open(retention).await) as Arc<dyn IdemStore> },
                )
            }),
        });
    }
    #[cfg(feature = "postgres")]
    if let Some(schema) = idem_test::stores::PostgresSchema::new(
        &format!("backends_{test}"),
        "backend checks on Postgres",
    ) {
        let schema = Arc::new(schema);
        out.push(Backend {
            name: "postgres",
            open: Arc::new(move |retention| {
                let schema = schema.clone();
                Box::pin(async move {
                    let store = schema.open(4, None, retention).await;
                    store.purge_expired().await.expect("the purge runs");
                    Arc::new(store) as Arc<dyn IdemStore>
                })
            }),
        });
    }
    out
}

struct Process {
    registry: Registry,
    store: Arc<dyn IdemStore>,
}

async fn start(
    b: &Backend,
    retention: Retention,
    ledger: &Arc<Ledger>,
    mode: &Arc<Mutex<Mode>>,
) -> Process {
    let store = (b.open)(retention).await;
    let registry = Registry::builder()
        .shared_store(store.clone())
        .in_flight_wait(Duration::from_secs(10))
        .tool(Pay {
            ledger: ledger.clone(),
            mode: mode.clone(),
        })
        .build()
        .expect("valid tools");
    Process { registry, store }
}

fn pay(order: &str, cents: u64) -> ToolCall {
    ToolCall::new("run-1", "pay", json!({"order": order, "cents": cents})).call_id("toolu_1")
}

async fn state(p: &Process, r: &idem::ToolResult) -> Option<RecordState> {
    p.store
        .get(r.key().expect("a write has a key"))
        .await
        .expect("the store answers")
        .map(|r| r.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_past_its_retention_is_a_tombstone_never_a_second_execution() {
    let retention = Retention {
        results: Duration::from_millis(200),
        tombstones: Duration::from_secs(120),
    };
    for b in backends("tombstone") {
        let ledger = Arc::new(Ledger::default());
        let mode = Arc::new(Mutex::new(Mode::Commit));
        let first = start(&b, retention, &ledger, &mode).await;
        let done = first
            .registry
            .call(pay("o-1", 4900).intent("order-1"))
            .await;
        assert!(done.is_completed(), "{}: {:?}", b.name, done.as_result());
        drop(first);

        tokio::time::sleep(Duration::from_millis(700)).await;
        let p = start(&b, retention, &ledger, &mode).await;
        let late = p
            .registry
            .call(pay("o-1", 4900).intent("order-1").call_id("toolu_2"))
            .await;
        assert_eq!(ledger.effects(), 1, "{}: never a second execution", b.name);
        assert_eq!(
            late.outcome(),
            Some(&Outcome::ResultExpired {
                was: OutcomeClass::Completed
            }),
            "{}",
            b.name
        );
        // The tombstone still refuses changed parameters.
        let changed = p
            .registry
            .call(pay("o-1", 9900).intent("order-1").call_id("toolu_3"))
            .await;
        assert!(
            matches!(changed.error(), Some(CallError::ChangedParams { .. })),
            "{}: {:?}",
            b.name,
            changed.as_result()
        );
        assert_eq!(ledger.effects(), 1, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_pending_and_escalated_records_outlive_every_window() {
    let retention = Retention {
        results: Duration::from_millis(100),
        tombstones: Duration::from_millis(300),
    };
    for b in backends("never") {
        let ledger = Arc::new(Ledger::default());
        let mode = Arc::new(Mutex::new(Mode::LostAnswer));
        let p = start(&b, retention, &ledger, &mode).await;
        let escalated = p.registry.call(pay("o-esc", 1)).await;
        assert_eq!(escalated.class(), Some(OutcomeClass::Unknown), "{}", b.name);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let decisions = Reconciler::new(&p.registry).run_once().await.unwrap();
        assert_eq!(decisions.len(), 1, "{}: {decisions:?}", b.name);
        assert_eq!(state(&p, &escalated).await, Some(RecordState::Escalated));
        let unknown = p.registry.call(pay("o-unk", 2)).await;
        assert_eq!(unknown.class(), Some(OutcomeClass::Unknown), "{}", b.name);
        *mode.lock().unwrap() = Mode::Pending;
        let pending = p.registry.call(pay("o-pend", 3)).await;
        assert_eq!(pending.class(), Some(OutcomeClass::Pending), "{}", b.name);
        drop(p);
        assert_eq!(ledger.effects(), 3);

        // Well past both windows, with a new process (and its store's clean-up).
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let p = start(&b, retention, &ledger, &mode).await;
        for (r, order, cents, st, class) in [
            (
                &escalated,
                "o-esc",
                1,
                RecordState::Escalated,
                OutcomeClass::Escalated,
            ),
            (
                &unknown,
                "o-unk",
                2,
                RecordState::Unknown,
                OutcomeClass::Unknown,
            ),
            (
                &pending,
                "o-pend",
                3,
                RecordState::Pending,
                OutcomeClass::Pending,
            ),
        ] {
            assert_eq!(state(&p, r).await, Some(st), "{}: {order} kept", b.name);
            let again = p.registry.call(pay(order, cents).call_id("toolu_9")).await;
            assert_eq!(again.class(), Some(class), "{}: {order}", b.name);
            assert!(again.replayed(), "{}: {order}", b.name);
        }
        assert_eq!(ledger.effects(), 3, "{}: nothing sent again", b.name);
        assert_eq!(ledger.requests.load(Ordering::SeqCst), 3, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_claim_is_unknown_for_the_next_process_never_free() {
    for b in backends("crash") {
        let ledger = Arc::new(Ledger::default());
        let mode = Arc::new(Mutex::new(Mode::Hang));
        let p = start(&b, Retention::default(), &ledger, &mode).await;
        let worker = {
            let registry = p.registry.clone();
            tokio::spawn(async move { registry.call(pay("o-1", 4900)).await })
        };
        while ledger.requests.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The worker dies with its request sent: no more lease renewals, nothing settled.
        worker.abort();
        assert!(worker.await.unwrap_err().is_cancelled());
        drop(p);

        *mode.lock().unwrap() = Mode::Commit;
        tokio::time::sleep(Duration::from_millis(900)).await;
        let p = start(&b, Retention::default(), &ledger, &mode).await;
        let again = p.registry.call(pay("o-1", 4900).call_id("toolu_2")).await;
        assert_eq!(
            ledger.requests.load(Ordering::SeqCst),
            1,
            "{}: not sent again",
            b.name
        );
        assert_eq!(
            again.class(),
            Some(OutcomeClass::Unknown),
            "{}: {again:?}",
            b.name
        );
        assert!(again.replayed());
        assert_eq!(state(&p, &again).await, Some(RecordState::Unknown));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_from_two_processes_execute_once_and_a_changed_repeat_is_refused() {
    for b in backends("duplicates") {
        let ledger = Arc::new(Ledger::default());
        let mode = Arc::new(Mutex::new(Mode::Commit));
        let processes = [
            start(&b, Retention::default(), &ledger, &mode).await,
            start(&b, Retention::default(), &ledger, &mode).await,
        ];
        let mut set = tokio::task::JoinSet::new();
        for i in 0..12 {
            let registry = processes[i % 2].registry.clone();
            set.spawn(async move {
                registry
                    .call(pay("o-1", 4900).call_id(format!("toolu_{i}")))
                    .await
            });
        }
        let results = set.join_all().await;
        assert_eq!(ledger.effects(), 1, "{}", b.name);
        for r in &results {
            assert!(r.is_completed(), "{}: {:?}", b.name, r.as_result());
            assert_eq!(r.output(), Some(&json!("pay_1")), "{}", b.name);
        }
        drop(processes);
        let p = start(&b, Retention::default(), &ledger, &mode).await;
        let changed = p.registry.call(pay("o-1", 9900)).await;
        // Unkeyed tools key on the whole arguments: another amount is another operation.
        // Under an intent id it is the same one, and refused.
        assert!(changed.is_completed(), "{}", b.name);
        let a = p.registry.call(pay("o-2", 100).intent("order-2")).await;
        let b2 = p
            .registry
            .call(pay("o-2", 999).intent("order-2").call_id("toolu_x"))
            .await;
        assert!(a.is_completed());
        assert!(
            matches!(b2.error(), Some(CallError::ChangedParams { .. })),
            "{}: {:?}",
            b.name,
            b2.as_result()
        );
        assert_eq!(ledger.effects(), 3, "{}", b.name);
    }
}
