//! A real crash between claim and settle, on SQLite: the worker process is `kill -9`ed while
//! its handler is inside the effect, and a new process (here: the test itself) issues the
//! same call on the same file. The effect must stay at one, and the caller must be told
//! *unknown* — never a second execution. Also killed between claim and handler start, and
//! after the handler returned but before its settle was stored.
//!
//! These prove a process crash. They do not prove power loss: the killed worker's writes are
//! still in the OS page cache, so they pass whatever the synchronous mode is.
//!
//! The worker is this very test binary, re-executed with `IDEM_CRASH_ROLE=worker` to run
//! only [`crash_worker`]; run normally, that test does nothing.
#![cfg(feature = "sqlite")]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use idem::store::{Clock, ManualClock, SystemClock};
use idem::SqliteStore;
use idem::{Outcome, Registry, ToolCall};
use idem_test::crash::{
    assert_unknown_after_crash, kill_at_point_and_restart, ledger_lines, point_worker,
    restarted_registry, run_worker_and_kill, worker_runtime, CrashPoint, LedgerCharge, TempDir,
    ROLE,
};
use serde_json::json;

const DB: &str = "IDEM_CRASH_DB";
const LEDGER: &str = "IDEM_CRASH_LEDGER";

fn the_call() -> ToolCall {
    ToolCall::new(
        "run-crash-1",
        "charge_card",
        json!({"customer": "acme", "cents": 4900}),
    )
    .call_id("toolu_before_crash")
}

/// The worker role: claim, perform the effect, hang until killed. A no-op unless this
/// binary was started by [`kill_9_between_claim_and_settle_leaves_unknown`].
#[test]
fn crash_worker() {
    if std::env::var(ROLE).as_deref() == Ok("point-worker") {
        let db = PathBuf::from(std::env::var_os(DB).expect("IDEM_CRASH_DB"));
        worker_runtime().block_on(async move {
            let store = SqliteStore::open(&db).await.expect("open the store");
            point_worker(store, the_call()).await;
        });
        return;
    }
    if std::env::var(ROLE).as_deref() != Ok("worker") {
        return;
    }
    let db = PathBuf::from(std::env::var_os(DB).expect("IDEM_CRASH_DB"));
    let ledger = PathBuf::from(std::env::var_os(LEDGER).expect("IDEM_CRASH_LEDGER"));
    worker_runtime().block_on(async move {
        let store = SqliteStore::open(&db).await.expect("open the store");
        let registry = Registry::builder()
            .tool(LedgerCharge {
                ledger,
                hang_after_effect: true,
                runs: Arc::default(),
            })
            .store(store)
            .build()
            .expect("a registry");
        let result = registry.call(the_call()).await;
        // Unreachable while the handler hangs; if it is reached, the parent sees the child
        // exit on its own and fails with this output.
        eprintln!("worker: the call returned, which it must not: {result:?}");
        std::process::exit(3);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_settle_leaves_unknown() {
    let tmp = TempDir::new("crash-sqlite");
    let db = tmp.0.join("idem.sqlite3");
    let ledger = tmp.0.join("ledger.txt");
    let log = tmp.0.join("worker.log");

    // 1. The worker claims, commits the effect to the ledger, and hangs inside the handler;
    // 2. kill -9: no destructor, no settle, no release.
    let env = [(DB, db.as_os_str()), (LEDGER, ledger.as_os_str())];
    run_worker_and_kill("sqlite::crash_worker", "worker", &env, &ledger, &log).await;
    assert_eq!(ledger_lines(&ledger), 1, "the effect happened exactly once");

    // 3. A new process opens the same file after the dead worker's lease has passed (the
    //    clock is moved rather than waited for) and issues the very same call.
    let clock = ManualClock::new(SystemClock.now().plus(Duration::from_secs(24 * 3600)));
    let store = SqliteStore::builder(&db)
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .expect("reopen the store after the crash");
    let (registry, runs) = restarted_registry(&ledger, store.clone(), clock);
    let result = registry
        .call(the_call().call_id("toolu_after_restart"))
        .await;

    // 4. One effect, no second run, and the caller is told the truth: unknown.
    let record = assert_unknown_after_crash(&result, &store, &ledger, &runs).await;
    assert_eq!(result.attempts(), 0, "nothing was attempted");
    assert_eq!(&*record.tool, "charge_card");

    // And it stays that way: a third try is refused the same way.
    let again = registry.call(the_call()).await;
    assert!(matches!(again.outcome(), Some(Outcome::Unknown { .. })));
    assert_eq!(ledger_lines(&ledger), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// `kill -9` at `point` on a fresh SQLite file, then the same call from a new process.
async fn crash_at(point: CrashPoint) {
    let tmp = TempDir::new(&format!("crash-sqlite-{}", point.name()));
    let db = tmp.0.join("idem.sqlite3");
    kill_at_point_and_restart(
        "sqlite::crash_worker",
        point,
        "point-worker",
        &[(DB, db.as_os_str())],
        |clock| async {
            SqliteStore::builder(&db)
                .clock(Arc::new(clock))
                .open()
                .await
                .expect("reopen the store after the crash")
        },
        the_call(),
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
