//! Real crashes around a Redis store.
//!
//! 1. A worker process is `kill -9`ed between claim and settle, while its handler is inside
//!    the effect; a new process issues the same call on the same Redis. One effect, and the
//!    caller is told *unknown*. Needs `IDEM_REDIS_URL`.
//! 2. Redis itself is `kill -9`ed and restarted (AOF on, `appendfsync always`) mid-run:
//!    every claim and result is still there, nothing runs twice, a store that is down fails
//!    calls before their handler runs, and claim + settle are one round trip each (counted
//!    by `INFO commandstats`). Starts its own `redis-server` on a free port; skipped, with
//!    the reason printed, when there is none on `PATH`. This proves a Redis *process* crash;
//!    it does not prove power loss (the killed server's writes are still in the OS page
//!    cache, so it passes whatever `appendfsync` is).
//! 3. A worker killed between claim and handler start, and after its handler returned but
//!    before the settle was stored (see `idem_test::crash::CrashPoint`).
//!
//! 1 and 3 run on a Redis Cluster too (`IDEM_REDIS_CLUSTER_URLS`, the masters' URLs
//! separated by commas), with the store spread over it in three partitions.
//!
//! The worker is this test binary, re-executed with `IDEM_CRASH_ROLE=redis-worker` to run
//! only [`crash_worker`]; run normally, that test does nothing.
#![cfg(feature = "redis")]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::redis::RedisStoreBuilder;
use idem::store::backend::{ClaimOutcome, ClaimRequest};
use idem::store::conformance::{backend_url, skip};
use idem::RedisStore;
use idem::{
    store::{Clock, ManualClock, SystemClock},
    IdemStore,
};
use idem::{
    store::{RecordState, StoreError},
    CallError, Outcome, Registry, ToolCall,
};
use idem_test::crash::{
    assert_unknown_after_crash, kill_at_point_and_restart, ledger_lines, point_worker,
    restarted_registry, run_worker_and_kill, unique, worker_runtime, CrashPoint, LedgerCharge,
    TempDir, DEADLINE, ROLE,
};
use serde_json::json;

const URL: &str = "IDEM_CRASH_REDIS_URL";
const PREFIX: &str = "IDEM_CRASH_PREFIX";
const LEDGER: &str = "IDEM_CRASH_LEDGER";

fn charge(customer: &str, cents: u64) -> ToolCall {
    ToolCall::new(
        "run-crash-redis",
        "charge_card",
        json!({"customer": customer, "cents": cents}),
    )
}

/// The variable naming the cluster's nodes.
const CLUSTER_URLS: &str = "IDEM_REDIS_CLUSTER_URLS";

/// A store builder for `url`: one Redis, or (URLs separated by commas) a Redis Cluster with
/// the store in three partitions, one per master of the test cluster.
fn store_at(url: &str) -> RedisStoreBuilder {
    if url.contains(',') {
        RedisStore::cluster(url.split(',')).partitions(3)
    } else {
        RedisStore::builder(url)
    }
}

