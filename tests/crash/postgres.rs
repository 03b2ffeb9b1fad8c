//! Real crashes around a Postgres store (needs `IDEM_POSTGRES_URL`; skipped with the reason
//! printed otherwise, failed when `IDEM_REQUIRE_BACKENDS=1`).
//!
//! 1. An ordinary handler (its effect in a file ledger) is `kill -9`ed between claim and
//!    settle: one effect, and the next call is told *unknown*.
//! 2. A transactional handler ([`PostgresStore::run_in_transaction`], its effect a row in
//!    the same database) is `kill -9`ed inside its transaction, after its effect: the effect
//!    is rolled back with it and the key is free, so the next call runs it — once.
//! 3. The same handler killed after its transaction committed, before the executor's
//!    settle: the effect and the completed record are both there, and the next call
//!    replays it. Never half.
//! 4. An ordinary handler's worker killed between claim and handler start, and after the
//!    handler returned but before the settle was stored (see `idem_test::crash::CrashPoint`).
//!
//! These prove a worker process crash, not a power loss of the database host.
//!
//! Workers are this test binary, re-executed with `IDEM_CRASH_ROLE` set to run only
//! [`crash_worker`]; run normally, that test does nothing.
#![cfg(feature = "postgres")]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::store::conformance::backend_url;
use idem::PostgresStore;
use idem::{store::RecordState, CallError, Registry, ToolCall};
use idem::{
    store::{Clock, ManualClock, Retention, SystemClock},
    IdemStore,
};
use idem::{
    tool::{ToolSpec, WriteTool},
    ToolError, WriteCtx,
};
use idem_test::crash::{
    append_synced, assert_unknown_after_crash, kill_at_point_and_restart, ledger_lines,
    point_worker, restarted_registry, run_worker_and_kill, worker_runtime, ChargeArgs, CrashPoint,
    LedgerCharge, TempDir, DEADLINE, ROLE,
};
use idem_test::stores::PostgresSchema;
use serde_json::json;

const URL: &str = "IDEM_CRASH_PG_URL";
const SCHEMA: &str = "IDEM_CRASH_PG_SCHEMA";
const MARK: &str = "IDEM_CRASH_MARK";

/// Where a worker's handler stops, waiting to be killed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hang {
    Never,
    /// An ordinary handler, after its effect (a fsynced file line).
    AfterFileEffect,
    /// A transactional handler, inside its transaction, after its INSERT.
    InsideTransaction,
    /// A transactional handler, after its transaction committed.
    AfterCommit,
}

/// A transactional write: its effect is a row in `<schema>.ledger`, committed with its
/// record.
struct TxCharge {
    store: PostgresStore,
    marker: PathBuf,
    hang: Hang,
    runs: Arc<AtomicUsize>,
}

impl WriteTool for TxCharge {
    type Args = ChargeArgs;
    type Output = serde_json::Value;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("credit_account")
            .timeout(Duration::from_secs(3600))
            .lease(Duration::from_secs(60))
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<serde_json::Value, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let insert = format!(
            "INSERT INTO \"{}\".ledger (key, customer, cents) VALUES ($1, $2, $3) RETURNING id",
            self.store.schema()
        );
        let key = ctx.key().as_str().to_owned();
        let (marker, hang) = (self.marker.clone(), self.hang);
        let out = self
            .store
            .run_in_transaction(&ctx, move |tx| {
                Box::pin(async move {
                    let row = tx
                        .query_one(&insert, &[&key, &args.customer, &args.cents])
                        .await
                        .map_err(|e| ToolError::rejected(format!("not credited: {e}")))?;
                    let id: i64 = row.get(0);
                    if hang == Hang::InsideTransaction {
                        append_synced(&marker, "inside the transaction\n")?;
                        std::future::pending::<()>().await;
                    }
                    Ok(json!({ "entry": id }))
                })
            })
            .await?;
        if self.hang == Hang::AfterCommit {
            append_synced(&self.marker, "committed\n")?;
            std::future::pending::<()>().await;
        }
        Ok(out)
    }
}

/// A temp dir and a schema of this test's own, both removed when dropped.
struct Scratch {
    dir: PathBuf,
    _dir: TempDir,
    schema: PostgresSchema,
}

impl Scratch {
    fn new(url: &str, tag: &str) -> Scratch {
        let tmp = TempDir::new(tag);
        Scratch {
            dir: tmp.path().to_owned(),
            _dir: tmp,
            schema: PostgresSchema::on(url.to_owned(), &format!("crash_{tag}")),
        }
    }

    async fn store(&self, clock: Option<ManualClock>) -> PostgresStore {
        self.schema.open(4, clock, Retention::default()).await
    }
}

