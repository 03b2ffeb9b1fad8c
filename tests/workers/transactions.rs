//! `PostgresStore::run_in_transaction`: a tool's effect (a row in the same database) and
//! its completed record commit together or not at all, whatever ends the handler: an error
//! it returns, a panic inside the transaction, a timeout with the transaction still open,
//! the transaction's connection killed under it; a second worker asking meanwhile; and a
//! repeat replays without a second effect row. (A `kill -9` of the worker is
//! `tests/crash/postgres.rs`.)
//!
//! Needs `IDEM_POSTGRES_URL` (skipped with the reason printed otherwise, failed when
//! `IDEM_REQUIRE_BACKENDS=1`). Assertions are on the ledger table and the store's record.
#![cfg(feature = "postgres")]

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::Retention;
use idem::{
    store::RecordState,
    tool::{ToolSpec, WriteTool},
    CallError, IdemKey, IdemStore, OutcomeClass, PostgresStore, Registry, ToolCall, ToolError,
    WriteCtx,
};
use idem_test::stores::PostgresSchema;
use serde_json::{json, Value};
use tokio::sync::{Notify, Semaphore};

/// What the handler does inside its transaction, after inserting its ledger row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Then {
    Commit,
    /// Returns `ToolError::rejected` (rolls back).
    Reject,
    /// Panics.
    Panic,
    /// Sleeps this long, then commits (past the tool's timeout).
    SleepThenCommit(u64),
    /// Waits at the gate, then commits.
    Gate,
    /// Reports its connection's backend pid and waits at the gate; the test kills that
    /// connection; then the handler returns its output as if nothing happened.
    KilledConnection,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct CreditArgs {
    account: String,
    cents: i64,
}

struct Credit {
    store: PostgresStore,
    then: Arc<Mutex<Then>>,
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    inside: Arc<Notify>,
    pid: Arc<AtomicU32>,
    timeout: Duration,
}

impl WriteTool for Credit {
    type Args = CreditArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("credit")
            .description("Credits an account.")
            .timeout(self.timeout)
            .lease(Duration::from_millis(300))
            .in_flight_bound(Duration::from_secs(5))
    }
    async fn call(&self, ctx: WriteCtx, args: CreditArgs) -> Result<Value, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let then = *self.then.lock().unwrap();
        let insert = format!(
            "INSERT INTO \"{}\".ledger (key, account, cents) VALUES ($1, $2, $3) RETURNING id",
            self.store.schema()
        );
        let key = ctx.key().as_str().to_owned();
        let (gate, inside, pid) = (self.gate.clone(), self.inside.clone(), self.pid.clone());
        self.store
            .run_in_transaction(&ctx, move |tx| {
                Box::pin(async move {
                    let row = tx
                        .query_one(&insert, &[&key, &args.account, &args.cents])
                        .await
                        .map_err(|e| ToolError::rejected(format!("not credited: {e}")))?;
                    let id: i64 = row.get(0);
                    match then {
                        Then::Commit => {}
                        Then::Reject => return Err(ToolError::rejected("account frozen")),
                        Then::Panic => panic!("the handler panicked inside its transaction"),
                        Then::SleepThenCommit(ms) => {
                            inside.notify_one();
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        Then::Gate => {
                            inside.notify_one();
                            let _p = gate.acquire().await.expect("the gate stays");
                        }
                        Then::KilledConnection => {
                            let row = tx
                                .query_one("SELECT pg_backend_pid()", &[])
                                .await
                                .map_err(|e| ToolError::rejected(e.to_string()))?;
                            let p: i32 = row.get(0);
                            pid.store(p as u32, Ordering::SeqCst);
                            inside.notify_one();
                            let _p = gate.acquire().await.expect("the gate stays");
                        }
                    }
                    Ok(json!({ "entry": id }))
                })
            })
            .await
    }
}

