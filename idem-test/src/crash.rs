//! The real-process crash harness of `tests/crash/`: a worker is this very test binary,
//! re-executed to run only a `crash_worker` test with [`ROLE`] set; the parent waits until
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

pub use crate::stores::{unique, TempDir};
use idem::{
    tool::{ToolSpec, WriteTool},
    ToolError, WriteCtx,
};

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

/// Starts this test binary as a worker running only its test `worker` (the test's path, e.g.
/// `sqlite::crash_worker`) in `role` (with `env`), waits until its handler has written a
/// line to `marker`, and `kill -9`s it: no destructor, no settle, no release.
pub async fn run_worker_and_kill(
    worker: &str,
    role: &str,
    env: &[(&str, &OsStr)],
    marker: &Path,
    log: &Path,
) {
    let log_file = std::fs::File::create(log).expect("a log file");
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([worker, "--exact", "--nocapture", "--test-threads=1"])
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
) -> idem::store::Record {
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
    assert_eq!(record.state, idem::store::RecordState::Unknown);
    record
}

// ---------------------------------------------------------------------------------------
// More crash points: before the handler, and after it returned but before the settle.
// ---------------------------------------------------------------------------------------

/// The environment variable naming the [`CrashPoint`] a point worker dies at.
pub const POINT: &str = "IDEM_CRASH_POINT";
/// The environment variable holding the ledger file of a point worker.
pub const POINT_LEDGER: &str = "IDEM_CRASH_POINT_LEDGER";
/// The environment variable holding the marker file a point worker writes where it hangs.
pub const POINT_MARKER: &str = "IDEM_CRASH_POINT_MARKER";

/// Where a point worker is `kill -9`ed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The claim is stored; the handler has not begun its effect.
    BeforeHandler,
    /// The handler returned (its effect is in the ledger); the settle has not been stored.
    BeforeSettle,
}

impl CrashPoint {
    /// The name passed in [`POINT`].
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeHandler => "before-handler",
            CrashPoint::BeforeSettle => "before-settle",
        }
    }

    fn from_env() -> CrashPoint {
        match std::env::var(POINT).as_deref() {
            Ok("before-handler") => CrashPoint::BeforeHandler,
            Ok("before-settle") => CrashPoint::BeforeSettle,
            other => panic!("{POINT} must name a crash point, got {other:?}"),
        }
    }
}

/// The charge tool of a worker that dies before its effect: the claim is held, the handler
/// marks that it was entered and hangs. The spec is [`LedgerCharge`]'s, so the key is the
/// same.
struct HangBeforeEffect {
    marker: PathBuf,
    spec: ToolSpec,
}

impl WriteTool for HangBeforeEffect {
    type Args = ChargeArgs;
    type Output = String;

    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, _ctx: WriteCtx, _args: ChargeArgs) -> Result<String, ToolError> {
        append_synced(&self.marker, "entered\n")?;
        std::future::pending::<()>().await;
        unreachable!("killed while pending")
    }
}

/// A store whose `settle` marks that it was reached and hangs: the process dies with the
/// handler's result in hand and nothing of it stored.
#[derive(Debug)]
struct HangOnSettle<S> {
    inner: S,
    marker: PathBuf,
}

#[async_trait::async_trait]
impl<S: idem::IdemStore> idem::IdemStore for HangOnSettle<S> {
    // A test double that keeps no release traces: a release takes the record over and frees
    // it, a traced release settles and then releases, and no trace is listed.
    async fn release_unsettled(
        &self,
        key: &idem::IdemKey,
        expected: idem::store::ClaimToken,
        _note: &idem::store::ReleaseNote,
    ) -> Result<(), idem::store::StoreError> {
        let token = self
            .reclaim(key, expected, std::time::Duration::from_secs(60))
            .await?;
        self.release(key, token).await
    }

