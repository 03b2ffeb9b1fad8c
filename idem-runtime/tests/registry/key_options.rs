//! Key paths (JSON Pointers), exclusions and key names: what `build` refuses, and what each
//! does to a repeated call, judged on the handler's ledger and the store's records.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_runtime::{
    call::{CallError, ToolCall},
    registry::{BuildError, Registry},
    store::{IdemStore, MemoryStore, RecordState},
    tool::{ReadCtx, ReadTool, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Customer {
    id: String,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Line {
    sku: String,
}

/// Recursive, so its schema keeps a `$ref` into `$defs`.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Node {
    name: String,
    child: Option<Box<Node>>,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Payer {
    Card { card: String },
    Bank { iban: String },
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Note {
    text: String,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct InvoiceArgs {
    customer: Customer,
    invoice: String,
    cents: u64,
    #[serde(default)]
    lines: Vec<Line>,
    #[serde(default)]
    meta: HashMap<String, String>,
    #[serde(default)]
    backup: Option<Customer>,
    #[serde(default)]
    tree: Option<Node>,
    #[serde(default)]
    payer: Option<Payer>,
    #[serde(default)]
    memo: Option<String>,
    #[serde(default)]
    note: Option<Note>,
}

/// One run of the handler: the key it was handed and the memo it sent.
type Run = (String, Option<String>);

/// A write tool that notes every call it runs (its ledger) under the spec it is given.
#[derive(Clone)]
struct Charge {
    spec: ToolSpec,
    ledger: Arc<Mutex<Vec<Run>>>,
}

impl Charge {
    fn new(spec: ToolSpec) -> Charge {
        Charge {
            spec,
            ledger: Arc::default(),
        }
    }

    fn runs(&self) -> Vec<Run> {
        self.ledger.lock().unwrap().clone()
    }
}

impl WriteTool for Charge {
    type Args = InvoiceArgs;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, ctx: WriteCtx, args: InvoiceArgs) -> Result<String, ToolError> {
        self.ledger
            .lock()
            .unwrap()
            .push((ctx.key().to_string(), args.memo));
        Ok(format!("charged {}", args.invoice))
    }
}

fn build(spec: ToolSpec) -> Result<Registry, BuildError> {
    Registry::builder().tool(Charge::new(spec)).build()
}

#[test]
fn paths_the_schema_can_have_build() {
    let paths = [
        "customer",
        "/customer",
        "/customer/id",
        "/lines/0/sku",
        "/lines/12",
        "/meta/any-member-of-a-map",
        "/backup/id",
        "/tree/child/child/child/name",
        "/payer/card",
        "/payer/iban",
        "/note/text",
    ];
    for path in paths {
        build(ToolSpec::new("charge").key_fields([path]))
            .unwrap_or_else(|e| panic!("key({path}): {e}"));
        build(ToolSpec::new("charge").exclude_fields([path]))
            .unwrap_or_else(|e| panic!("exclude({path}): {e}"));
    }
}

#[test]
fn a_path_the_schema_cannot_have_is_refused_naming_the_tool_and_the_path() {
    let paths = [
        "nope",
        "/nope",
        "/customer/nope",
        "/customer/id/deeper",
        "/lines/first/sku",
        "/lines/01",
        "/lines/0/nope",
        "/tree/child/nope",
        "/payer/cash",
        "/cents/0",
    ];
    for path in paths {
        for (option, spec) in [
            ("key", ToolSpec::new("charge").key_fields([path])),
            ("excluded", ToolSpec::new("charge").exclude_fields([path])),
        ] {
            let Err(err) = build(spec) else {
                panic!("{option} `{path}` must not build");
            };
            assert!(
                matches!(&err, BuildError::InvalidSpec { tool, message }
                    if tool == "charge" && message.contains(&format!("{option} field `{path}`"))),
                "{option} `{path}`: {err}"
            );
        }
    }
}

#[test]
fn a_malformed_pointer_is_refused() {
    for path in ["/customer~2id", "/~"] {
        let err = build(ToolSpec::new("charge").key_fields([path])).unwrap_err();
        assert!(
            matches!(&err, BuildError::InvalidSpec { tool, message }
                if tool == "charge" && message.contains(path) && message.contains("JSON Pointer")),
            "{err}"
        );
    }
}

#[test]
fn a_key_field_inside_an_exclusion_is_refused() {
    let spec = ToolSpec::new("charge")
        .key_fields(["/note/text", "invoice"])
        .exclude_fields(["note"]);
    let err = build(spec).unwrap_err();
    assert!(
        matches!(&err, BuildError::InvalidSpec { message, .. }
            if message.contains("`/note/text`") && message.contains("excluded `note`")),
        "{err}"
    );
    // The other way round is fine: the key holds the note without its text.
    build(
        ToolSpec::new("charge")
            .key_fields(["note"])
            .exclude_fields(["/note/text"]),
    )
    .unwrap();
}

/// A read tool, which has no key.
struct Lookup;

impl ReadTool for Lookup {
    type Args = InvoiceArgs;
    type Output = String;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge_lookup").key_name("charge")
    }
    async fn call(&self, _ctx: ReadCtx, args: InvoiceArgs) -> Result<String, ToolError> {
        Ok(args.invoice)
    }
}

#[test]
fn two_write_tools_with_one_key_name_are_refused() {
    let err = Registry::builder()
        .tool(Charge::new(ToolSpec::new("charge")))
        .tool(Charge::new(ToolSpec::new("charge_card").key_name("charge")))
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        BuildError::DuplicateKeyName {
            key_name: "charge".to_owned(),
            tools: ("charge".to_owned(), "charge_card".to_owned()),
        }
    );
    // Read tools derive no key: one may carry any key name.
    Registry::builder()
        .tool(Charge::new(ToolSpec::new("charge")))
        .tool(Lookup)
        .build()
        .unwrap();
    let err = build(ToolSpec::new("charge").key_name("charge card")).unwrap_err();
    assert!(
        matches!(&err, BuildError::InvalidSpec { message, .. } if message.starts_with("key name")),
        "{err}"
    );
}

fn args(memo: &str, note: &str, cents: u64) -> Value {
    json!({
        "customer": {"id": "cus_1"},
        "invoice": "inv_7",
        "cents": cents,
        "memo": memo,
        "note": {"text": note},
    })
}

#[tokio::test]
async fn a_reworded_excluded_field_is_the_same_operation_replayed() {
    let store = Arc::new(MemoryStore::new());
    let tool = Charge::new(
        ToolSpec::new("charge")
            .key_fields(["/customer/id", "invoice"])
            .exclude_fields(["memo", "/note/text"]),
    );
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(tool.clone())
        .build()
        .unwrap();
    let call = |args: Value| ToolCall::new("run-1", "charge", args);
    let first = registry
        .call(call(args("first try", "before noon", 4900)))
        .await;
    assert!(first.is_completed(), "{first:?}");
    let reworded = registry
        .call(call(args("second try, reworded", "after lunch", 4900)))
        .await;
    assert!(reworded.is_completed(), "{reworded:?}");
    assert_eq!(reworded.key(), first.key());
    // One charge, with the first call's memo; the repeat was answered from the record.
    assert_eq!(
        tool.runs(),
        [(
            first.key().unwrap().to_string(),
            Some("first try".to_owned())
        )]
    );
    let records = store.list(RecordState::Completed, 10).await.unwrap();
    assert_eq!(records.len(), 1);
    // The record saves the whole arguments of the call that ran, memo included.
    let saved = records[0].operation.as_ref().unwrap().args.as_str();
    assert!(saved.contains("\"memo\":\"first try\""), "{saved}");
    assert!(saved.contains("before noon"), "{saved}");

    // A changed amount is still changed parameters: refused, nothing runs.
    let changed = registry
        .call(call(args("first try", "before noon", 5000)))
        .await;
    assert!(
        matches!(changed.error(), Some(CallError::ChangedParams { .. })),
        "{changed:?}"
    );
    assert_eq!(tool.runs().len(), 1);
}

#[tokio::test]
async fn without_the_exclusion_a_reworded_memo_is_refused() {
    // The control: the same calls under the whole-argument fingerprint.
    let store = Arc::new(MemoryStore::new());
    let tool = Charge::new(ToolSpec::new("charge").key_fields(["/customer/id", "invoice"]));
    let registry = Registry::builder()
        .shared_store(store)
        .tool(tool.clone())
        .build()
        .unwrap();
    let call = |args: Value| ToolCall::new("run-1", "charge", args);
    registry.call(call(args("first try", "x", 4900))).await;
    let reworded = registry.call(call(args("second try", "x", 4900))).await;
    assert!(
        matches!(reworded.error(), Some(CallError::ChangedParams { .. })),
        "{reworded:?}"
    );
    assert_eq!(tool.runs().len(), 1);
}

#[tokio::test]
async fn a_renamed_tool_that_keeps_its_key_name_finds_what_it_claimed() {
    let store = Arc::new(MemoryStore::new());
    let old = Charge::new(ToolSpec::new("charge"));
    let before = Registry::builder()
        .shared_store(store.clone())
        .tool(old.clone())
        .build()
        .unwrap();
    let first = before
        .call(ToolCall::new("run-1", "charge", args("m", "n", 4900)))
        .await;
    assert!(first.is_completed(), "{first:?}");

    // The next build calls it `charge_card` and keeps `charge` as its key name.
    let renamed = Charge::new(ToolSpec::new("charge_card").key_name("charge"));
    let after = Registry::builder()
        .shared_store(store.clone())
        .tool(renamed.clone())
        .build()
        .unwrap();
    let repeat = after
        .call(ToolCall::new("run-1", "charge_card", args("m", "n", 4900)))
        .await;
    assert!(repeat.is_completed(), "{repeat:?}");
    assert_eq!(repeat.key(), first.key());
    assert!(renamed.runs().is_empty(), "the renamed tool ran again");
    assert_eq!(old.runs().len(), 1);

    // Renamed without a key name, every operation gets a new key: it runs again.
    let rekeyed = Charge::new(ToolSpec::new("charge_card"));
    let careless = Registry::builder()
        .shared_store(store.clone())
        .tool(rekeyed.clone())
        .build()
        .unwrap();
    let again = careless
        .call(ToolCall::new("run-1", "charge_card", args("m", "n", 4900)))
        .await;
    assert_ne!(again.key(), first.key());
    assert_eq!(rekeyed.runs().len(), 1);
    assert_eq!(
        store.list(RecordState::Completed, 10).await.unwrap().len(),
        2
    );
}
