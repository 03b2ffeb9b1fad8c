//! Two worker *processes* on one durable store (a SQLite file, a Redis prefix, a Postgres
//! schema) race the same operations: each process fires every call several times at once,
//! both start together, and the handler is slow enough for the claims to overlap. The
//! downstream's ledger (a file both processes append to) holds one effect per operation,
//! and every call was answered completed (run or replayed), never "in flight" past the wait.
//!
//! The workers are this test binary run again with `IDEM_RACE_ROLE=race`; run normally,
//! [`race_worker`] does nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idem::{
    tool::{ToolSpec, WriteTool},
    Registry, ToolCall, ToolError, WriteCtx,
};
use idem_test::stores::{durables, Durable};
use serde_json::{json, Value};

const ROLE: &str = "IDEM_RACE_ROLE";
const LEDGER: &str = "IDEM_RACE_LEDGER";
const GO: &str = "IDEM_RACE_GO";
const OPERATIONS: usize = 4;
const REPEATS: usize = 6;

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct OrderArgs {
    order: String,
}

/// Appends one line per effect to a file shared by the processes (`O_APPEND`, one
/// `write` per line, so lines from two processes never interleave).
struct Append {
    ledger: PathBuf,
}

impl WriteTool for Append {
    type Args = OrderArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("ship")
            .description("Ships an order.")
            .lease(Duration::from_millis(300))
    }
    async fn call(&self, ctx: WriteCtx, args: OrderArgs) -> Result<Value, ToolError> {
        let line = format!("{} {} {}\n", args.order, ctx.key(), std::process::id());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.ledger)
            .map_err(|e| ToolError::rejected(e.to_string()))?;
        f.write_all(line.as_bytes())
            .map_err(|e| ToolError::unknown(e.to_string()))?;
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(json!({"shipped": args.order, "by": std::process::id()}))
    }
}

/// The worker: waits for the go file, then fires every call `REPEATS` times at once and
/// prints one line per answer: `completed` / `replayed` / anything else.
#[test]
fn race_worker() {
    if std::env::var(ROLE).as_deref() != Ok("race") {
        return;
    }
    let d = Durable::from_env().expect("the parent names the store");
    let ledger = PathBuf::from(std::env::var(LEDGER).unwrap());
    let go = PathBuf::from(std::env::var(GO).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let registry = Registry::builder()
            .shared_store(d.open().await)
            .in_flight_wait(Duration::from_secs(20))
            .tool(Append { ledger })
            .build()
            .unwrap();
        while !go.exists() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut set = tokio::task::JoinSet::new();
        for i in 0..OPERATIONS * REPEATS {
            let registry = registry.clone();
            set.spawn(async move {
                let order = format!("o-{}", i % OPERATIONS);
                registry
                    .call(ToolCall::new("run-p", "ship", json!({"order": order})))
                    .await
            });
        }
        let mut out = std::io::stdout().lock();
        for r in set.join_all().await {
            let word = match (r.is_completed(), r.replayed()) {
                (true, false) => "completed".to_owned(),
                (true, true) => "replayed".to_owned(),
                _ => format!("other {:?}", r.as_result()),
            };
            writeln!(out, "ANSWER {word}").unwrap();
        }
    });
}

fn spawn_worker(d: &Durable, ledger: &Path, go: &Path) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "processes::race_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, "race")
    .env(LEDGER, ledger)
    .env(GO, go)
    .stdout(std::process::Stdio::piped());
    for (k, v) in d.env() {
        cmd.env(k, v);
    }
    cmd.spawn().expect("the worker starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_racing_the_same_calls_execute_each_once() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    for d in durables("processes") {
        // Open once here, so both workers find the store (tables, functions) ready.
        drop(d.open().await);
        let dir =
            std::env::temp_dir().join(format!("idem-race-proc-{}-{}", d.name, std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ledger, go) = (dir.join("ledger"), dir.join("go"));
        let workers = [
            spawn_worker(&d, &ledger, &go),
            spawn_worker(&d, &ledger, &go),
        ];
        // Both processes have had time to start and open the store.
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::fs::write(&go, "go").unwrap();
        let mut answers = Vec::new();
        for w in workers {
            let out = tokio::task::spawn_blocking(move || w.wait_with_output())
                .await
                .unwrap()
                .expect("the worker ends");
            assert!(out.status.success(), "{}: a worker failed", d.name);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            answers.extend(
                text.lines()
                    // libtest may print its own "test race_worker ... " before a line.
                    .filter_map(|l| l.split_once("ANSWER ").map(|(_, a)| a.to_owned())),
            );
        }
        assert_eq!(
            answers.len(),
            2 * OPERATIONS * REPEATS,
            "{}: {answers:?}",
            d.name
        );
        assert!(
            answers.iter().all(|a| a == "completed" || a == "replayed"),
            "{}: {answers:?}",
            d.name
        );
        assert_eq!(
            answers.iter().filter(|a| *a == "completed").count(),
            OPERATIONS,
            "{}: one fresh run per operation",
            d.name
        );
        let lines = std::fs::read_to_string(&ledger).unwrap();
        let mut orders: Vec<&str> = lines
            .lines()
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        orders.sort();
        assert_eq!(
            orders,
            ["o-0", "o-1", "o-2", "o-3"],
            "{}: one effect each",
            d.name
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
