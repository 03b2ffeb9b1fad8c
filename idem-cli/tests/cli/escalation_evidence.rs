//! A person decides escalations with the `idem` binary (SQLite store): `show` has the
//! evidence the reconciler gathered (attempts with their times and errors, read-backs, the
//! downstream refs), `resolve --completed … --output …` and `resolve --failed …` are what
//! every repeat then gets, and a resolution with bad input changes nothing.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem_runtime::reconcile::Action;
use idem_runtime::{
    call::ToolCall,
    outcome::OutcomeClass,
    reconcile::Reconciler,
    registry::Registry,
    store::{IdemStore, RecordState},
    tool::{ReadBack, ReadBackCtx, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use idem_sqlite::SqliteStore;
use serde_json::{json, Value};

/// A wire whose answer is always lost; the bank's lookup then finds two wires for the key.
struct Wire {
    sends: Arc<AtomicU32>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    to: String,
}

impl WriteTool for Wire {
    type Args = Args;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("wire")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Args) -> Result<Value, ToolError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::unknown(
            "bank answered 504 after the request was sent",
        ))
    }
    async fn read_back(&self, _ctx: ReadBackCtx, _args: Args) -> Result<ReadBack, ToolError> {
        Ok(ReadBack::Ambiguous {
            downstream_refs: vec!["wr_1".into(), "wr_2".into()],
        })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_decides_escalations_with_the_cli() {
    let dir = std::env::temp_dir().join(format!(
        "idem-cli-evidence-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("idem.db");
    let url = format!("sqlite://{}", path.display());
    let store: Arc<dyn IdemStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let sends = Arc::new(AtomicU32::new(0));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(Wire {
            sends: sends.clone(),
        })
        .build()
        .unwrap();
    let call = |to: &str| ToolCall::new("run-1", "wire", json!({ "to": to }));

    let a = registry.call(call("acme")).await;
    let b = registry.call(call("globex")).await;
    assert_eq!(a.class(), Some(OutcomeClass::Unknown));
    let actions: Vec<Action> = Reconciler::new(&registry)
        .run_all()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.action)
        .collect();
    assert_eq!(actions, [Action::Escalated, Action::Escalated]);
    let key_a = a.key().unwrap().to_string();
    let key_b = b.key().unwrap().to_string();

    // `show` has the evidence.
    let shown = idem(&url, &["--json", "show", &key_a]);
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let rec = &shown; // the record, flattened, beside its releases
    assert_eq!(rec["state"], "escalated", "{shown}");
    assert_eq!(rec["attempts"].as_array().unwrap().len(), 1, "{shown}");
    let attempt = &rec["attempts"][0];
    assert!(attempt["started_at"].as_u64().unwrap() > 0, "{attempt}");
    assert!(
        attempt["message"].as_str().unwrap().contains("504"),
        "{attempt}"
    );
    let read_backs = rec["read_backs"].as_array().unwrap();
    assert_eq!(read_backs.len(), 1, "{shown}");
    let found = read_backs[0]["result"].as_str().unwrap();
    assert!(found.contains("wr_1") && found.contains("wr_2"), "{found}");
    assert_eq!(rec["operation"]["args"]["to"], "acme");
    // The reason kind, kept by the store with the escalated record, and shown.
    assert_eq!(
        rec["payload"]["reason_kind"], "conflicting_evidence",
        "{shown}"
    );
    let text = idem(&url, &["show", &key_a]);
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l == "reason kind  conflicting_evidence"),
        "{text}"
    );

    // Bad input: refused, and the record is as it was.
    for bad in [
        vec![
            "resolve",
            &key_a,
            "--completed",
            "wr_1",
            "--output",
            "{not json",
            "--note",
            "x",
        ],
        vec![
            "resolve",
            &key_a,
            "--completed",
            "wr_1",
            "--failed",
            "no",
            "--note",
            "x",
        ],
        vec!["resolve", &key_a, "--completed", "wr_1"],
        vec!["resolve", "idem:nope", "--completed", "wr_1", "--note", "x"],
    ] {
        let out = idem(&url, &bad);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(!out.stderr.is_empty(), "{bad:?}: no error message");
    }
    let still = store.get(a.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(still.state, RecordState::Escalated);

    // The person picks the first wire and says what repeats get.
    let out = idem(
        &url,
        &[
            "resolve",
            &key_a,
            "--completed",
            "wr_1",
            "--output",
            r#"{"wire": "wr_1"}"#,
            "--note",
            "wr_2 was a bank duplicate, refunded",
            "--operator",
            "ops",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let out = idem(
        &url,
        &[
            "resolve",
            &key_b,
            "--failed",
            "both wires returned by the bank",
            "--note",
            "statement of 1 Dec",
            "--operator",
            "ops",
        ],
    );
    assert!(out.status.success(), "{out:?}");

    let again_a = registry.call(call("acme")).await;
    assert!(again_a.replayed(), "{}", again_a.text());
    assert_eq!(again_a.output(), Some(&json!({"wire": "wr_1"})));
    let again_b = registry.call(call("globex")).await;
    assert_eq!(again_b.class(), Some(OutcomeClass::Failed));
    assert!(
        again_b.text().contains("both wires returned"),
        "{}",
        again_b.text()
    );
    assert_eq!(sends.load(Ordering::SeqCst), 2, "nothing sent again");
    let rec = store.get(a.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.downstream_ref.as_deref(), Some("wr_1"));
    let rec = store.get(b.key().unwrap()).await.unwrap().unwrap();
    assert!(
        rec.message.as_deref().is_some_and(|m| m.contains("ops")),
        "{:?}",
        rec.message
    );

    // Decided is decided: a second resolution is refused.
    let out = idem(
        &url,
        &[
            "resolve",
            &key_a,
            "--release",
            "--note",
            "undo",
            "--operator",
            "ops",
        ],
    );
    assert!(!out.status.success());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
