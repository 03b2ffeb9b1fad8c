//! The operator CLI against real stores: a person lists an unknown record, resolves it, and
//! the next call obeys. SQLite always; Redis and Postgres when `IDEM_REDIS_URL` /
//! `IDEM_POSTGRES_URL` are set (skipped with a printed reason otherwise, failed
//! when `IDEM_REQUIRE_BACKENDS=1`).

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem_runtime::store::conformance::backend_url;
use idem_runtime::{
    call::ToolCall,
    outcome::OutcomeClass,
    registry::Registry,
    store::{IdemStore, RecordState},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use idem_test::stores::unique;
use serde_json::{json, Value};

/// A charge whose first response is always lost (it commits, then times out).
struct FlakyCharge {
    sends: Arc<AtomicU32>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    cents: u64,
}

impl WriteTool for FlakyCharge {
    type Args = Args;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<Value, ToolError> {
        let n = self.sends.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            Err(ToolError::unknown("response lost"))
        } else {
            Ok(json!({"charged": args.cents}))
        }
    }
}

fn idem(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--store")
        .arg(url)
        .args(args)
        .env_remove("IDEM_STORE_URL")
        .output()
        .expect("run the idem binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One store, end to end: unknown → listed → resolved completed → replayed; a second
/// unknown → released → runs again.
async fn person_resolves_through_the_cli(url: &str, store: Arc<dyn IdemStore>) {
    let sends = Arc::new(AtomicU32::new(0));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(FlakyCharge {
            sends: sends.clone(),
        })
        .build()
        .unwrap();
    let run = unique("cli");
    let call = |cents: u64| ToolCall::new(run.clone(), "charge", json!({ "cents": cents }));

    let first = registry.call(call(4900)).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().unwrap().to_string();

    let listed = idem(
        url,
        &["--json", "list", "--state", "unknown", "--limit", "10000"],
    );
    assert!(listed.status.success(), "{listed:?}");
    let page: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let records = page["records"].as_array().unwrap();
    assert!(
        records.iter().any(|r| r["key"] == key.as_str()),
        "listed: {records:?}"
    );

    let shown = idem(url, &["show", &key]);
    assert!(shown.status.success());
    assert!(stdout(&shown).contains("unknown") && stdout(&shown).contains("response lost"));

    let resolved = idem(
        url,
        &[
            "resolve",
            &key,
            "--completed",
            "ch_42",
            "--note",
            "seen in the dashboard",
            "--operator",
            "ops",
        ],
    );
    assert!(resolved.status.success(), "{resolved:?}");
    let rec = store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.downstream_ref.as_deref(), Some("ch_42"));

    let again = registry.call(call(4900)).await;
    assert!(again.replayed());
    assert_eq!(again.output(), Some(&json!({"downstream_ref": "ch_42"})));
    assert_eq!(
        sends.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );

    // A completed record is not a person's to change.
    let refused = idem(
        url,
        &[
            "resolve",
            &key,
            "--release",
            "--note",
            "x",
            "--operator",
            "ops",
        ],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("completed"));

    // Release: a second operation, whose send is lost too; the person finds nothing
    // downstream and frees the key, so the intent runs again.
    let run2 = unique("cli-release");
    sends.store(0, Ordering::SeqCst);
    let lost = registry
        .call(ToolCall::new(run2.clone(), "charge", json!({"cents": 7})))
        .await;
    assert_eq!(lost.class(), Some(OutcomeClass::Unknown));
    let key2 = lost.key().unwrap().to_string();
    let released = idem(
        url,
        &[
            "--json",
            "resolve",
            &key2,
            "--release",
            "--force",
            "the bank's request log has no such charge",
            "--note",
            "not in the ledger",
            "--operator",
            "ops",
        ],
    );
    assert!(released.status.success(), "{released:?}");
    assert!(store.get(lost.key().unwrap()).await.unwrap().is_none());
    let rerun = registry
        .call(ToolCall::new(run2, "charge", json!({"cents": 7})))
        .await;
    assert!(rerun.is_completed() && !rerun.replayed());
    assert_eq!(sends.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-cli")));
    let store = idem_sqlite::SqliteStore::open(&path).await.unwrap();
    let url = format!("sqlite://{}", path.display());
    person_resolves_through_the_cli(&url, Arc::new(store)).await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let Some(url) = backend_url("IDEM_REDIS_URL", "the CLI against redis") else {
        return;
    };
    let store = idem_redis::RedisStore::connect(&url).await.unwrap();
    person_resolves_through_the_cli(&url, Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some(url) = backend_url("IDEM_POSTGRES_URL", "the CLI against postgres") else {
        return;
    };
    let store = idem_postgres::PostgresStore::connect(&url).await.unwrap();
    person_resolves_through_the_cli(&url, Arc::new(store)).await;
}

#[test]
fn bad_input_is_a_clear_error() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-cli-bad")));
    let url = format!("sqlite://{}", path.display());
    let missing = idem(&url, &["list", "--state", "unknown"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no SQLite database"));
    let memory = idem("memory:", &["list", "--state", "unknown"]);
    assert!(String::from_utf8_lossy(&memory.stderr).contains("inside one process"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(idem_sqlite::SqliteStore::open(&path)).unwrap();
    let bad_key = idem(&url, &["show", "not-a-key"]);
    assert_eq!(bad_key.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_key.stderr).contains("not an idem key"));
    let no_decision = idem(&url, &["resolve", &format!("idem:{}", "0".repeat(64))]);
    assert!(!no_decision.status.success());
    let reconcile = idem(&url, &["reconcile"]);
    assert!(reconcile.status.success());
    assert!(stdout(&reconcile).contains("nothing to reconcile"));
    let _ = std::fs::remove_file(&path);
}
