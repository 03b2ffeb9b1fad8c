//! The call semantics, black-box, through the public `idem` facade only: arguments, keys,
//! replays, retries, leases, the reconciler and a person, definitions, durable restarts.
//!
//! Every test asserts on what happened — a downstream ledger (how many effects, how many
//! requests reached it) and the store's records — not only on what a call returned. Time
//! is tokio's paused clock with a `TokioClock` (so leases and retention move with it), or a
//! `ManualClock` for the SQLite store. Each test that found a bug when it was written names
//! the rule it holds the code to.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::identity::KeyMaterial;
use idem::store::{Clock, Retention, Timestamp, TokioClock};
use idem::{
    escalation::CallbackSink,
    reconcile::{resolve, Action, Resolution, ResolveError},
};
use idem::{
    escalation::Escalation,
    registry::RetryPolicy,
    store::RecordState,
    tool,
    tool::{Downstream, ReadTool, ToolSpec, WriteTool},
    BuildError, CallError, Format, IdemKey, IdemStore, MemoryStore, Outcome, OutcomeClass,
    ReadBack, ReadBackCtx, ReadCtx, Reconciler, Registry, Scope, ToolCall, ToolError, WriteCtx,
};
use serde_json::{json, Value};

const RUN: &str = "run-1";
const START: Timestamp = Timestamp(1_800_000_000_000);

// ---------------------------------------------------------------------------------------
// A downstream with a ledger, and tools that call it.
// ---------------------------------------------------------------------------------------

/// What the downstream does with the next request (then `Commit` once the script is empty).
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Commit and answer.
    Commit,
    /// Refuse before doing anything (a 4xx that guarantees nothing ran).
    Reject,
    /// Commit, then fail terminally (a declined charge).
    Fail,
    /// Commit as pending (an asynchronous operation).
    Pending,
    /// Commit, then the response is lost (the handler reports unknown at once).
    LostResponse,
    /// Nothing committed, the connection reset (the handler reports unknown at once).
    Reset,
    /// The handler panics before sending.
    Panic,
    /// Never answers, never commits.
    Hang,
    /// Commits after this long.
    CommitAfter(Duration),
}

#[derive(Debug)]
struct Effect {
    id: String,
    key: String,
    customer: String,
    cents: u64,
}

/// The downstream service. `keyed` downstreams deduplicate by idempotency key.
#[derive(Default)]
struct Bank {
    keyed: bool,
    effects: Mutex<Vec<Effect>>,
    requests: AtomicU32,
    script: Mutex<VecDeque<Step>>,
    /// Released when the test says so (for a handler parked in `Step::Hang`-like waits).
    started: tokio::sync::Notify,
    /// The lookup the read-back uses answers 503 while set.
    lookup_down: std::sync::atomic::AtomicBool,
}

impl Bank {
    fn new(keyed: bool, script: impl IntoIterator<Item = Step>) -> Arc<Bank> {
        Arc::new(Bank {
            keyed,
            script: Mutex::new(script.into_iter().collect()),
            ..Bank::default()
        })
    }

    fn effects(&self) -> usize {
        self.effects.lock().unwrap().len()
    }

    fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }

    fn commit(&self, key: &str, args: &ChargeArgs) -> String {
        let mut effects = self.effects.lock().unwrap();
        if self.keyed {
            if let Some(e) = effects.iter().find(|e| e.key == key) {
                return e.id.clone();
            }
        }
        let id = format!("ch_{}", effects.len() + 1);
        effects.push(Effect {
            id: id.clone(),
            key: key.to_owned(),
            customer: args.customer.clone(),
            cents: args.cents,
        });
        id
    }

    fn found(&self, key: &str) -> Vec<String> {
        self.effects
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.key == key)
            .map(|e| e.id.clone())
            .collect()
    }
}

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer to charge.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

/// `charge`: sends the operation's key downstream as its idempotency key.
struct ChargeTool {
    bank: Arc<Bank>,
    spec: ToolSpec,
    read_back: bool,
}

impl ChargeTool {
    fn new(bank: &Arc<Bank>) -> Self {
        let spec = ToolSpec::new("charge")
            .description("Charge a customer's card.")
            .timeout(Duration::from_secs(10));
        let spec = if bank.keyed {
            spec.downstream(Downstream::Keyed)
        } else {
            spec
        };
        ChargeTool {
            bank: bank.clone(),
            spec,
            read_back: false,
        }
    }

    fn spec(mut self, f: impl FnOnce(ToolSpec) -> ToolSpec) -> Self {
        self.spec = f(self.spec);
        self
    }

    fn with_read_back(mut self) -> Self {
        self.read_back = true;
        self
    }
}

impl WriteTool for ChargeTool {
    type Args = ChargeArgs;
    type Output = String;

    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let step = self
            .bank
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Commit);
        if matches!(step, Step::Panic) {
            panic!("handler bug: index out of bounds");
        }
        self.bank.requests.fetch_add(1, Ordering::SeqCst);
        self.bank.started.notify_waiters();
        let key = ctx.key().as_str();
        match step {
            Step::Commit | Step::Panic => Ok(self.bank.commit(key, &args)),
            Step::Reject => Err(ToolError::rejected("400 invalid amount; nothing executed")),
            Step::Fail => {
                let id = self.bank.commit(key, &args);
                Err(ToolError::failed_with_ref("card declined", id))
            }
            Step::Pending => Err(ToolError::pending(self.bank.commit(key, &args))),
            Step::LostResponse => {
                self.bank.commit(key, &args);
                Err(ToolError::unknown(
                    "502 bad gateway after the request was sent",
                ))
            }
            Step::Reset => Err(ToolError::unknown("connection reset")),
            Step::Hang => std::future::pending().await,
            Step::CommitAfter(d) => {
                tokio::time::sleep(d).await;
                Ok(self.bank.commit(key, &args))
            }
        }
    }

    async fn read_back(&self, ctx: ReadBackCtx, _args: ChargeArgs) -> Result<ReadBack, ToolError> {
        if !self.read_back {
            return Ok(ReadBack::Unsupported);
        }
        if self.bank.lookup_down.load(Ordering::SeqCst) {
            return Err(ToolError::unknown("lookup answered 503"));
        }
        let found = self.bank.found(ctx.key().as_str());
        Ok(match found.as_slice() {
            [] => ReadBack::NotFound,
            [one] => ReadBack::Completed {
                downstream_ref: Some(one.clone()),
                output: json!(one),
            },
            _ => ReadBack::Ambiguous {
                downstream_refs: found,
            },
        })
    }
}

/// A read tool counting its runs.
struct Balance {
    runs: Arc<AtomicU32>,
    panic: bool,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct BalanceArgs {
    customer: String,
}

impl ReadTool for Balance {
    type Args = BalanceArgs;
    type Output = u64;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("balance").description("A customer's balance.")
    }

