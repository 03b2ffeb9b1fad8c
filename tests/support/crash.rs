//! The real-process crash harness of `tests/crash_*.rs`: a worker is this very test binary,
//! re-executed to run only its `crash_worker` test with [`ROLE`] set; the parent waits until
//! the worker's handler has written its effect to a file, then `kill -9`s it.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::store::{Clock, SystemClock};
use idem::tool::{ToolError, ToolSpec, WriteCtx, WriteTool};

/// The environment variable that turns a test binary into a worker of the named role.
pub const ROLE: &str = "IDEM_CRASH_ROLE";

/// Generous bound for a child to reach its effect (a cold debug binary on a busy CI
/// machine). Only a hang runs into it; nothing asserts on how long anything took.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Appends one line and fsyncs it: the effect is on disk before the handler goes on.
pub fn append_synced(path: &Path, line: &str) -> Result<(), ToolError> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(ToolError::unknown)?;
    f.write_all(line.as_bytes()).map_err(ToolError::unknown)?;
    f.sync_all().map_err(ToolError::unknown)
}

/// Lines in a ledger file (0 when it does not exist yet).
pub fn ledger_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// A name no other run of this test uses.
pub fn unique(tag: &str) -> String {
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        SystemClock.now().as_millis()
    )
}

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates it.
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("idem-{}", unique(tag)));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Arguments of [`LedgerCharge`].
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The customer.
    pub customer: String,
    /// Amount in cents.
    pub cents: i64,
}

/// A write whose downstream is a file ledger (one fsynced line per effect). In a worker it
/// then hangs, as a handler does when its process is about to die mid-call.
pub struct LedgerCharge {
    /// The ledger file.
    pub ledger: PathBuf,
    /// Hang after the effect (the worker) or return (the process after the crash).
    pub hang_after_effect: bool,
    /// Handler runs in this process.
    pub runs: Arc<AtomicUsize>,
}

impl WriteTool for LedgerCharge {
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
        append_synced(
            &self.ledger,
            &format!("{} {} {}\n", ctx.key(), args.customer, args.cents),
        )?;
        if self.hang_after_effect {
            std::future::pending::<()>().await;
        }
        Ok(format!("ch_{}_{}", args.customer, args.cents))
    }
}

/// The runtime a worker runs its call on.
pub fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Starts this test binary as a worker in `role` (with `env`), waits until its handler has
/// written a line to `marker`, and `kill -9`s it: no destructor, no settle, no release.
pub async fn run_worker_and_kill(role: &str, env: &[(&str, &OsStr)], marker: &Path, log: &Path) {
    let log_file = std::fs::File::create(log).expect("a log file");
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["crash_worker", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("a log handle"))
        .stderr(log_file)
        .spawn()
        .expect("start the worker");
    let started = Instant::now();
    while ledger_lines(marker) == 0 {
        if let Some(status) = child.try_wait().expect("poll the worker") {
            panic!(
                "the worker exited ({status}) before its effect:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!(
                "the worker did not reach its effect:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("SIGKILL the worker");
    let status = child.wait().expect("reap the worker");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the worker died by SIGKILL");
    }
    assert!(!status.success());
}

/// The process after the crash: a registry on `store` (whose clock has moved past the dead
/// worker's lease) with the same ledger tool, counting its own runs.
pub fn restarted_registry<S: idem::IdemStore>(
    ledger: &Path,
    store: S,
    clock: idem::store::ManualClock,
) -> (idem::Registry, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = idem::Registry::builder()
        .tool(LedgerCharge {
            ledger: ledger.to_owned(),
            hang_after_effect: false,
            runs: runs.clone(),
        })
        .store(store)
        .clock(Arc::new(clock))
        .build()
        .expect("a registry");
    (registry, runs)
}

/// What a repeat after a crash between claim and settle must find: still one effect, the
/// handler not run again, the caller told *unknown* (with a reason), and the record
/// *unknown*. Returns the record for further checks.
pub async fn assert_unknown_after_crash(
    result: &idem::ToolResult,
    store: &dyn idem::IdemStore,
    ledger: &Path,
    runs: &AtomicUsize,
) -> idem::Record {
    assert_eq!(ledger_lines(ledger), 1, "still one effect");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler did not run again"
    );
    match result.outcome() {
        Some(idem::Outcome::Unknown { reason }) => {
            assert!(!reason.is_empty(), "the unknown outcome says why")
        }
        other => panic!("the caller must be told unknown, got {other:?} ({result:?})"),
    }
    let record = store
        .get(result.key().expect("a key"))
        .await
        .expect("read the record")
        .expect("the record outlived its worker");
    assert_eq!(record.state, idem::RecordState::Unknown);
    record
}
