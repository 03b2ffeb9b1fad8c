//! A real crash between claim and settle, on SQLite: the worker process is `kill -9`ed while
//! its handler is inside the effect, and a new process (here: the test itself) issues the
//! same call on the same file. The effect must stay at one, and the caller must be told
//! *unknown* — never a second execution.
//!
//! The worker is this very test binary, re-executed with `IDEM_CRASH_ROLE=worker` to run
//! only [`crash_worker`]; run normally, that test does nothing.
#![cfg(feature = "sqlite")]

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::store::{Clock, IdemStore, ManualClock, SqliteStore, SystemClock};
use idem::tool::{ToolError, ToolSpec, WriteCtx, WriteTool};
use idem::{Outcome, RecordState, Registry, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::json;

const ROLE: &str = "IDEM_CRASH_ROLE";
const DB: &str = "IDEM_CRASH_DB";
const LEDGER: &str = "IDEM_CRASH_LEDGER";

/// Generous upper bound for the child to reach its effect (a cold debug binary on a busy
/// CI machine). Only a hang runs into it; nothing asserts on how long anything took.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A write whose downstream is a file ledger: one line per effect, fsynced before the
/// handler goes on. In the worker it then hangs, as a handler does when the process is
/// about to die mid-call.
struct Charge {
    ledger: PathBuf,
    hang_after_effect: bool,
    runs: Arc<AtomicUsize>,
}

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = String;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge_card")
            .description("Charge a customer's card.")
            // Long enough that neither the timeout nor a missed renewal settles the record
            // before the kill: the only way out of `running` must be the crash.
            .timeout(Duration::from_secs(3600))
            .lease(Duration::from_secs(60))
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let line = format!("{} {} {}\n", ctx.key(), args.customer, args.cents);
        append_synced(&self.ledger, &line).map_err(ToolError::unknown)?;
        if self.hang_after_effect {
            std::future::pending::<()>().await;
        }
        Ok(format!("ch_{}", &ctx.key().as_str()[5..13]))
    }
}

fn append_synced(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(line.as_bytes())?;
    f.sync_all()
}

fn ledger_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

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
    if std::env::var(ROLE).as_deref() != Ok("worker") {
        return;
    }
    let db = PathBuf::from(std::env::var_os(DB).expect("IDEM_CRASH_DB"));
    let ledger = PathBuf::from(std::env::var_os(LEDGER).expect("IDEM_CRASH_LEDGER"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let store = SqliteStore::open(&db).await.expect("open the store");
        let registry = Registry::builder()
            .tool(Charge {
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

fn spawn_worker(db: &Path, ledger: &Path, log: &Path) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let log_file = std::fs::File::create(log).expect("a log file");
    Command::new(exe)
        .args(["crash_worker", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "worker")
        .env(DB, db)
        .env(LEDGER, ledger)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("a log handle"))
        .stderr(log_file)
        .spawn()
        .expect("start the worker process")
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = SystemClock.now().as_millis();
        let dir = std::env::temp_dir().join(format!("idem-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_settle_leaves_unknown() {
    let tmp = TempDir::new("crash-sqlite");
    let db = tmp.0.join("idem.sqlite3");
    let ledger = tmp.0.join("ledger.txt");
    let log = tmp.0.join("worker.log");

    // 1. The worker claims, commits the effect to the ledger, and hangs inside the handler.
    let mut child = spawn_worker(&db, &ledger, &log);
    let started = Instant::now();
    while ledger_lines(&ledger) == 0 {
        if let Some(status) = child.try_wait().expect("poll the worker") {
            panic!(
                "the worker exited ({status}) before its effect:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if started.elapsed() > CHILD_DEADLINE {
            let _ = child.kill();
            panic!(
                "the worker did not reach its effect:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // 2. kill -9: no destructor, no settle, no release.
    child.kill().expect("SIGKILL the worker");
    let status = child.wait().expect("reap the worker");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the worker died by SIGKILL");
    }
    assert!(!status.success());
    assert_eq!(ledger_lines(&ledger), 1, "the effect happened exactly once");

    // 3. A new process opens the same file after the dead worker's lease has passed (the
    //    clock is moved rather than waited for) and issues the very same call.
    let clock = ManualClock::new(SystemClock.now().plus(Duration::from_secs(24 * 3600)));
    let store = SqliteStore::builder(&db)
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .expect("reopen the store after the crash");
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = Registry::builder()
        .tool(Charge {
            ledger: ledger.clone(),
            hang_after_effect: false,
            runs: runs.clone(),
        })
        .store(store.clone())
        .clock(Arc::new(clock))
        .build()
        .expect("a registry");
    let result = registry
        .call(the_call().call_id("toolu_after_restart"))
        .await;

    // 4. One effect, no second run, and the caller is told the truth: unknown.
    assert_eq!(
        ledger_lines(&ledger),
        1,
        "the ledger still shows one effect"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler did not run again"
    );
    match result.outcome() {
        Some(Outcome::Unknown { reason }) => {
            assert!(!reason.is_empty(), "the unknown outcome says why")
        }
        other => panic!("the caller must be told unknown, got {other:?} ({result:?})"),
    }
    assert_eq!(result.attempts(), 0, "nothing was attempted");
    let key = result.key().expect("the call has a key").clone();
    let record = store
        .get(&key)
        .await
        .expect("read the record")
        .expect("the record survived the crash");
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(record.tool, "charge_card");

    // And it stays that way: a third try is refused the same way.
    let again = registry.call(the_call()).await;
    assert!(matches!(again.outcome(), Some(Outcome::Unknown { .. })));
    assert_eq!(ledger_lines(&ledger), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