/// Waits until the handler of `call` is inside its transaction. A call that ends before (a
/// store error on a loaded machine, say) fails the test with what it ended in, rather than
/// leaving the test waiting for a handler that never ran.
async fn until_inside(inside: &Notify, call: &mut tokio::task::JoinHandle<idem::ToolResult>) {
    tokio::select! {
        _ = inside.notified() => {}
        ended = call => panic!("the call ended before its handler was inside the transaction: {ended:?}"),
    }
}

struct Fixture {
    store: PostgresStore,
    then: Arc<Mutex<Then>>,
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    inside: Arc<Notify>,
    pid: Arc<AtomicU32>,
    /// Dropped (with the ledger) when the fixture is.
    schema: PostgresSchema,
}

impl Fixture {
    async fn new(test: &str) -> Option<Fixture> {
        let schema = PostgresSchema::new("tx", test)?;
        let store = schema.open(6, None, Retention::default()).await;
        store
            .pool()
            .get()
            .await
            .expect("a connection")
            .batch_execute(&format!(
                "CREATE TABLE \"{}\".ledger (id bigserial PRIMARY KEY, key text NOT NULL, \
                 account text NOT NULL, cents bigint NOT NULL)",
                schema.name
            ))
            .await
            .expect("the ledger table");
        Some(Fixture {
            store,
            then: Arc::new(Mutex::new(Then::Commit)),
            runs: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            inside: Arc::new(Notify::new()),
            pid: Arc::default(),
            schema,
        })
    }

    fn registry(&self, timeout: Duration, wait: Duration) -> Registry {
        Registry::builder()
            .store(self.store.clone())
            .in_flight_wait(wait)
            .tool(Credit {
                store: self.store.clone(),
                then: self.then.clone(),
                runs: self.runs.clone(),
                gate: self.gate.clone(),
                inside: self.inside.clone(),
                pid: self.pid.clone(),
                timeout,
            })
            .build()
            .expect("valid tools")
    }

    fn set(&self, then: Then) {
        *self.then.lock().unwrap() = then;
    }

    async fn rows(&self) -> i64 {
        self.store
            .pool()
            .get()
            .await
            .expect("a connection")
            .query_one(
                &format!("SELECT count(*) FROM \"{}\".ledger", self.schema.name),
                &[],
            )
            .await
            .expect("count the ledger")
            .get(0)
    }

    async fn state(&self, key: &IdemKey) -> Option<RecordState> {
        self.store
            .get(key)
            .await
            .expect("the store answers")
            .map(|r| r.state)
    }

    /// Ends the test: the schema goes with the fixture.
    async fn drop_schema(self) {
        drop(self);
    }
}

fn credit() -> ToolCall {
    ToolCall::new(
        "run-tx",
        "credit",
        json!({"account": "acc-1", "cents": 4900}),
    )
}