    async fn call(&self, _ctx: ReadCtx, _args: BalanceArgs) -> Result<u64, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.panic {
            panic!("read handler bug");
        }
        Ok(4900)
    }
}

/// A registry on a `MemoryStore` that moves with tokio's (paused) clock.
struct World {
    store: Arc<MemoryStore>,
    registry: Registry,
    escalations: Arc<Mutex<Vec<Escalation>>>,
}

impl World {
    fn new(tool: ChargeTool) -> World {
        World::with(tool, |b| b)
    }

    fn with(
        tool: ChargeTool,
        builder: impl FnOnce(idem::RegistryBuilder) -> idem::RegistryBuilder,
    ) -> World {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(START));
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        World::on(tool, store, clock, builder)
    }

    fn on(
        tool: ChargeTool,
        store: Arc<MemoryStore>,
        clock: Arc<dyn Clock>,
        builder: impl FnOnce(idem::RegistryBuilder) -> idem::RegistryBuilder,
    ) -> World {
        let escalations = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let escalations = escalations.clone();
            CallbackSink(move |e: &Escalation| escalations.lock().unwrap().push(e.clone()))
        };
        let registry = builder(
            Registry::builder()
                .shared_store(store.clone())
                .clock(clock)
                .escalation_sink(Arc::new(sink))
                .retry_policy(
                    RetryPolicy::default()
                        .max_attempts(3)
                        .initial_backoff(Duration::from_millis(100))
                        .max_backoff(Duration::from_secs(1))
                        .jitter(0.0),
                )
                .tool(tool),
        )
        .build()
        .expect("valid tools");
        World {
            store,
            registry,
            escalations,
        }
    }

    async fn record(&self, key: &IdemKey) -> Option<idem::store::Record> {
        self.store.get(key).await.expect("the store answers")
    }
}

fn charge(cents: u64) -> ToolCall {
    ToolCall::new(RUN, "charge", json!({"customer": "acme", "cents": cents})).call_id("toolu_1")
}

fn intent_key(scope: &Scope, intent: &str) -> IdemKey {
    IdemKey::derive(scope, "charge", KeyMaterial::Intent(intent))
}

fn refused(r: &idem::ToolResult) -> &CallError {
    r.error()
        .unwrap_or_else(|| panic!("expected a refusal, got {:?}", r.outcome()))
}

// ---------------------------------------------------------------------------------------
// 1. Bad input: a clear error, nothing executed, nothing claimed, no panic.
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn array_arguments_in_place_of_an_object_are_refused() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    // The input schema says `"type": "object"`. A model (or a caller) sending the values
    // positionally must be told so, not have them bound to fields by position.
    let schema = w.registry.get("charge").unwrap().input_schema();
    assert_eq!(schema["type"], "object");
    let calls = [
        ToolCall::from_json(RUN, "charge", r#"["acme", 4900]"#),
        ToolCall::new(RUN, "charge", json!(["acme", 4900])),
    ];
    for call in calls {
        let r = w.registry.call(call).await;
        assert!(
            matches!(r.error(), Some(CallError::InvalidArgs { .. })),
            "an array is not an object: {:?} / {:?}",
            r.outcome(),
            r.error()
        );
    }
    assert_eq!(bank.requests(), 0, "nothing reached the downstream");
    assert!(w.store.is_empty(), "nothing was claimed");
}