async fn ledger_rows(store: &PostgresStore) -> i64 {
    let client = store.pool().get().await.expect("a connection");
    client
        .query_one(
            &format!("SELECT count(*) FROM \"{}\".ledger", store.schema()),
            &[],
        )
        .await
        .expect("count the ledger")
        .get(0)
}

fn charge(tool: &str) -> ToolCall {
    ToolCall::new(
        "run-crash-pg",
        tool,
        json!({"customer": "acme", "cents": 4900}),
    )
}

/// The worker roles. A no-op unless started by one of the tests below.
#[test]
fn crash_worker() {
    if std::env::var(ROLE).as_deref() == Ok("pg-point") {
        let url = std::env::var(URL).expect("IDEM_CRASH_PG_URL");
        let schema = std::env::var(SCHEMA).expect("IDEM_CRASH_PG_SCHEMA");
        worker_runtime().block_on(async move {
            let store = PostgresStore::builder(url)
                .schema(schema)
                .max_connections(4)
                .connect()
                .await
                .expect("connect the store");
            point_worker(store, charge("charge_card")).await;
        });
        return;
    }
    let hang = match std::env::var(ROLE).as_deref() {
        Ok("pg-file") => Hang::AfterFileEffect,
        Ok("pg-tx-inside") => Hang::InsideTransaction,
        Ok("pg-tx-after") => Hang::AfterCommit,
        _ => return,
    };
    let url = std::env::var(URL).expect("IDEM_CRASH_PG_URL");
    let schema = std::env::var(SCHEMA).expect("IDEM_CRASH_PG_SCHEMA");
    let marker = PathBuf::from(std::env::var_os(MARK).expect("IDEM_CRASH_MARK"));
    worker_runtime().block_on(async move {
        let store = PostgresStore::builder(url)
            .schema(schema)
            .max_connections(4)
            .connect()
            .await
            .expect("connect the store");
        let builder = Registry::builder().store(store.clone());
        let (builder, tool) = if hang == Hang::AfterFileEffect {
            let tool = LedgerCharge {
                ledger: marker,
                hang_after_effect: true,
                runs: Arc::default(),
            };
            (builder.tool(tool), "charge_card")
        } else {
            let tool = TxCharge {
                store,
                marker,
                hang,
                runs: Arc::default(),
            };
            (builder.tool(tool), "credit_account")
        };
        let registry = builder.build().expect("a registry");
        let result = registry.call(charge(tool)).await;
        eprintln!("worker: the call returned, which it must not: {result:?}");
        std::process::exit(3);
    });
}