/// Calls until the answer is not "in flight" (a rolled-back transaction's lock is released
/// by the server a moment after the client gives it up).
async fn call_settled(r: &Registry, call: ToolCall) -> idem::ToolResult {
    for _ in 0..100 {
        let out = r.call(call.clone()).await;
        if !matches!(out.error(), Some(CallError::InFlight { .. })) {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    panic!("still in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_effect_is_replayed_without_a_second_row() {
    let Some(f) = Fixture::new("postgres transaction, commit").await else {
        return;
    };
    let r = f.registry(Duration::from_secs(5), Duration::from_secs(1));
    let first = r.call(credit()).await;
    assert!(first.is_completed(), "{:?}", first.as_result());
    let key = first.key().unwrap().clone();
    assert_eq!(f.rows().await, 1);
    assert_eq!(f.state(&key).await, Some(RecordState::Completed));
    let record = f.store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        record.payload.as_ref(),
        first.output(),
        "the record holds the output"
    );

    // Another worker (a new pool on the same schema) asks again: a replay, no row.
    let again = r.call(credit().call_id("toolu_2")).await;
    assert!(again.replayed() && again.is_completed());
    assert_eq!(again.output(), first.output());
    assert_eq!(f.rows().await, 1);
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    f.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_rolls_the_effect_back_and_frees_the_key() {
    let Some(f) = Fixture::new("postgres transaction, error").await else {
        return;
    };
    let r = f.registry(Duration::from_secs(5), Duration::from_secs(1));
    f.set(Then::Reject);
    let first = r.call(credit()).await;
    assert_eq!(
        first.class(),
        Some(OutcomeClass::Rejected),
        "{:?}",
        first.as_result()
    );
    let key = first.key().unwrap().clone();
    assert_eq!(f.rows().await, 0, "the row rolled back with the error");
    assert_eq!(f.state(&key).await, None, "the key is free");

    f.set(Then::Commit);
    let second = r.call(credit().call_id("toolu_2")).await;
    assert!(second.is_completed() && !second.replayed());
    let third = r.call(credit().call_id("toolu_3")).await;
    assert!(third.replayed());
    assert_eq!(f.rows().await, 1, "exactly one effect in the end");
    assert_eq!(f.state(&key).await, Some(RecordState::Completed));
    f.drop_schema().await;
}

/// A panic inside the transaction: the row rolls back, and the record is not completed.
/// The executor records every panic as *unknown* (it cannot tell where the handler
/// panicked), so the key stays blocked: a repeat is told unknown and writes no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_the_transaction_keeps_neither() {
    let Some(f) = Fixture::new("postgres transaction, panic").await else {
        return;
    };
    let r = f.registry(Duration::from_secs(5), Duration::from_secs(1));
    f.set(Then::Panic);
    let first = r.call(credit()).await;
    assert_eq!(
        first.class(),
        Some(OutcomeClass::Unknown),
        "{:?}",
        first.as_result()
    );
    let key = first.key().unwrap().clone();
    assert_eq!(f.rows().await, 0, "the row rolled back with the panic");
    // The executor settles the panic as unknown, unless that settle lost the race with the
    // transaction's own rollback (the row is still locked while the ROLLBACK is queued):
    // then the record is a transactional claim whose transaction is gone, which provably
    // committed nothing, and the store frees it. Either way no effect is ever doubled.
    let settled_unknown = match f.state(&key).await {
        Some(RecordState::Unknown) => true,
        None => false,
        other => panic!("after a panic the record is unknown or freed, not {other:?}"),
    };

    f.set(Then::Commit);
    let again = call_settled(&r, credit().call_id("toolu_2")).await;
    if settled_unknown {
        assert_eq!(
            again.class(),
            Some(OutcomeClass::Unknown),
            "{:?}",
            again.as_result()
        );
        assert!(again.replayed());
        assert_eq!(f.rows().await, 0, "not run again");
        assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    } else {
        assert!(again.is_completed(), "{:?}", again.as_result());
        assert_eq!(
            f.rows().await,
            1,
            "the freed key ran once more, one effect in all"
        );
        assert_eq!(f.runs.load(Ordering::SeqCst), 2);
    }
    f.drop_schema().await;
}

/// The handler's transaction is still open when the tool's timeout passes, and commits
/// later. Meanwhile a repeat is told "in flight" or "unknown" and writes nothing; once the
/// late commit lands, the record is completed with the one row, and a repeat replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_committing_after_the_timeout_settles_completed_once() {
    let Some(f) = Fixture::new("postgres transaction, timeout").await else {
        return;
    };
    let r = f.registry(Duration::from_millis(150), Duration::from_millis(20));
    f.set(Then::SleepThenCommit(700));
    let first = r.call(credit()).await;
    assert_eq!(
        first.class(),
        Some(OutcomeClass::Unknown),
        "{:?}",
        first.as_result()
    );
    let key = first.key().unwrap().clone();
    // Whenever it is looked at, the row and the completed record are there together or
    // not at all.
    let (rows, state) = (f.rows().await, f.state(&key).await);
    assert_eq!(
        rows == 1,
        state == Some(RecordState::Completed),
        "{rows} {state:?}"
    );
    f.set(Then::Commit);
    let meanwhile = r.call(credit().call_id("toolu_2")).await;
    // In flight while the transaction is open, or a replay of what it committed.
    assert!(
        meanwhile.replayed() || matches!(meanwhile.error(), Some(CallError::InFlight { .. })),
        "{:?}",
        meanwhile.as_result()
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 1, "not run again");

    let mut state = None;
    for _ in 0..100 {
        state = f.state(&key).await;
        if state == Some(RecordState::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(
        state,
        Some(RecordState::Completed),
        "the late commit settles it"
    );
    assert_eq!(f.rows().await, 1);
    let again = r.call(credit().call_id("toolu_3")).await;
    assert!(
        again.replayed() && again.is_completed(),
        "{:?}",
        again.as_result()
    );
    assert_eq!(f.rows().await, 1);
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    f.drop_schema().await;
}

/// The transaction's connection is killed by the server (as a failover or a network cut
/// would) after the effect's INSERT; the handler does not notice and returns its output.
/// Neither the row nor a completed record survives; the key is free, and the next call
/// writes the row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_inside_the_transaction_keeps_neither() {
    let Some(f) = Fixture::new("postgres transaction, killed").await else {
        return;
    };
    let r = f.registry(Duration::from_secs(5), Duration::from_secs(1));
    f.set(Then::KilledConnection);
    let mut call = tokio::spawn({
        let r = r.clone();
        async move { r.call(credit()).await }
    });
    until_inside(&f.inside, &mut call).await;
    let pid = f.pid.load(Ordering::SeqCst) as i32;
    let killed: bool = f
        .store
        .pool()
        .get()
        .await
        .unwrap()
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate")
        .get(0);
    assert!(killed);
    f.gate.add_permits(1);
    let first = call.await.unwrap();
    assert!(!first.is_completed(), "{:?}", first.as_result());
    let key = first.key().unwrap().clone();
    assert_eq!(f.rows().await, 0, "the row went with the connection");
    assert_ne!(f.state(&key).await, Some(RecordState::Completed));

    f.set(Then::Commit);
    let again = call_settled(&r, credit().call_id("toolu_2")).await;
    assert!(
        again.is_completed(),
        "the key is free: {:?}",
        again.as_result()
    );
    assert_eq!(f.rows().await, 1);
    let third = r.call(credit().call_id("toolu_3")).await;
    assert!(third.replayed());
    assert_eq!(f.rows().await, 1);
    f.drop_schema().await;
}

/// While worker A's transaction is open, worker B (its own pool on the same schema) asks
/// for the same operation: "in flight", nothing written; after A commits, B replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_never_writes_while_the_transaction_is_open() {
    let Some(f) = Fixture::new("postgres transaction, two workers").await else {
        return;
    };
    let a = f.registry(Duration::from_secs(5), Duration::from_millis(20));
    let b_store = PostgresStore::builder(f.schema.url.clone())
        .schema(f.schema.name.clone())
        .max_connections(2)
        .connect()
        .await
        .unwrap();
    let b = Registry::builder()
        .store(b_store)
        .in_flight_wait(Duration::from_millis(20))
        .tool(Credit {
            store: f.store.clone(),
            then: f.then.clone(),
            runs: f.runs.clone(),
            gate: f.gate.clone(),
            inside: f.inside.clone(),
            pid: f.pid.clone(),
            timeout: Duration::from_secs(5),
        })
        .build()
        .unwrap();
    f.set(Then::Gate);
    let mut first = tokio::spawn({
        let a = a.clone();
        async move { a.call(credit()).await }
    });
    until_inside(&f.inside, &mut first).await;
    // Several lease lengths (300 ms) with the transaction open.
    for i in 0..8 {
        let dup = b.call(credit().call_id(format!("toolu_b{i}"))).await;
        assert!(
            matches!(dup.error(), Some(CallError::InFlight { .. })),
            "{:?}",
            dup.as_result()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    f.gate.add_permits(1);
    let first = first.await.unwrap();
    assert!(first.is_completed(), "{:?}", first.as_result());
    let replay = b.call(credit().call_id("toolu_c")).await;
    assert!(replay.replayed() && replay.is_completed());
    assert_eq!(f.rows().await, 1);
    f.drop_schema().await;
}