#[tokio::test(start_paused = true)]
async fn null_and_scalar_arguments_are_refused_before_any_claim() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    assert_all_invalid(&w, &bank, &["null", "42", r#""acme""#, "true", "{}", "[]"]).await;
}

/// Calls `charge` with each text, as text and as the parsed value: every call must be
/// refused as invalid arguments before a key is derived, and nothing may reach the bank or
/// the store.
async fn assert_all_invalid(w: &World, bank: &Bank, texts: &[&str]) {
    for text in texts {
        for call in [
            ToolCall::from_json(RUN, "charge", *text),
            ToolCall::new(RUN, "charge", serde_json::from_str::<Value>(text).unwrap()),
        ] {
            let r = w.registry.call(call).await;
            assert!(
                matches!(refused(&r), CallError::InvalidArgs { tool, .. } if tool == "charge"),
                "{text}: {:?}",
                r.error()
            );
            assert!(r.key().is_none(), "refused before a key was derived");
            assert!(r.is_error() && !r.text().is_empty());
        }
    }
    assert_eq!(bank.requests(), 0);
    assert!(w.store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn malformed_json_text_is_refused_with_a_matchable_error() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    let deep = "[".repeat(100_000);
    let cases = [
        "{",
        r#"{"customer": "acme", "cents": }"#,
        r#"{'customer': 'acme', 'cents': 1}"#,
        r#"{"customer": "acme", "cents": NaN}"#,
        r#"{"customer": "acme", "cents": 1}}"#,
        r#"{"customer": "acme" "cents": 1}"#,
        "\u{feff}{\"customer\": \"acme\", \"cents\": 1}",
        "   ",
        deep.as_str(),
    ];
    for text in cases {
        let r = w
            .registry
            .call(ToolCall::from_json(RUN, "charge", text))
            .await;
        assert!(
            matches!(refused(&r), CallError::MalformedJson { .. }),
            "{}: {:?}",
            &text[..text.len().min(40)],
            r.error()
        );
        assert!(r.text().contains("nothing was done"), "{}", r.text());
    }
    assert_eq!(bank.requests(), 0);
    assert!(w.store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wrong_types_and_out_of_range_numbers_are_invalid_args() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    let cases = [
        r#"{"customer": "acme", "cents": -1}"#,
        r#"{"customer": "acme", "cents": 1.5}"#,
        r#"{"customer": "acme", "cents": 18446744073709551616}"#,
        r#"{"customer": "acme", "cents": "4900"}"#,
        r#"{"customer": null, "cents": 4900}"#,
        r#"{"customer": ["acme"], "cents": 4900}"#,
        r#"{"cents": 4900}"#,
        r#"{"customer": "acme"}"#,
    ];
    assert_all_invalid(&w, &bank, &cases).await;
}

#[tokio::test(start_paused = true)]
async fn unknown_tool_names_are_refused_exactly() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    for name in ["", "Charge", "charge ", " charge", "charge\0", "balance"] {
        let r = w
            .registry
            .call(ToolCall::new(
                RUN,
                name,
                json!({"customer": "acme", "cents": 1}),
            ))
            .await;
        assert!(
            matches!(refused(&r), CallError::UnknownTool { name: n } if n == name),
            "{name:?}: {:?}",
            r.error()
        );
        assert_eq!(r.tool(), name);
    }
    // A runaway name is refused without being echoed back in full.
    let runaway = "é".repeat(100_000);
    let r = w
        .registry
        .call(ToolCall::new(RUN, runaway.as_str(), json!({})))
        .await;
    let CallError::UnknownTool { name } = refused(&r) else {
        panic!("{:?}", r.error());
    };
    assert!(name.len() <= 64 + '…'.len_utf8(), "{} bytes", name.len());
    assert!(name.ends_with('…') && runaway.starts_with(name.trim_end_matches('…')));
    assert!(r.text().len() < 200, "{}", r.text());
    assert_eq!(bank.requests(), 0);
    assert!(w.store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_size_limit_is_inclusive_for_text_and_values_reads_and_writes() {
    let args = json!({"customer": "acme", "cents": 4900});
    let text = serde_json::to_string(&args).unwrap();
    let n = text.len();
    let runs = Arc::new(AtomicU32::new(0));
    let build = |limit: usize, bank: &Arc<Bank>| {
        World::with(ChargeTool::new(bank), |b| {
            b.max_args_bytes(limit).tool(Balance {
                runs: runs.clone(),
                panic: false,
            })
        })
    };

    // Exactly at the limit: allowed.
    let bank = Bank::new(false, []);
    let at = build(n, &bank);
    let r = at
        .registry
        .call(ToolCall::from_json(RUN, "charge", text.clone()))
        .await;
    assert!(r.is_completed(), "{:?}", r.error());
    let r = at
        .registry
        .call(ToolCall::new("run-2", "charge", args.clone()))
        .await;
    assert!(r.is_completed(), "{:?}", r.error());
    assert_eq!(bank.effects(), 2);

    // One byte over: refused with the size and the limit, for writes and reads alike.
    let bank = Bank::new(false, []);
    let over = build(n - 1, &bank);
    for call in [
        ToolCall::from_json(RUN, "charge", text.clone()),
        ToolCall::new(RUN, "charge", args.clone()),
    ] {
        let r = over.registry.call(call).await;
        assert_eq!(
            refused(&r),
            &CallError::ArgsTooLarge {
                size: n,
                limit: n - 1
            }
        );
    }
    let big = format!(r#"{{"customer": "{}"}}"#, "x".repeat(n));
    let r = over
        .registry
        .call(ToolCall::from_json(RUN, "balance", big))
        .await;
    assert!(matches!(refused(&r), CallError::ArgsTooLarge { .. }));
    assert_eq!(bank.requests(), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(over.store.is_empty());
}

#[idem::args]
#[serde(deny_unknown_fields)]
struct StrictArgs {
    customer: String,
    cents: u64,
}

static STRICT_RUNS: AtomicU32 = AtomicU32::new(0);

/// Charge, refusing unknown fields.
#[tool(write, name = "strict_charge")]
async fn strict_charge(_ctx: WriteCtx, args: StrictArgs) -> Result<u64, ToolError> {
    STRICT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(args.cents)
}

#[tokio::test(start_paused = true)]
async fn extra_fields_are_ignored_by_default_and_refused_under_deny_unknown_fields() {
    let bank = Bank::new(false, []);
    let w = World::with(ChargeTool::new(&bank), |b| b.tool(strict_charge));
    // Default serde: unknown fields are dropped; the typed arguments are the operation, so
    // the extra field neither runs a second effect nor counts as changed parameters.
    let first = w.registry.call(charge(4900)).await;
    assert!(first.is_completed());
    let extra = w
        .registry
        .call(ToolCall::new(
            RUN,
            "charge",
            json!({"customer": "acme", "cents": 4900, "note": "again"}),
        ))
        .await;
    assert!(extra.replayed(), "{:?}", extra.error());
    assert_eq!(extra.key(), first.key());
    assert_eq!(bank.effects(), 1);

    // deny_unknown_fields: a clear refusal, nothing run, nothing claimed.
    let before = w.store.len();
    let r = w
        .registry
        .call(ToolCall::from_json(
            RUN,
            "strict_charge",
            r#"{"customer": "acme", "cents": 1, "note": "x"}"#,
        ))
        .await;
    assert!(
        matches!(refused(&r), CallError::InvalidArgs { message, .. } if message.contains("note")),
        "{:?}",
        r.error()
    );
    assert_eq!(STRICT_RUNS.load(Ordering::SeqCst), 0);
    assert_eq!(w.store.len(), before);
}

#[tokio::test(start_paused = true)]
async fn empty_run_id_and_intent_id_limits() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    let r = w.registry.call(charge(1).intent("i".repeat(1025))).await;
    assert!(matches!(refused(&r), CallError::InvalidCall { .. }));
    let r = w
        .registry
        .call(ToolCall::new(
            "",
            "charge",
            json!({"customer": "a", "cents": 1}),
        ))
        .await;
    assert!(matches!(refused(&r), CallError::InvalidCall { .. }));
    // Run id, tenant and principal are bounded like the intent id.
    let long = "r".repeat(1025);
    for call in [
        ToolCall::new(
            long.as_str(),
            "charge",
            json!({"customer": "a", "cents": 1}),
        ),
        charge(1).tenant(long.as_str()),
        charge(1).principal(long.as_str()),
    ] {
        let r = w.registry.call(call).await;
        assert!(
            matches!(refused(&r), CallError::InvalidCall { message } if message.contains("longer than 1024")),
            "{:?}",
            r.error()
        );
    }
    assert_eq!(bank.requests(), 0);
    assert!(w.store.is_empty());
    // 1024 bytes is still a valid intent id.
    let r = w.registry.call(charge(1).intent("i".repeat(1024))).await;
    assert!(r.is_completed(), "{:?}", r.error());
    assert_eq!(bank.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn changed_params_under_one_intent_are_refused_whatever_state_the_record_is_in() {
    // Completed record.
    let bank = Bank::new(false, [Step::Commit, Step::Reset]);
    let w = World::new(ChargeTool::new(&bank));
    let first = w.registry.call(charge(4900).intent("order-1")).await;
    assert!(first.is_completed());
    let key = first.key().unwrap().clone();
    assert_eq!(key, intent_key(&Scope::run(RUN), "order-1"));
    let before = w.record(&key).await.unwrap();
    let changed = w.registry.call(charge(9900).intent("order-1")).await;
    assert_eq!(
        refused(&changed),
        &CallError::ChangedParams { key: key.clone() }
    );
    assert!(changed.text().contains("different parameters"));
    assert_eq!(
        w.record(&key).await.unwrap(),
        before,
        "the record is untouched"
    );
    // A person hears of it, with the refused arguments.
    let notices = w.escalations.lock().unwrap().clone();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].key, key);
    assert_eq!(notices[0].refused_args.as_ref().unwrap()["cents"], 9900);
    assert_eq!(notices[0].state, RecordState::Completed);

    // Unknown record: refused as well, not "unknown" and never sent.
    let unknown = w.registry.call(charge(100).intent("order-2")).await;
    assert_eq!(unknown.class(), Some(OutcomeClass::Unknown));
    let changed = w.registry.call(charge(200).intent("order-2")).await;
    assert!(matches!(refused(&changed), CallError::ChangedParams { .. }));
    assert_eq!(bank.requests(), 2);
    assert_eq!(bank.effects(), 1);
    assert_eq!(
        w.record(unknown.key().unwrap()).await.unwrap().state,
        RecordState::Unknown
    );
}

#[tokio::test(start_paused = true)]
async fn changed_params_while_the_original_runs_is_refused_at_once() {
    let bank = Bank::new(true, [Step::CommitAfter(Duration::from_secs(5))]);
    let w = World::new(ChargeTool::new(&bank));
    let original = tokio::spawn({
        let r = w.registry.clone();
        async move { r.call(charge(4900).intent("order-1")).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = w.registry.call(charge(9900).intent("order-1")).await;
    assert!(matches!(refused(&changed), CallError::ChangedParams { .. }));
    let original = original.await.unwrap();
    assert!(original.is_completed());
    let effects = bank.effects.lock().unwrap();
    assert_eq!(effects.len(), 1);
    assert_eq!(
        (effects[0].customer.as_str(), effects[0].cents),
        ("acme", 4900)
    );
    assert_eq!(bank.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_call_frees_its_key_fields_and_the_corrected_call_runs_once() {
    let bank = Bank::new(false, [Step::Reject]);
    let tool = ChargeTool::new(&bank).spec(|s| s.key_fields(["customer"]));
    let w = World::new(tool);
    let rejected = w.registry.call(charge(0)).await;
    assert_eq!(rejected.class(), Some(OutcomeClass::Rejected));
    let key = rejected.key().unwrap().clone();
    assert!(w.record(&key).await.is_none(), "the claim was released");
    assert_eq!(bank.effects(), 0);

    // Same key fields, corrected amount: not "changed parameters", it runs.
    let corrected = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert!(corrected.is_completed(), "{:?}", corrected.error());
    assert_eq!(corrected.key(), Some(&key));
    assert!(!corrected.replayed());
    // And from then on, other amounts under the same key fields are refused.
    let again = w.registry.call(charge(100).call_id("toolu_3")).await;
    assert!(matches!(refused(&again), CallError::ChangedParams { .. }));
    let record = w.record(&key).await.unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.operation.unwrap().args["cents"], 4900);
    assert_eq!(bank.effects(), 1);
    assert_eq!(bank.requests(), 2);
}

// ---------------------------------------------------------------------------------------
// 2. The test matrix, on the stores a user deploys.
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_reissued_call_with_a_new_tool_use_id_and_another_spelling_replays() {
    let bank = Bank::new(true, []);
    let w = World::new(ChargeTool::new(&bank));
    let first = w.registry.call(charge(4900)).await;
    let reissued = w
        .registry
        .call(
            ToolCall::from_json(
                RUN,
                "charge",
                "{\n  \"cents\": 4.9e3e0,\n  \"customer\": \"\\u0061cme\"\n}",
            )
            .call_id("toolu_2"),
        )
        .await;
    // `4.9e3e0` is not JSON: refused, not a new operation.
    assert!(matches!(
        refused(&reissued),
        CallError::MalformedJson { .. }
    ));
    let reissued = w
        .registry
        .call(
            ToolCall::from_json(
                RUN,
                "charge",
                "{\n  \"cents\": 4900,\n  \"customer\": \"\\u0061cme\"\n}",
            )
            .call_id("toolu_3"),
        )
        .await;
    assert!(reissued.replayed(), "{:?}", reissued.error());
    assert_eq!(reissued.key(), first.key());
    assert_eq!(reissued.output(), first.output());
    assert_eq!(reissued.call_id(), Some("toolu_3"));
    assert_eq!(bank.effects(), 1);
    assert_eq!(bank.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_tool_with_a_zero_window_is_never_retried() {
    let bank = Bank::new(true, [Step::LostResponse]);
    let tool = ChargeTool::new(&bank).spec(|s| s.window(Duration::ZERO));
    let w = World::new(tool);
    let r = w.registry.call(charge(4900)).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    assert_eq!(r.attempts(), 1);
    assert_eq!(bank.requests(), 1);
    assert_eq!(
        w.record(r.key().unwrap()).await.unwrap().state,
        RecordState::Unknown
    );
}

#[test]
fn zero_timeout_or_lease_fails_the_build() {
    let bank = Bank::new(false, []);
    for tool in [
        ChargeTool::new(&bank).spec(|s| s.timeout(Duration::ZERO)),
        ChargeTool::new(&bank).spec(|s| s.lease(Duration::ZERO)),
        // Too short to be renewed every third of itself: refused, not left to lapse under a
        // live handler.
        ChargeTool::new(&bank).spec(|s| s.lease(Duration::from_millis(1))),
    ] {
        let err = Registry::builder().tool(tool).build().unwrap_err();
        assert!(
            matches!(&err, BuildError::InvalidSpec { tool, .. } if tool == "charge"),
            "{err:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_keyed_write_is_unknown_and_never_sent_again() {
    let bank = Bank::new(true, [Step::Panic]);
    let w = World::new(ChargeTool::new(&bank));
    let r = w.registry.call(charge(4900)).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    assert_eq!(r.attempts(), 1, "a panic is not retried");
    let record = w.record(r.key().unwrap()).await.unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(record.attempts.len(), 1);
    assert!(record.attempts[0]
        .message
        .as_deref()
        .unwrap()
        .contains("panicked"));
    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Unknown));
    assert!(again.replayed());
    assert_eq!(bank.script.lock().unwrap().len(), 0);
    assert_eq!(bank.effects(), 0);
}

#[tokio::test(start_paused = true)]
async fn failed_and_pending_are_saved_and_replayed_without_running_again() {
    let bank = Bank::new(false, [Step::Fail, Step::Pending]);
    let w = World::new(ChargeTool::new(&bank));
    let failed = w.registry.call(charge(1)).await;
    assert_eq!(failed.class(), Some(OutcomeClass::Failed));
    let pending = w.registry.call(charge(2)).await;
    assert_eq!(pending.class(), Some(OutcomeClass::Pending));
    let failed_again = w.registry.call(charge(1).call_id("toolu_2")).await;
    let pending_again = w.registry.call(charge(2).call_id("toolu_3")).await;
    assert!(failed_again.replayed() && pending_again.replayed());
    assert!(matches!(
        failed_again.outcome(),
        Some(Outcome::Failed { downstream_ref: Some(r), .. }) if r == "ch_1"
    ));
    assert!(matches!(
        pending_again.outcome(),
        Some(Outcome::Pending { downstream_ref, .. }) if downstream_ref == "ch_2"
    ));
    assert!(pending_again.text().contains("not sent again"));
    assert_eq!(bank.requests(), 2);
    assert_eq!(
        w.record(failed.key().unwrap()).await.unwrap().state,
        RecordState::Failed
    );
    assert_eq!(
        w.record(pending.key().unwrap()).await.unwrap().state,
        RecordState::Pending
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_result_is_a_tombstone_for_completed_and_failed_alike() {
    let bank = Bank::new(false, [Step::Commit, Step::Fail]);
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(START));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()).retention(Retention {
        results: Duration::from_secs(3600),
        tombstones: Duration::from_secs(30 * 24 * 3600),
    }));
    let w = World::on(ChargeTool::new(&bank), store, clock, |b| b);
    let done = w.registry.call(charge(1).intent("order-1")).await;
    let failed = w.registry.call(charge(2)).await;
    assert_eq!(failed.class(), Some(OutcomeClass::Failed));
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;

    for (call, was, key) in [
        (
            charge(1).intent("order-1"),
            OutcomeClass::Completed,
            done.key().unwrap(),
        ),
        (charge(2), OutcomeClass::Failed, failed.key().unwrap()),
    ] {
        let r = w.registry.call(call.call_id("toolu_9")).await;
        assert_eq!(r.outcome(), Some(&Outcome::ResultExpired { was }));
        assert!(r.replayed());
        assert!(r.text().contains("result no longer kept"), "{}", r.text());
        // The model is told a failure is a failure, even once its details are gone.
        assert_eq!(r.is_error(), was == OutcomeClass::Failed);
        let tombstone = w.record(key).await.unwrap();
        assert!(tombstone.result_expired);
        assert!(tombstone.payload.is_none());
    }
    // Changed parameters against a tombstone are still refused.
    let changed = w.registry.call(charge(999).intent("order-1")).await;
    assert!(matches!(refused(&changed), CallError::ChangedParams { .. }));
    assert_eq!(bank.requests(), 2, "nothing ran twice");
}

#[tokio::test(start_paused = true)]
async fn scopes_never_share_results_tenant_principal_and_run() {
    let bank = Bank::new(false, []);
    let w = World::new(ChargeTool::new(&bank));
    let scopes = [
        charge(1),
        charge(1).tenant("t1"),
        charge(1).principal("t1"),
        charge(1).tenant("t1").principal("p1"),
        charge(1).tenant("t1").principal("p2"),
        charge(1).tenant("t2").principal("p1"),
        charge(1).tenant("p1").principal("t1"),
        charge(1).tenant(""),
        ToolCall::new("run-2", "charge", json!({"customer": "acme", "cents": 1})),
        charge(1).scope(Scope::run("run-3").with_tenant("t1")),
    ];
    let mut keys = Vec::new();
    for call in scopes.iter().cloned() {
        let r = w.registry.call(call).await;
        assert!(r.is_completed() && !r.replayed(), "{:?}", r.error());
        keys.push(r.key().unwrap().clone());
    }
    // Each scope asked again: replayed from its own record.
    for (call, key) in scopes.iter().cloned().zip(&keys) {
        let r = w.registry.call(call.call_id("toolu_9")).await;
        assert!(r.replayed());
        assert_eq!(r.key(), Some(key));
    }
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), scopes.len());
    assert_eq!(bank.effects(), scopes.len());
    // The saved operation remembers its scope.
    let record = w.record(&keys[3]).await.unwrap();
    let scope = record.operation.unwrap().scope;
    assert_eq!(
        (scope.run_id(), scope.tenant(), scope.principal()),
        (RUN, Some("t1"), Some("p1"))
    );
}

#[tokio::test(start_paused = true)]
async fn reads_never_claim_and_a_panicking_read_is_unknown() {
    let runs = Arc::new(AtomicU32::new(0));
    let panics = Arc::new(AtomicU32::new(0));
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(Balance {
            runs: runs.clone(),
            panic: false,
        })
        .tool(PanickyBalance(Balance {
            runs: panics.clone(),
            panic: true,
        }))
        .build()
        .unwrap();
    for _ in 0..3 {
        let r = registry
            .call(ToolCall::new(RUN, "balance", json!({"customer": "acme"})).intent("i-1"))
            .await;
        assert_eq!(r.output(), Some(&json!(4900)));
        assert!(r.key().is_none() && !r.replayed());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "reads are not deduplicated");
    let r = registry
        .call(ToolCall::new(
            RUN,
            "panicky_balance",
            json!({"customer": "acme"}),
        ))
        .await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    assert!(r.is_error());
    assert_eq!(panics.load(Ordering::SeqCst), 1);
    assert!(store.is_empty(), "reads never claim");
}

struct PanickyBalance(Balance);

impl ReadTool for PanickyBalance {
    type Args = BalanceArgs;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("panicky_balance")
    }
    async fn call(&self, ctx: ReadCtx, args: BalanceArgs) -> Result<u64, ToolError> {
        self.0.call(ctx, args).await
    }
}

// ---------------------------------------------------------------------------------------
// Leases: only a dead or stuck worker's claim may expire; evidence is never lost.
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_short_lease_never_expires_under_a_live_handler() {
    // The shortest lease the build accepts. The handler is alive and well.
    let bank = Bank::new(false, [Step::CommitAfter(Duration::from_millis(300))]);
    let tool = ChargeTool::new(&bank).spec(|s| s.lease(Duration::from_millis(10)));
    let w = World::new(tool);
    let original = tokio::spawn({
        let r = w.registry.clone();
        async move { r.call(charge(4900).intent("order-1")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let key = intent_key(&Scope::run(RUN), "order-1");
    let mid = w.record(&key).await.unwrap();
    // A duplicate in the meantime should wait for the live original, not be told "unknown".
    let dup = w.registry.call(charge(4900).intent("order-1")).await;
    let original = original.await.unwrap();
    assert!(original.is_completed());
    assert_eq!(bank.effects(), 1);
    assert_eq!(
        mid.state,
        RecordState::Running,
        "the handler was still running: {mid:?}"
    );
    assert_eq!(dup.class(), Some(OutcomeClass::Completed), "{dup:?}");
}

#[tokio::test(start_paused = true)]
async fn a_tombstone_retention_shorter_than_the_result_retention_never_frees_a_key_early() {
    // A plausible misreading of the two knobs ("keep tombstones 1 h longer"): the contract says
    // the tombstone outlives the result; this configuration makes it die first.
    let bank = Bank::new(false, []);
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(START));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()).retention(Retention {
        results: Duration::from_secs(2 * 3600),
        tombstones: Duration::from_secs(3600),
    }));
    let w = World::on(ChargeTool::new(&bank), store, clock, |b| b);
    let first = w.registry.call(charge(4900)).await;
    assert!(first.is_completed());
    tokio::time::sleep(Duration::from_secs(90 * 60)).await;
    // Inside the result retention: the saved result must still be replayed.
    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(
        bank.effects(),
        1,
        "a second charge inside the retention window"
    );
    assert!(again.replayed(), "{again:?}");
}

// ---------------------------------------------------------------------------------------
// Reconciler and a person.
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_late_commit_after_an_escalation_is_kept_as_evidence_for_the_person() {
    // Unkeyed, no read-back, no in-flight bound: the worker holds the timed-out handler for
    // the default bound (2 min). A reconciler elsewhere on the same store, whose registry
    // sets a 1 s default bound (every registry should set the same; this one does not),
    // escalates after that second. The original commits after that.
    let bank = Bank::new(false, [Step::CommitAfter(Duration::from_secs(10))]);
    let spec = |s: ToolSpec| s.timeout(Duration::from_secs(2));
    let w = World::new(ChargeTool::new(&bank).spec(spec));
    let elsewhere = World::on(
        ChargeTool::new(&bank).spec(spec),
        w.store.clone(),
        w.store.clock(),
        |b| b.default_in_flight_bound(Duration::from_secs(1)),
    );
    let r = w.registry.call(charge(4900)).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    let key = r.key().unwrap().clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sink = {
        let escalations = w.escalations.clone();
        CallbackSink(move |e: &Escalation| escalations.lock().unwrap().push(e.clone()))
    };
    let decisions = Reconciler::new(&elsewhere.registry)
        .sink(Arc::new(sink))
        .run_all()
        .await
        .unwrap();
    assert_eq!(decisions[0].action, Action::Escalated);
    // The charge lands while a person is looking at the escalation.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(bank.effects(), 1);
    let record = w.record(&key).await.unwrap();
    assert_eq!(record.state, RecordState::Escalated);
    // The contract: "a late result from the original attempt is kept as evidence". Without it the
    // person sees one timed-out attempt and nothing else, and may well release the key.
    let late = record
        .attempts
        .iter()
        .any(|a| a.class == OutcomeClass::Completed);
    assert!(
        late,
        "the late commit is not in the record: {:?}",
        record.attempts
    );
    // And the person is told, through the same sink that told them of the escalation.
    let notices = w.escalations.lock().unwrap();
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(
        notices[1].reason.contains("late"),
        "{:?}",
        notices[1].reason
    );
    assert!(notices[1]
        .attempts
        .iter()
        .any(|a| a.class == OutcomeClass::Completed));
}

#[tokio::test(start_paused = true)]
async fn a_read_back_settles_an_unknown_write_and_repeats_replay_it() {
    let bank = Bank::new(false, [Step::LostResponse]);
    let tool = ChargeTool::new(&bank).with_read_back();
    let w = World::new(tool);
    let r = w.registry.call(charge(4900)).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    assert_eq!(bank.effects(), 1);
    let decisions = Reconciler::new(&w.registry).run_once().await.unwrap();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].action, Action::Settled);
    let record = w.record(r.key().unwrap()).await.unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.downstream_ref.as_deref(), Some("ch_1"));
    assert_eq!(record.read_backs.len(), 1);
    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert!(again.replayed());
    assert_eq!(again.output(), Some(&json!("ch_1")));
    assert_eq!(bank.requests(), 1);
    assert_eq!(bank.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn not_found_frees_the_intent_only_after_the_in_flight_bound() {
    let bank = Bank::new(false, [Step::Reset]);
    let bound = Duration::from_secs(60);
    let tool = ChargeTool::new(&bank)
        .with_read_back()
        .spec(|s| s.in_flight_bound(bound));
    let w = World::new(tool);
    let r = w.registry.call(charge(4900)).await;
    let key = r.key().unwrap().clone();
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    let reconciler = Reconciler::new(&w.registry);

    // Not found, but the original could still land: wait, keep the key, note the evidence.
    let decisions = reconciler.run_all().await.unwrap();
    assert_eq!(decisions[0].action, Action::Waiting);
    let record = w.record(&key).await.unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(record.read_backs.len(), 1);
    let blocked = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(blocked.class(), Some(OutcomeClass::Unknown));
    assert_eq!(bank.requests(), 1);

    // Past timeout + twice the bound: "not found" means "did not happen"; the key is freed.
    tokio::time::sleep(Duration::from_secs(10) + bound * 2 + Duration::from_secs(1)).await;
    let decisions = reconciler.run_all().await.unwrap();
    assert_eq!(decisions[0].action, Action::Released);
    assert!(w.record(&key).await.is_none());
    let rerun = w.registry.call(charge(4900).call_id("toolu_3")).await;
    assert!(rerun.is_completed() && !rerun.replayed());
    assert_eq!(rerun.key(), Some(&key));
    assert_eq!(bank.requests(), 2);
    assert_eq!(bank.effects(), 1, "one effect in all");
}

#[tokio::test(start_paused = true)]
async fn an_escalation_holds_every_attempt_and_read_back_and_a_person_resolves_it() {
    // Unkeyed, a handler that hangs, and a read-back whose lookup keeps failing: a person.
    let bank = Bank::new(false, [Step::Hang, Step::Reset]);
    bank.lookup_down.store(true, Ordering::SeqCst);
    let tool = ChargeTool::new(&bank)
        .with_read_back()
        .spec(|s| s.timeout(Duration::from_secs(2)));
    let w = World::new(tool);
    let r = w.registry.call(charge(4900)).await;
    let key = r.key().unwrap().clone();
    assert_eq!(r.class(), Some(OutcomeClass::Unknown));
    let reconciler = Reconciler::new(&w.registry).max_failed_read_backs(2);
    // The timed-out handler may still report: the reconciler gives it its grace first (the
    // default in-flight bound, 2 min, after which the worker drops the handler).
    let decisions = reconciler.run_all().await.unwrap();
    assert_eq!(decisions[0].action, Action::Waiting);
    assert!(w.escalations.lock().unwrap().is_empty());
    tokio::time::sleep(Duration::from_secs(121)).await;
    let decisions = reconciler.run_all().await.unwrap();
    assert_eq!(decisions[0].action, Action::Waiting, "one failed read-back");
    let decisions = reconciler.run_all().await.unwrap();
    assert_eq!(decisions[0].action, Action::Escalated, "two in a row");
    let record = w.record(&key).await.unwrap();
    assert_eq!(record.state, RecordState::Escalated);

    let escalations = w.escalations.lock().unwrap().clone();
    assert_eq!(escalations.len(), 1);
    let e = &escalations[0];
    assert_eq!(e.key, key);
    assert_eq!(e.state, RecordState::Escalated);
    assert_eq!(e.attempts.len(), 2, "the timeout and the abandonment");
    assert!(e.attempts[0].started_at <= e.attempts[0].finished_at);
    assert!(e.attempts[0]
        .message
        .as_deref()
        .unwrap()
        .contains("timed out"));
    assert_eq!(e.attempts[1].kind, idem::store::AttemptKind::Abandoned);
    assert_eq!(e.read_backs.len(), 2);
    assert!(e
        .read_backs
        .iter()
        .all(|rb| rb.result == "error: outcome unknown: lookup answered 503"));
    assert_eq!(e.operation.as_ref().unwrap().args["cents"], 4900);

    // Escalated: repeats are told so and never sent.
    let again = w.registry.call(charge(4900).call_id("toolu_2")).await;
    assert_eq!(again.class(), Some(OutcomeClass::Escalated));
    assert_eq!(bank.requests(), 1);

    // A person: it did happen (found in the dashboard).
    let store: &dyn IdemStore = &*w.store;
    let resolved = resolve(
        store,
        &key,
        Resolution::Completed {
            downstream_ref: "ch_manual".into(),
            output: Some(json!("ch_manual")),
        },
        "found in the dashboard",
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resolved.state, RecordState::Completed);
    let replay = w.registry.call(charge(4900).call_id("toolu_3")).await;
    assert!(replay.replayed());
    assert_eq!(replay.output(), Some(&json!("ch_manual")));
    assert_eq!(bank.requests(), 1);
    // Nothing left to decide on a completed record, and nothing on a missing one.
    let err = resolve(store, &key, Resolution::Release, "")
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ResolveError::NotResolvable {
            state: RecordState::Completed,
            ..
        }
    ));
    let missing = intent_key(&Scope::run(RUN), "never-sent");
    let err = resolve(store, &missing, Resolution::Release, "")
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::NotFound(_)));

    // Another operation, released by a person: the next call runs it again, once.
    let other = w.registry.call(charge(100)).await;
    assert_eq!(other.class(), Some(OutcomeClass::Unknown));
    let other_key = other.key().unwrap().clone();
    assert!(resolve(
        store,
        &other_key,
        // Sent just now: only a forced release frees it inside the in-flight bound.
        Resolution::ForceRelease {
            reason: "the bank's log has no such request".into()
        },
        "not in the ledger"
    )
    .await
    .unwrap()
    .is_none());
    assert!(w.record(&other_key).await.is_none());
    let rerun = w.registry.call(charge(100).call_id("toolu_4")).await;
    assert!(rerun.is_completed() && !rerun.replayed());
    assert_eq!(bank.requests(), 3);
}

// ---------------------------------------------------------------------------------------
// Definitions.
// ---------------------------------------------------------------------------------------

#[idem::args]
struct RefundArgs {
    /// The charge to refund.
    charge: String,
    /// Optional memo.
    memo: Option<String>,
}

/// Refund a charge in full.
#[tool(
    write,
    destructive,
    downstream = "keyed",
    key(charge),
    key_travels = "nowhere: no downstream, the tests read its definition"
)]
async fn refund_charge(_ctx: WriteCtx, args: RefundArgs) -> Result<String, ToolError> {
    Ok(args.charge)
}

/// Look up a charge.
#[tool(read, name = "get-charge")]
async fn get_charge(_ctx: ReadCtx, args: RefundArgs) -> Result<String, ToolError> {
    Ok(args.charge)
}

#[test]
fn definitions_carry_names_descriptions_schemas_and_hints_in_every_format() {
    let bank = Bank::new(false, []);
    let registry = Registry::builder()
        .tool(refund_charge)
        .tool(get_charge)
        .tool(ChargeTool::new(&bank))
        .build()
        .unwrap();
    let names = ["refund_charge", "get-charge", "charge"];

    let openai = registry.definitions(Format::OpenAi);
    assert_eq!(openai.len(), 3);
    for (d, name) in openai.iter().zip(names) {
        assert_eq!(d["type"], "function");
        assert_eq!(d["function"]["name"], name);
        assert!(d["function"]["description"].as_str().unwrap().len() > 3);
        assert_eq!(d["function"]["parameters"]["type"], "object");
    }
    assert_eq!(
        openai[0]["function"]["description"],
        "Refund a charge in full."
    );
    let params = &openai[0]["function"]["parameters"];
    assert_eq!(params["required"], json!(["charge"]));
    assert!(params["properties"]["memo"].is_object());

    let anthropic = registry.definitions(Format::Anthropic);
    for (d, name) in anthropic.iter().zip(names) {
        let keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
        assert_eq!(d["name"], name);
        assert_eq!(d["input_schema"]["type"], "object");
    }

    let mcp = registry.definitions(Format::Mcp);
    let hints = |i: usize| {
        let a = &mcp[i]["annotations"];
        (
            a["readOnlyHint"].as_bool(),
            a["destructiveHint"].as_bool(),
            a["idempotentHint"].as_bool(),
        )
    };
    assert_eq!(mcp[0]["inputSchema"]["type"], "object");
    assert_eq!(hints(0), (Some(false), Some(true), Some(true)));
    assert_eq!(hints(1), (Some(true), Some(false), Some(true)));
    assert_eq!(hints(2), (Some(false), Some(false), Some(true)));

    // The macro's options reached the spec the executor uses.
    let refund = registry.get("refund_charge").unwrap().spec();
    assert_eq!(refund.downstream_kind(), Downstream::Keyed);
    assert!(refund.is_destructive());
    assert_eq!(refund.key_field_names().collect::<Vec<_>>(), ["charge"]);
}

// ---------------------------------------------------------------------------------------
// SQLite: durable across restarts.
// ---------------------------------------------------------------------------------------

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::PathBuf;

    use super::*;
    use idem::store::ManualClock;
    use idem::SqliteStore;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "idem-semantics-{name}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn db(&self) -> PathBuf {
            self.0.join("idem.sqlite3")
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    async fn open(dir: &TempDir, clock: &ManualClock, retention: Retention) -> SqliteStore {
        SqliteStore::builder(dir.db())
            .clock(Arc::new(clock.clone()))
            .retention(retention)
            .open()
            .await
            .unwrap()
    }

    fn registry_on(store: &SqliteStore, clock: &ManualClock, tool: ChargeTool) -> Registry {
        Registry::builder()
            .store(store.clone())
            .clock(Arc::new(clock.clone()))
            .tool(tool)
            .build()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_duplicates_on_sqlite_execute_once() {
        let dir = TempDir::new("concurrent");
        let clock = ManualClock::new(START);
        let store = open(&dir, &clock, Retention::default()).await;
        let bank = Bank::new(false, [Step::CommitAfter(Duration::from_millis(50))]);
        let registry = registry_on(&store, &clock, ChargeTool::new(&bank));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..8 {
            let registry = registry.clone();
            set.spawn(async move {
                registry
                    .call(charge(4900).call_id(format!("toolu_{i}")))
                    .await
            });
        }
        let results = set.join_all().await;
        assert_eq!(bank.effects(), 1);
        assert_eq!(bank.requests(), 1);
        assert_eq!(results.iter().filter(|r| !r.replayed()).count(), 1);
        for r in &results {
            assert!(r.is_completed(), "{r:?}");
            assert_eq!(r.output(), Some(&json!("ch_1")));
        }
        let record = store.get(results[0].key().unwrap()).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Completed);
        assert_eq!(record.attempts.len(), 1);
    }

    #[tokio::test]
    async fn a_crash_between_claim_and_complete_is_unknown_after_restart_never_free() {
        let dir = TempDir::new("crash");
        let clock = ManualClock::new(START);
        let bank = Bank::new(false, [Step::Hang]);
        let key = {
            let store = open(&dir, &clock, Retention::default()).await;
            let registry = registry_on(&store, &clock, ChargeTool::new(&bank));
            let started = bank.started.notified();
            let worker = tokio::spawn({
                let registry = registry.clone();
                async move { registry.call(charge(4900)).await }
            });
            started.await;
            // The worker dies with the request sent and nothing settled.
            worker.abort();
            assert!(worker.await.unwrap_err().is_cancelled());
            let running = store.list(RecordState::Running, 10).await.unwrap();
            assert_eq!(running.len(), 1);
            running[0].key.clone()
        };
        assert_eq!(bank.requests(), 1);

        // Restart before the lease passes: still running (in flight), not sent again.
        let store = open(&dir, &clock, Retention::default()).await;
        let registry = Registry::builder()
            .store(store.clone())
            .clock(Arc::new(clock.clone()))
            .in_flight_wait(Duration::ZERO)
            .tool(ChargeTool::new(&bank))
            .build()
            .unwrap();
        let early = registry.call(charge(4900).call_id("toolu_2")).await;
        assert!(matches!(refused(&early), CallError::InFlight { .. }));
        assert_eq!(bank.requests(), 1);

        // After the lease (timeout + 30 s): unknown, never free.
        clock.advance(Duration::from_secs(41));
        let after = registry.call(charge(4900).call_id("toolu_3")).await;
        assert_eq!(after.class(), Some(OutcomeClass::Unknown));
        assert!(after.replayed());
        assert_eq!(after.key(), Some(&key));
        assert_eq!(bank.requests(), 1);
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Unknown);
        assert!(
            record.operation.is_some(),
            "what was asked for survived the crash"
        );

        // No key contract, no read-back: the reconciler hands it to a person, who settles it.
        let decisions = Reconciler::new(&registry).run_all().await.unwrap();
        assert_eq!(decisions.len(), 1);
        assert_eq!(decisions[0].action, Action::Escalated);
        resolve(
            &store,
            &key,
            Resolution::Completed {
                downstream_ref: "ch_1".into(),
                output: None,
            },
            "",
        )
        .await
        .unwrap();
        drop(registry);
        drop(store);
        let store = open(&dir, &clock, Retention::default()).await;
        let registry = registry_on(&store, &clock, ChargeTool::new(&bank));
        let replay = registry.call(charge(4900).call_id("toolu_4")).await;
        assert!(replay.replayed());
        assert_eq!(replay.output(), Some(&json!({"downstream_ref": "ch_1"})));
        assert_eq!(bank.requests(), 1);
    }

    // On tokio's paused clock: the 30 s timeout certainly fires before the 90 s commit,
    // whatever the machine's load.
    #[tokio::test(start_paused = true)]
    async fn a_timed_out_original_that_commits_late_settles_its_sqlite_record() {
        let dir = TempDir::new("late");
        let clock = ManualClock::new(START);
        let store = open(&dir, &clock, Retention::default()).await;
        let bank = Bank::new(false, [Step::CommitAfter(Duration::from_secs(90))]);
        let tool = ChargeTool::new(&bank).spec(|s| s.timeout(Duration::from_secs(30)));
        let registry = registry_on(&store, &clock, tool);
        let r = registry.call(charge(4900)).await;
        assert_eq!(
            r.class(),
            Some(OutcomeClass::Unknown),
            "a timeout is unknown"
        );
        assert!(!r.is_completed());
        let key = r.key().unwrap().clone();
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Unknown);
        assert!(record.attempts[0]
            .message
            .as_deref()
            .unwrap()
            .contains("timed out"));
        // Meanwhile, a repeat is not sent.
        let during = registry.call(charge(4900).call_id("toolu_2")).await;
        assert_eq!(during.class(), Some(OutcomeClass::Unknown));
        assert_eq!(bank.requests(), 1);

        // Still unknown just before the original commits (t = 89 s)…
        tokio::time::sleep(Duration::from_secs(59)).await;
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Unknown);
        assert_eq!(bank.effects(), 0);
        // …and its late result settles the record once it does (t = 90 s).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Completed, "{record:?}");
        assert_eq!(bank.effects(), 1);
        let replay = registry.call(charge(4900).call_id("toolu_3")).await;
        assert!(replay.replayed());
        assert_eq!(replay.output(), Some(&json!("ch_1")));
        assert_eq!(bank.requests(), 1);
    }

    #[tokio::test]
    async fn an_expired_result_stays_a_tombstone_across_a_restart() {
        let dir = TempDir::new("tombstone");
        let clock = ManualClock::new(START);
        let retention = Retention {
            results: Duration::from_secs(3600),
            tombstones: Duration::from_secs(30 * 24 * 3600),
        };
        let bank = Bank::new(false, []);
        {
            let store = open(&dir, &clock, retention).await;
            let r = registry_on(&store, &clock, ChargeTool::new(&bank))
                .call(charge(4900).intent("order-1"))
                .await;
            assert!(r.is_completed());
        }
        clock.advance(Duration::from_secs(25 * 3600));
        let store = open(&dir, &clock, retention).await;
        let registry = registry_on(&store, &clock, ChargeTool::new(&bank));
        let r = registry
            .call(charge(4900).intent("order-1").call_id("toolu_2"))
            .await;
        assert_eq!(
            r.outcome(),
            Some(&Outcome::ResultExpired {
                was: OutcomeClass::Completed
            })
        );
        assert_eq!(bank.requests(), 1, "never a second execution");
        let tombstone = store.get(r.key().unwrap()).await.unwrap().unwrap();
        assert!(tombstone.result_expired && tombstone.payload.is_none());
        // Changed parameters against the tombstone: still refused.
        let changed = registry.call(charge(9900).intent("order-1")).await;
        assert!(matches!(refused(&changed), CallError::ChangedParams { .. }));
        assert_eq!(bank.requests(), 1);
    }
}