    async fn release_traced(
        &self,
        key: &idem::IdemKey,
        token: idem::store::ClaimToken,
        settlement: idem::store::backend::Settlement,
        note: &idem::store::ReleaseNote,
    ) -> Result<(), idem::store::StoreError> {
        idem::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    async fn releases(
        &self,
        _key: &idem::IdemKey,
    ) -> Result<Vec<idem::store::ReleaseRecord>, idem::store::StoreError> {
        Ok(Vec::new())
    }

    async fn list_releases(
        &self,
        _after: Option<&idem::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem::store::ReleaseRecord>, idem::store::StoreError> {
        Ok(Vec::new())
    }

    async fn claim(
        &self,
        req: &idem::store::backend::ClaimRequest,
    ) -> Result<idem::store::backend::ClaimOutcome, idem::store::StoreError> {
        self.inner.claim(req).await
    }
    async fn renew(
        &self,
        key: &idem::IdemKey,
        token: idem::store::ClaimToken,
        lease: Duration,
    ) -> Result<(), idem::store::StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(
        &self,
        _key: &idem::IdemKey,
        _token: idem::store::ClaimToken,
        _settlement: idem::store::backend::Settlement,
    ) -> Result<(), idem::store::StoreError> {
        append_synced(&self.marker, "settling\n").expect("write the marker");
        std::future::pending::<()>().await;
        unreachable!("killed while pending")
    }
    async fn release(
        &self,
        key: &idem::IdemKey,
        token: idem::store::ClaimToken,
    ) -> Result<(), idem::store::StoreError> {
        self.inner.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &idem::IdemKey,
        expected: idem::store::ClaimToken,
        lease: Duration,
    ) -> Result<idem::store::ClaimToken, idem::store::StoreError> {
        self.inner.reclaim(key, expected, lease).await
    }
    async fn get(
        &self,
        key: &idem::IdemKey,
    ) -> Result<Option<idem::store::Record>, idem::store::StoreError> {
        self.inner.get(key).await
    }
    async fn list(
        &self,
        state: idem::store::RecordState,
        limit: usize,
    ) -> Result<Vec<idem::store::Record>, idem::store::StoreError> {
        self.inner.list(state, limit).await
    }
}

/// The point worker's body (call it from the `crash_worker` test of a crash file, inside
/// [`worker_runtime`]): makes `call` through a registry on `store` that hangs at the
/// [`CrashPoint`] named in [`POINT`], for the parent to kill. Never returns normally.
pub async fn point_worker<S: idem::IdemStore>(store: S, call: idem::ToolCall) {
    let ledger = PathBuf::from(std::env::var_os(POINT_LEDGER).expect("IDEM_CRASH_POINT_LEDGER"));
    let marker = PathBuf::from(std::env::var_os(POINT_MARKER).expect("IDEM_CRASH_POINT_MARKER"));
    let charge = LedgerCharge {
        ledger,
        hang_after_effect: false,
        runs: Arc::default(),
    };
    let builder = idem::Registry::builder();
    let builder = match CrashPoint::from_env() {
        CrashPoint::BeforeHandler => builder
            .tool(HangBeforeEffect {
                marker,
                spec: charge.spec(),
            })
            .store(store),
        CrashPoint::BeforeSettle => builder.tool(charge).store(HangOnSettle {
            inner: store,
            marker,
        }),
    };
    let registry = builder.build().expect("a registry");
    let result = registry.call(call).await;
    eprintln!("worker: the call returned, which it must not: {result:?}");
    std::process::exit(3);
}

/// Kills a point worker at `point` and checks what the next process finds. `role` and
/// `env` start the worker (this helper adds the point, ledger and marker); `reopen` opens
/// the store again with a clock past the dead worker's lease.
///
/// Either way the record must stay *unknown* (idem cannot tell a crash before the effect
/// from one after it, so it never frees the key on its own), the caller is told unknown,
/// the handler is not run again, and the ledger holds exactly the effects the worker made:
/// none before the handler, one before the settle.
pub async fn kill_at_point_and_restart<S, F, Fut>(
    worker: &str,
    point: CrashPoint,
    role: &str,
    env: &[(&str, &OsStr)],
    reopen: F,
    call: idem::ToolCall,
) where
    S: idem::IdemStore + Clone,
    F: FnOnce(idem::store::ManualClock) -> Fut,
    Fut: std::future::Future<Output = S>,
{
    let tmp = TempDir::new(point.name());
    let ledger = tmp.0.join("ledger.txt");
    let marker = tmp.0.join("marker.txt");
    let log = tmp.0.join("worker.log");
    let mut all: Vec<(&str, &OsStr)> = env.to_vec();
    all.push((POINT, OsStr::new(point.name())));
    all.push((POINT_LEDGER, ledger.as_os_str()));
    all.push((POINT_MARKER, marker.as_os_str()));
    run_worker_and_kill(worker, role, &all, &marker, &log).await;
    let effects = match point {
        CrashPoint::BeforeHandler => 0,
        CrashPoint::BeforeSettle => 1,
    };
    assert_eq!(ledger_lines(&ledger), effects, "the worker's effects");

    let clock =
        idem::store::ManualClock::new(SystemClock.now().plus(Duration::from_secs(24 * 3600)));
    let store = reopen(clock.clone()).await;
    let (registry, runs) = restarted_registry(&ledger, store.clone(), clock);
    let result = registry
        .call(call.clone().call_id("toolu_after_crash"))
        .await;
    match result.outcome() {
        Some(idem::Outcome::Unknown { reason }) => assert!(!reason.is_empty()),
        other => panic!("the caller must be told unknown, got {other:?} ({result:?})"),
    }
    let record = store
        .get(result.key().expect("a key"))
        .await
        .expect("read the record")
        .expect("the record outlived its worker");
    assert_eq!(record.state, idem::store::RecordState::Unknown);
    assert_eq!(&*record.tool, "charge_card");
    assert!(
        record.payload.is_none(),
        "nothing of the handler's result was stored"
    );
    let again = registry.call(call).await;
    assert!(matches!(
        again.outcome(),
        Some(idem::Outcome::Unknown { .. })
    ));
    assert_eq!(ledger_lines(&ledger), effects, "no effect after the crash");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler did not run again"
    );
}