/// `host:port` of a `redis://host:port/…` URL.
fn addr_of(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// One Redis command over a plain socket (RESP), returning the reply as text: enough for
/// `INFO`, `KEYS` and `DEL` without another client in the test's dependencies.
fn redis_cmd(addr: &str, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut r = BufReader::new(s);
    read_reply(&mut r)
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end().to_owned();
    let (kind, rest) = line.split_at(1.min(line.len()));
    match kind {
        "$" => {
            let n: i64 = rest.parse().unwrap_or(-1);
            if n < 0 {
                return Ok(String::new());
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n as usize);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        "*" => {
            let n: i64 = rest.parse().unwrap_or(0);
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        _ => Ok(line),
    }
}

/// Deletes every key under `prefix` on the server(s) of `url` (comma-separated for a
/// cluster: every node is asked).
fn delete_prefix(url: &str, prefix: &str) {
    for addr in url.split(',').map(addr_of) {
        if let Ok(keys) = redis_cmd(&addr, &["KEYS", &format!("{prefix}*")]) {
            for k in keys.lines().filter(|k| !k.is_empty()) {
                let _ = redis_cmd(&addr, &["DEL", k]);
            }
        }
    }
}

/// The worker role: claim, perform the effect, hang until killed.
#[test]
fn crash_worker() {
    if std::env::var(ROLE).as_deref() == Ok("redis-point") {
        let url = std::env::var(URL).expect("IDEM_CRASH_REDIS_URL");
        let prefix = std::env::var(PREFIX).expect("IDEM_CRASH_PREFIX");
        worker_runtime().block_on(async move {
            let store = store_at(&url)
                .prefix(prefix)
                .connect()
                .await
                .expect("connect the store");
            point_worker(store, charge("acme", 4900)).await;
        });
        return;
    }
    if std::env::var(ROLE).as_deref() != Ok("redis-worker") {
        return;
    }
    let url = std::env::var(URL).expect("IDEM_CRASH_REDIS_URL");
    let prefix = std::env::var(PREFIX).expect("IDEM_CRASH_PREFIX");
    let ledger = PathBuf::from(std::env::var_os(LEDGER).expect("IDEM_CRASH_LEDGER"));
    worker_runtime().block_on(async move {
        let store = store_at(&url)
            .prefix(prefix)
            .connect()
            .await
            .expect("connect the store");
        let registry = Registry::builder()
            .tool(LedgerCharge {
                ledger,
                hang_after_effect: true,
                runs: Arc::default(),
            })
            .store(store)
            .build()
            .expect("a registry");
        let result = registry.call(charge("acme", 4900)).await;
        eprintln!("worker: the call returned, which it must not: {result:?}");
        std::process::exit(3);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_settle_leaves_unknown() {
    let Some(url) = backend_url("IDEM_REDIS_URL", "this Redis crash test") else {
        return;
    };
    kill_9_between_claim_and_settle(&url).await;
}

/// The same on a Redis Cluster, the store spread over its masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_settle_leaves_unknown_on_a_cluster() {
    let Some(url) = backend_url(CLUSTER_URLS, "this Redis Cluster crash test") else {
        return;
    };
    kill_9_between_claim_and_settle(&url).await;
}

/// A worker `kill -9`ed inside its effect, then the same call from a new process.
async fn kill_9_between_claim_and_settle(url: &str) {
    let tmp = TempDir::new("crash-redis");
    let ledger = tmp.0.join("ledger.txt");
    let log = tmp.0.join("worker.log");
    let prefix = format!("idem-crash:{}:", unique("k9"));

    let env = [
        (URL, OsStr::new(url)),
        (PREFIX, OsStr::new(&prefix)),
        (LEDGER, ledger.as_os_str()),
    ];
    run_worker_and_kill("redis::crash_worker", "redis-worker", &env, &ledger, &log).await;
    assert_eq!(ledger_lines(&ledger), 1, "the effect happened once");

    // A new process, after the dead worker's lease has passed (clock moved, not waited).
    let clock = ManualClock::new(SystemClock.now().plus(Duration::from_secs(3600)));
    let store = store_at(url)
        .prefix(prefix.as_str())
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect after the crash");
    let (registry, runs) = restarted_registry(&ledger, store.clone(), clock);
    let result = registry
        .call(charge("acme", 4900).call_id("toolu_after_crash"))
        .await;

    assert_unknown_after_crash(&result, &store, &ledger, &runs).await;
    assert!(matches!(
        registry.call(charge("acme", 4900)).await.outcome(),
        Some(Outcome::Unknown { .. })
    ));
    assert_eq!(ledger_lines(&ledger), 1);
    delete_prefix(url, &prefix);
}

/// A `redis-server` of this test's own, killed when dropped.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Server {
    fn start(bin: &Path, dir: &Path, port: u16) -> Server {
        let log = std::fs::File::create(dir.join("redis.log")).expect("a log file");
        let child = Command::new(bin)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--dir",
                &dir.to_string_lossy(),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = Server {
            child,
            port,
            dir: dir.to_owned(),
        };
        let started = Instant::now();
        while redis_cmd(&server.addr(), &["PING"]).map_or(true, |r| !r.contains("PONG")) {
            assert!(
                started.elapsed() < DEADLINE,
                "redis-server did not come up:\n{}",
                std::fs::read_to_string(server.dir.join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `kill -9`: no shutdown save, only what the AOF already has.
    fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Calls of `cmd` since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
fn calls(addr: &str, cmd: &str) -> u64 {
    let info = redis_cmd(addr, &["INFO", "commandstats"]).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Watches the server with `MONITOR` and counts the commands clients send it (commands a
/// script runs inside Redis are listed as `[… lua]` and are not round trips).
struct Monitor {
    stream: TcpStream,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Monitor {
    fn start(addr: &str) -> Monitor {
        let mut stream = TcpStream::connect(addr).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR reply");
        assert!(ok.starts_with("+OK"), "MONITOR refused: {ok}");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if tx.send(std::mem::take(&mut line)).is_err() {
                    break;
                }
            }
        });
        Monitor { stream, lines }
    }

    /// Client commands seen so far, after a `PING` marker has come through (MONITOR lines
    /// arrive asynchronously; the marker orders them).
    fn client_commands(self, addr: &str) -> Vec<String> {
        redis_cmd(addr, &["ECHO", "idem-monitor-marker"]).expect("marker");
        let mut out = Vec::new();
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) else {
                continue;
            };
            if line.contains("idem-monitor-marker") {
                break;
            }
            if !line.contains(" lua]") {
                out.push(line.trim_end().to_owned());
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        out
    }
}

/// Retries `f` while Redis is coming back (the connection manager reconnects on its own).
async fn until_available<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(StoreError::Unavailable(e)) if started.elapsed() < DEADLINE => {
                eprintln!("redis not back yet: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("after the restart: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_process_kill_and_restart_with_aof_loses_nothing() {
    let Some(bin) = find_on_path("redis-server") else {
        skip(
            "the Redis AOF restart test",
            "redis-server is not on PATH (apt-get install redis-server)",
        );
        return;
    };
    let tmp = TempDir::new("redis-aof");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let server = Server::start(&bin, &tmp.0, port);
    let addr = server.addr();
    let url = format!("redis://{addr}/");
    let store = RedisStore::builder(url.as_str())
        .prefix("crash:")
        .connect()
        .await
        .expect("connect");
    let runs = Arc::new(AtomicUsize::new(0));
    let ledger = tmp.0.join("ledger.txt");
    let registry = Registry::builder()
        .tool(LedgerCharge {
            ledger: ledger.clone(),
            hang_after_effect: false,
            runs: runs.clone(),
        })
        .store(store.clone())
        .build()
        .expect("a registry");

    // Round trips per call, counted by the server: a fresh write is one claim and one
    // settle; a repeat is one claim. Each is one FCALL of the library `connect` loaded.
    assert!(store.function_library().is_some(), "Redis 7 has FUNCTION");
    assert!(registry.call(charge("warmup", 1)).await.is_completed());
    redis_cmd(&addr, &["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    let monitor = Monitor::start(&addr);
    assert!(registry.call(charge("counted", 1)).await.is_completed());
    let sent = monitor.client_commands(&addr);
    let fcall = calls(&addr, "fcall");
    eprintln!("round trips for a fresh write: INFO commandstats FCALL={fcall}; MONITOR saw {} client commands: {sent:#?}", sent.len());
    assert_eq!(fcall, 2, "claim + settle: one FCALL each");
    assert_eq!(
        (
            calls(&addr, "evalsha"),
            calls(&addr, "eval"),
            calls(&addr, "function|load")
        ),
        (0, 0, 0)
    );
    assert_eq!(sent.len(), 2, "and no other command: {sent:?}");
    assert!(
        sent.iter()
            .all(|l| l.to_ascii_lowercase().contains("\"fcall\"")),
        "{sent:?}"
    );

    redis_cmd(&addr, &["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    let monitor = Monitor::start(&addr);
    let replay = registry.call(charge("counted", 1)).await;
    assert!(replay.replayed());
    let sent = monitor.client_commands(&addr);
    let fcall = calls(&addr, "fcall");
    eprintln!(
        "round trips for a repeat: INFO commandstats FCALL={fcall}; MONITOR saw {} client commands",
        sent.len()
    );
    assert_eq!((fcall, sent.len()), (1, 1), "a repeat is one claim");

    // The server loses the library (FUNCTION FLUSH; a restart without persistence): the
    // first call that misses it loads it again, once, and runs; nothing else reloads.
    redis_cmd(&addr, &["FUNCTION", "FLUSH"]).expect("FUNCTION FLUSH");
    redis_cmd(&addr, &["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    let runs_then = runs.load(Ordering::SeqCst);
    assert!(registry.call(charge("after-flush", 1)).await.is_completed());
    assert_eq!(runs.load(Ordering::SeqCst), runs_then + 1, "ran once");
    assert!(registry.call(charge("after-flush", 1)).await.replayed());
    assert_eq!(calls(&addr, "function|load"), 1, "one reload");
    let listed = redis_cmd(&addr, &["FUNCTION", "LIST"]).expect("FUNCTION LIST");
    let library = store.function_library().expect("Redis 7 has FUNCTION");
    assert!(listed.contains(library), "{library} is back: {listed}");

    // Mid-run state: one completed call, one claim still running (its worker alive).
    let done = registry.call(charge("acme", 4900)).await;
    assert!(done.is_completed());
    let done_key = done.key().expect("a key").clone();
    let running = ClaimRequest {
        key: idem::IdemKey::derive(
            &idem::Scope::run("run-crash-redis"),
            "charge_card",
            idem::identity::KeyMaterial::Intent("in-flight"),
        ),
        fingerprint: idem::identity::Fingerprint::of_canonical(b"{}"),
        tool: "charge_card".into(),
        lease: Duration::from_secs(3600),
        operation: None,
    };
    let token = match store.claim(&running).await.expect("claim") {
        ClaimOutcome::Claimed(t) => t,
        other => panic!("{other:?}"),
    };
    let before = (
        store.get(&done_key).await.expect("get"),
        store.get(&running.key).await.expect("get"),
    );
    let runs_before = runs.load(Ordering::SeqCst);

    // Redis dies hard. While it is down, a call fails before its handler runs.
    server.crash();
    let down = registry.call(charge("while-down", 1)).await;
    assert!(
        matches!(
            down.error(),
            Some(CallError::Store(StoreError::Unavailable(_)))
        ),
        "a call while Redis is down must fail as unavailable, got {down:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        runs_before,
        "no handler ran unclaimed"
    );

    // Redis comes back from its AOF.
    let _server = Server::start(&bin, &tmp.0, port);
    let after_done = until_available(|| store.get(&done_key)).await;
    let after_running = until_available(|| store.get(&running.key)).await;
    assert_eq!(after_done, before.0, "the completed record survived");
    assert_eq!(after_running, before.1, "the running claim survived");
    assert_eq!(
        after_running.as_ref().map(|r| r.state),
        Some(RecordState::Running)
    );

    // No duplicate: the completed call replays; the running claim is still in flight and
    // still settles with its own token.
    let again = registry.call(charge("acme", 4900)).await;
    assert!(again.replayed(), "replayed after the restart: {again:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        runs_before,
        "nothing ran twice"
    );
    assert!(matches!(
        store.claim(&running).await,
        Ok(ClaimOutcome::Existing(r)) if r.state == RecordState::Running
    ));
    store
        .settle(
            &running.key,
            token,
            idem::store::backend::Settlement::new(RecordState::Completed).payload(json!("late")),
        )
        .await
        .expect("the original holder settles after the restart");
    assert_eq!(
        ledger_lines(&ledger),
        runs_before,
        "one ledger line per run"
    );
}

/// `kill -9` at `point` under a fresh key prefix, then the same call from a new process;
/// on the Redis of `var` (a cluster's nodes for [`CLUSTER_URLS`]).
async fn crash_at(point: CrashPoint, var: &str) {
    let Some(url) = backend_url(var, "this Redis crash test") else {
        return;
    };
    let prefix = format!("idem-crash:{}:", unique(point.name()));
    kill_at_point_and_restart(
        "redis::crash_worker",
        point,
        "redis-point",
        &[(URL, OsStr::new(&url)), (PREFIX, OsStr::new(&prefix))],
        |clock| {
            let builder = store_at(&url)
                .prefix(prefix.as_str())
                .clock(Arc::new(clock));
            async move { builder.connect().await.expect("connect after the crash") }
        },
        charge("acme", 4900),
    )
    .await;
    delete_prefix(&url, &prefix);
}

/// Killed after the claim was stored, before the handler's effect: no effect, and the record
/// stays unknown (the next process cannot tell this crash from one after the effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_handler_start_leaves_unknown() {
    crash_at(CrashPoint::BeforeHandler, "IDEM_REDIS_URL").await;
}

/// The same on a Redis Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_claim_and_handler_start_leaves_unknown_on_a_cluster() {
    crash_at(CrashPoint::BeforeHandler, CLUSTER_URLS).await;
}

/// Killed after the handler returned, before its settle was stored: one effect, the record
/// unknown, the handler never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_handler_before_settle_leaves_unknown() {
    crash_at(CrashPoint::BeforeSettle, "IDEM_REDIS_URL").await;
}

/// The same on a Redis Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_handler_before_settle_leaves_unknown_on_a_cluster() {
    crash_at(CrashPoint::BeforeSettle, CLUSTER_URLS).await;
}