/// Starts a worker in `role`, waits until it has written `marker`, and `kill -9`s it.
async fn run_and_kill(role: &str, url: &str, scratch: &Scratch, marker: &Path) {
    let log = scratch.dir.join(format!("{role}.log"));
    let env = [
        (URL, OsStr::new(url)),
        (SCHEMA, OsStr::new(&scratch.schema.name)),
        (MARK, marker.as_os_str()),
    ];
    run_worker_and_kill("postgres::crash_worker", role, &env, marker, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_settle_leaves_unknown() {
    let Some(url) = backend_url("IDEM_POSTGRES_URL", "this Postgres crash test") else {
        return;
    };
    let scratch = Scratch::new(&url, "file");
    let ledger = scratch.dir.join("ledger.txt");
    // Migrate before the worker starts, so the parent can clean up whatever happens.
    // The schema exists (migrated) before the worker opens it.
    let _setup = scratch.store(None).await;
    run_and_kill("pg-file", &url, &scratch, &ledger).await;
    assert_eq!(ledger_lines(&ledger), 1, "the effect happened once");

    // A new process, after the dead worker's lease has passed (clock moved, not waited).
    let clock = ManualClock::new(SystemClock.now().plus(Duration::from_secs(3600)));
    let store = scratch.store(Some(clock.clone())).await;
    let (registry, runs) = restarted_registry(&ledger, store.clone(), clock);
    let result = registry
        .call(charge("charge_card").call_id("toolu_after_crash"))
        .await;
    assert_unknown_after_crash(&result, &store, &ledger, &runs).await;
}

/// The parent's registry for the transactional tool.
fn tx_registry(store: &PostgresStore, scratch: &Scratch, runs: &Arc<AtomicUsize>) -> Registry {
    Registry::builder()
        .tool(TxCharge {
            store: store.clone(),
            marker: scratch.dir.join("parent-marker"),
            hang: Hang::Never,
            runs: runs.clone(),
        })
        .store(store.clone())
        .in_flight_wait(Duration::from_millis(200))
        .build()
        .expect("a registry")
}

/// Calls until the call is not "in flight": PostgreSQL notices the dead worker's connection
/// and rolls its transaction back asynchronously, so for a moment the record may still be
/// locked by it (and correctly reported as in flight).
async fn call_settled(registry: &Registry, call: ToolCall) -> idem::ToolResult {
    let started = Instant::now();
    loop {
        let r = registry.call(call.clone()).await;
        match r.error() {
            Some(CallError::InFlight { .. }) if started.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => return r,
        }
    }
}

async fn setup_tx(scratch: &Scratch) -> PostgresStore {
    let store = scratch.store(None).await;
    store
        .pool()
        .get()
        .await
        .expect("a connection")
        .batch_execute(&format!(
            "CREATE TABLE \"{}\".ledger (id bigserial PRIMARY KEY, key text NOT NULL, \
             customer text NOT NULL, cents bigint NOT NULL)",
            scratch.schema.name
        ))
        .await
        .expect("create the ledger");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_handler_killed_inside_its_transaction_leaves_nothing() {
    let Some(url) = backend_url("IDEM_POSTGRES_URL", "this Postgres crash test") else {
        return;
    };
    let scratch = Scratch::new(&url, "txin");
    let store = setup_tx(&scratch).await;
    let marker = scratch.dir.join("marker");
    run_and_kill("pg-tx-inside", &url, &scratch, &marker).await;

    // Not half: no effect, and no completed record.
    assert_eq!(
        ledger_rows(&store).await,
        0,
        "the effect rolled back with the crash"
    );
    let key = idem::IdemKey::derive(
        &idem::Scope::run("run-crash-pg"),
        "credit_account",
        idem::identity::KeyMaterial::Args(br#"{"cents":4900,"customer":"acme"}"#),
    );
    let record = store.get(&key).await.expect("read");
    assert!(
        record
            .as_ref()
            .is_none_or(|r| r.state == RecordState::Running),
        "the record is not settled without its effect: {record:?}"
    );

    // The same call again: the key is free (nothing can have happened), so it runs — once.
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = tx_registry(&store, &scratch, &runs);
    let result = call_settled(&registry, charge("credit_account")).await;
    assert!(
        result.is_completed(),
        "the repeat runs the effect: {result:?}"
    );
    assert_eq!(result.key(), Some(&key));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        ledger_rows(&store).await,
        1,
        "exactly one effect in the end"
    );
    let record = store.get(&key).await.expect("read").expect("a record");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(
        Some(&record.payload.clone().unwrap_or_default()),
        result.output()
    );

    // And a third call replays it.
    let again = registry.call(charge("credit_account")).await;
    assert!(again.replayed());
    assert_eq!(ledger_rows(&store).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_handler_killed_after_commit_keeps_both() {
    let Some(url) = backend_url("IDEM_POSTGRES_URL", "this Postgres crash test") else {
        return;
    };
    let scratch = Scratch::new(&url, "txafter");
    let store = setup_tx(&scratch).await;
    let marker = scratch.dir.join("marker");
    run_and_kill("pg-tx-after", &url, &scratch, &marker).await;

    // Not half: the effect and the completed record, together.
    assert_eq!(ledger_rows(&store).await, 1, "the committed effect stays");
    let records = store.list(RecordState::Completed, 10).await.expect("list");
    assert_eq!(records.len(), 1, "the record completed in the same commit");

    let runs = Arc::new(AtomicUsize::new(0));
    let registry = tx_registry(&store, &scratch, &runs);
    let result = call_settled(&registry, charge("credit_account")).await;
    assert!(result.replayed(), "a repeat replays: {result:?}");
    assert_eq!(result.output(), records[0].payload.as_ref());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran again");
    assert_eq!(ledger_rows(&store).await, 1);
}

/// `kill -9` at `point` in a fresh schema, then the same call from a new process.
async fn crash_at(point: CrashPoint) {
    let Some(url) = backend_url("IDEM_POSTGRES_URL", "this Postgres crash test") else {
        return;
    };
    let scratch = Scratch::new(&url, &point.name().replace('-', "_"));
    // Migrate before the worker starts, so the parent can clean up whatever happens.
    // The schema exists (migrated) before the worker opens it.
    let _setup = scratch.store(None).await;
    kill_at_point_and_restart(
        "postgres::crash_worker",
        point,
        "pg-point",
        &[
            (URL, OsStr::new(&url)),
            (SCHEMA, OsStr::new(&scratch.schema.name)),
        ],
        |clock| scratch.store(Some(clock)),
        charge("charge_card"),
    )
    .await;
}

/// Killed after the claim was stored, before the handler's effect: no effect, and the record
/// stays unknown (the next process cannot tell this crash from one after the effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_handler_start_leaves_unknown() {
    crash_at(CrashPoint::BeforeHandler).await;
}

/// Killed after the handler returned, before its settle was stored: one effect, the record
/// unknown, the handler never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_handler_before_settle_leaves_unknown() {
    crash_at(CrashPoint::BeforeSettle).await;
}
