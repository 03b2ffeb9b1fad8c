//! A person works escalations with the CLI on every store it opens (SQLite, Redis with a
//! prefix of the test's own, Postgres with a schema of the test's own): the reconciler
//! escalates unknown records; `idem list --state escalated` lists them with their reason,
//! `idem show` prints the evidence; every malformed or contradictory `resolve` is refused
//! and leaves the record exactly as it was; then `--failed`, `--completed … --output …` and
//! `--release` settle them, and the next call obeys (replays, or runs once).
//!
//! Redis and Postgres need `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` (skipped with a printed
//! reason otherwise, failed when `IDEM_REQUIRE_BACKENDS=1`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::support::{idem, stderr, stdout, unique};
use idem_runtime::store::Retention;
use idem_runtime::{
    call::ToolCall,
    identity::IdemKey,
    outcome::OutcomeClass,
    reconcile::Reconciler,
    registry::Registry,
    store::{IdemStore, RecordState},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use idem_test::stores::{PostgresSchema, RedisPrefix};
use serde_json::{json, Value};

/// An unkeyed send without a read-back: its first answer per order is lost (unknown), so
/// the reconciler can only escalate it; later sends succeed.
struct Send {
    sends: Arc<AtomicU32>,
    lose: Arc<std::sync::Mutex<bool>>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    order: String,
}

impl WriteTool for Send {
    type Args = Args;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("send")
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<Value, ToolError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        if *self.lose.lock().unwrap() {
            Err(ToolError::unknown("gateway timeout after sending"))
        } else {
            Ok(json!({"sent": args.order}))
        }
    }
}

/// How to reach one store from the CLI: the URL and the options naming its location.
struct Target {
    url: String,
    options: Vec<String>,
}

impl Target {
    fn run(&self, args: &[&str]) -> std::process::Output {
        idem()
            .arg("--store")
            .arg(&self.url)
            .args(&self.options)
            .args(args)
            .output()
            .expect("run the idem binary")
    }
}

async fn escalations_worked_through_the_cli(
    name: &str,
    target: &Target,
    store: Arc<dyn IdemStore>,
) {
    let sends = Arc::new(AtomicU32::new(0));
    let lose = Arc::new(std::sync::Mutex::new(true));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(Send {
            sends: sends.clone(),
            lose: lose.clone(),
        })
        .build()
        .unwrap();
    let run = unique("cli-escalations");
    let call = |order: &str| ToolCall::new(run.clone(), "send", json!({ "order": order }));
    let mut keys: Vec<IdemKey> = Vec::new();
    for order in ["o-fail", "o-done", "o-free"] {
        let r = registry.call(call(order)).await;
        assert_eq!(r.class(), Some(OutcomeClass::Unknown), "{name}");
        keys.push(r.key().unwrap().clone());
    }
    Reconciler::new(&registry).run_all().await.expect("a pass");
    for k in &keys {
        let r = store.get(k).await.unwrap().expect("the record");
        assert_eq!(r.state, RecordState::Escalated, "{name}");
    }
    *lose.lock().unwrap() = false;
    assert_eq!(sends.load(Ordering::SeqCst), 3);

    // Listed, with the reason; shown, with the evidence.
    let listed = target.run(&["--json", "list", "--state", "escalated", "--limit", "100"]);
    assert!(listed.status.success(), "{name}: {}", stderr(&listed));
    let page: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let listed_keys: Vec<&str> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    for k in &keys {
        assert!(listed_keys.contains(&k.as_str()), "{name}: {listed_keys:?}");
    }
    let human = target.run(&["list", "--state", "escalated"]);
    assert!(
        stdout(&human).contains("no key contract"),
        "{name}: {}",
        stdout(&human)
    );
    let shown = target.run(&["show", keys[0].as_str()]);
    assert!(shown.status.success(), "{name}");
    let text = stdout(&shown);
    assert!(
        text.contains("escalated") && text.contains("gateway timeout after sending"),
        "{name}: {text}"
    );

    // Bad input: refused, and the records are exactly as they were.
    let before = {
        let mut v = Vec::new();
        for k in &keys {
            v.push(store.get(k).await.unwrap());
        }
        v
    };
    let k0 = keys[0].as_str();
    let absent = format!("idem:{}", "ab".repeat(32));
    let bad: Vec<Vec<&str>> = vec![
        vec!["resolve", k0, "--failed", "declined", "--operator", "ops"],
        vec![
            "resolve",
            k0,
            "--failed",
            "declined",
            "--note",
            "   ",
            "--operator",
            "ops",
        ],
        vec!["resolve", k0, "--note", "no decision", "--operator", "ops"],
        vec![
            "resolve",
            k0,
            "--completed",
            "ch_1",
            "--release",
            "--note",
            "both",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            k0,
            "--completed",
            "ch_1",
            "--failed",
            "x",
            "--note",
            "both",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            k0,
            "--completed",
            "ch_1",
            "--output",
            "{not json",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            k0,
            "--release",
            "--note",
            "n",
            "--operator",
            "bad\u{1b}[31mname",
        ],
        vec![
            "resolve",
            "idem:not-a-key",
            "--release",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            &absent,
            "--release",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            &absent,
            "--completed",
            "ch_1",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
        vec!["list", "--state", "escalatedd"],
        vec!["list", "--state", "escalated", "--after", "yesterday"],
        vec!["list", "--state", "escalated", "--limit", "0"],
        vec!["show", "idem:short"],
        vec![
            "resolve",
            k0,
            "--completed",
            "",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
        vec![
            "resolve",
            k0,
            "--failed",
            "  ",
            "--note",
            "n",
            "--operator",
            "ops",
        ],
    ];
    for args in &bad {
        let out = target.run(args);
        assert!(
            !out.status.success(),
            "{name}: {args:?} was accepted: {}",
            stdout(&out)
        );
        assert!(!stderr(&out).trim().is_empty(), "{name}: {args:?} says why");
    }
    for (k, was) in keys.iter().zip(&before) {
        assert_eq!(&store.get(k).await.unwrap(), was, "{name}: unchanged");
    }
    assert!(
        store
            .get(&IdemKey::parse(&absent).unwrap())
            .await
            .unwrap()
            .is_none(),
        "{name}"
    );
    assert_eq!(sends.load(Ordering::SeqCst), 3, "{name}");

    // Failed: repeats replay the failure.
    let out = target.run(&[
        "resolve",
        k0,
        "--failed",
        "card declined",
        "--note",
        "bank says so",
        "--operator",
        "ops",
    ]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let r = store.get(&keys[0]).await.unwrap().unwrap();
    assert_eq!(r.state, RecordState::Failed, "{name}");
    let again = registry.call(call("o-fail")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Failed), "{name}");
    assert!(again.replayed(), "{name}");

    // Completed with an output: repeats replay it.
    let out = target.run(&[
        "resolve",
        keys[1].as_str(),
        "--completed",
        "msg_7",
        "--output",
        r#"{"sent":"o-done","id":"msg_7"}"#,
        "--note",
        "found in the outbox",
        "--operator",
        "ops",
    ]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let again = registry.call(call("o-done")).await;
    assert!(again.replayed() && again.is_completed(), "{name}");
    assert_eq!(
        again.output(),
        Some(&json!({"sent": "o-done", "id": "msg_7"})),
        "{name}"
    );

    // Released: listed as released, and the next call runs once. Sent just now, so only a
    // forced release frees it.
    let out = target.run(&[
        "resolve",
        keys[2].as_str(),
        "--release",
        "--force",
        "the mail provider's log shows it was never accepted",
        "--note",
        "never arrived",
        "--operator",
        "ops",
    ]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    assert!(store.get(&keys[2]).await.unwrap().is_none(), "{name}");
    let released = target.run(&["--json", "list", "--released"]);
    assert!(
        stdout(&released).contains(keys[2].as_str()),
        "{name}: {}",
        stdout(&released)
    );
    let rerun = registry.call(call("o-free")).await;
    assert!(rerun.is_completed() && !rerun.replayed(), "{name}");
    let again = registry.call(call("o-free")).await;
    assert!(again.replayed(), "{name}");
    assert_eq!(
        sends.load(Ordering::SeqCst),
        4,
        "{name}: only the released one ran again"
    );

    // Settled records are not a person's to change: refused, unchanged.
    let settled = store.get(&keys[0]).await.unwrap();
    let out = target.run(&[
        "resolve",
        k0,
        "--release",
        "--note",
        "undo",
        "--operator",
        "ops",
    ]);
    assert!(!out.status.success(), "{name}");
    assert_eq!(store.get(&keys[0]).await.unwrap(), settled, "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = crate::support::TempDb::new("cli-escalations").await;
    let target = Target {
        url: format!("sqlite://{}", db.path.display()),
        options: vec![],
    };
    escalations_worked_through_the_cli("sqlite", &target, db.store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let Some(prefix) = RedisPrefix::new("cli-escalations", "the CLI's escalations on Redis") else {
        return;
    };
    let store = prefix.open(Retention::default()).await;
    let target = Target {
        url: prefix.url.clone(),
        options: vec!["--prefix".into(), prefix.prefix.clone()],
    };
    escalations_worked_through_the_cli("redis", &target, Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some(schema) = PostgresSchema::new("cli_escalations", "the CLI's escalations on Postgres")
    else {
        return;
    };
    let store = schema.open(4, None, Retention::default()).await;
    let target = Target {
        url: schema.url.clone(),
        options: vec!["--schema".into(), schema.name.clone()],
    };
    escalations_worked_through_the_cli("postgres", &target, Arc::new(store)).await;
}
