//! Fuzzing the public entry points on stable Rust (proptest): `Registry::call` with
//! arbitrary JSON text and arbitrary `serde_json::Value`s, the call's ids and tool name, and
//! the canonical serializer against serde_json's own output.
//!
//! The oracle for arguments is serde itself: a call must run exactly when its arguments are
//! a JSON object within the size limit that decodes into the tool's `Args` type (text as it
//! stands or, failing that and unless a field is given twice, through a `Value`, as it is
//! or with its whole floats written as integers). What
//! is asserted is what happened, on the tool's ledger and in the store: an accepted call ran
//! the handler once, left one completed record holding the canonical form of the decoded
//! arguments, and a repeat replayed it without running again; a refused call ran nothing
//! and left no record. A panic anywhere fails the case (proptest catches it and shrinks).
//!
//! Inputs include duplicate keys, numbers at the edges (`u64::MAX` and one past it, `-0`,
//! `1e308`, `1e309`, 2^53 + 1), lone surrogates, NUL, strings around the size limit, and
//! `Value`s nested up to 200 levels (deeper ones are a known stack overflow, tracked
//! separately). 256 cases per property by default; `PROPTEST_CASES=N` raises it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use idem::registry::MAX_ARGS_DEPTH;
use idem::{
    store::RecordState,
    tool::{ToolSpec, WriteTool},
    CallError, IdemStore, MemoryStore, Outcome, Registry, ToolCall, ToolError, WriteCtx,
};
use idem_runtime::identity::canonical::to_canonical_vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Number, Value};

/// The registry's argument size limit in these tests (small, so strings can cross it).
const LIMIT: usize = 16 * 1024;
const DEFAULT_CASES: u32 = 256;
const RUN: &str = "run-fuzz";

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    amount: u64,
    memo: Option<String>,
    rate: Option<f64>,
    meta: Option<Value>,
}

/// A write tool that only counts: every run is one effect on its ledger.
#[derive(Default)]
struct Ledger {
    runs: AtomicU32,
    args: Mutex<Vec<ChargeArgs>>,
}

struct Charge(Arc<Ledger>);

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = u32;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge").description("Charge a customer.")
    }

    async fn call(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<u32, ToolError> {
        self.0.args.lock().unwrap().push(args);
        Ok(self.0.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

struct Fixture {
    registry: Registry,
    store: MemoryStore,
    ledger: Arc<Ledger>,
}

fn fixture() -> Fixture {
    let store = MemoryStore::new();
    let ledger = Arc::new(Ledger::default());
    let registry = Registry::builder()
        .tool(Charge(ledger.clone()))
        .store(store.clone())
        .max_args_bytes(LIMIT)
        .build()
        .expect("the registry builds");
    Fixture {
        registry,
        store,
        ledger,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn run_property<S: Strategy>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    if let Err(e) = runner.run(&strategy, test) {
        let e = e.to_string();
        let shown: String = e.chars().take(4000).collect();
        panic!("{name}: {shown}");
    }
    eprintln!(
        "{name}: {} cases passed in {:.1?}",
        cases(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// What a call must have done
// ---------------------------------------------------------------------------------------

/// Longest model-facing text seen for a refused call (reported, not asserted: bounding it
/// is tracked separately).
static LONGEST_REFUSAL_TEXT: AtomicU32 = AtomicU32::new(0);

/// Checks one call against the oracle's verdict: `Some(args)` = it must run with exactly
/// these arguments; `None` = it must be refused having run nothing and recorded nothing.
fn check(
    rt: &tokio::runtime::Runtime,
    make: impl Fn() -> ToolCall,
    want: Option<ChargeArgs>,
    too_large: bool,
) -> Result<(), TestCaseError> {
    let f = fixture();
    let result = rt.block_on(f.registry.call(make()));
    let runs = f.ledger.runs.load(Ordering::SeqCst);
    match want {
        None => {
            let Err(e) = result.as_result() else {
                return Err(TestCaseError::fail(format!(
                    "serde refuses these arguments, the registry ran them: {result:?}"
                )));
            };
            prop_assert!(
                matches!(
                    e,
                    CallError::MalformedJson { .. }
                        | CallError::InvalidArgs { .. }
                        | CallError::ArgsTooLarge { .. }
                ),
                "a refusal of bad arguments must say so, got {e:?}"
            );
            prop_assert_eq!(
                matches!(e, CallError::ArgsTooLarge { .. }),
                too_large,
                "ArgsTooLarge exactly when the arguments exceed the limit: {:?}",
                e
            );
            prop_assert_eq!(runs, 0, "a refused call ran the handler");
            prop_assert!(f.store.is_empty(), "a refused call left a record");
            let len = u32::try_from(result.text().len()).unwrap_or(u32::MAX);
            LONGEST_REFUSAL_TEXT.fetch_max(len, Ordering::Relaxed);
        }
        Some(args) => {
            prop_assert!(
                matches!(result.outcome(), Some(Outcome::Completed { .. })),
                "serde accepts these arguments, the registry did not run them: {:?}",
                result.as_result()
            );
            prop_assert_eq!(runs, 1, "an accepted call must run exactly once");
            prop_assert_eq!(&f.ledger.args.lock().unwrap()[0], &args);
            // The record holds the canonical form of the typed arguments.
            let key = result.key().expect("a write has a key").clone();
            let record = rt
                .block_on(f.store.get(&key))
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .ok_or_else(|| TestCaseError::fail("no record for an accepted call"))?;
            prop_assert_eq!(record.state, RecordState::Completed);
            let saved: &Value = &record.operation.as_ref().expect("the operation").args;
            prop_assert_eq!(saved, &serde_json::to_value(&args).unwrap());
            // A repeat replays; the handler does not run again.
            let again = rt.block_on(f.registry.call(make()));
            prop_assert!(again.replayed(), "a repeat must replay: {:?}", again);
            prop_assert_eq!(f.ledger.runs.load(Ordering::SeqCst), 1);
            prop_assert_eq!(f.store.len(), 1);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Arguments as JSON text
// ---------------------------------------------------------------------------------------

/// Value texts for fields: edge numbers, odd strings, nesting.
fn value_text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "-0",
            "-0.0",
            "1",
            "-1",
            "1.0",
            "1e2",
            "1E2",
            "0.1e1",
            "00",
            "01",
            "18446744073709551615",
            "18446744073709551616",
            "9223372036854775807",
            "-9223372036854775808",
            "-9223372036854775809",
            "9007199254740993",
            "1e308",
            "1e309",
            "-1e309",
            "4.9e-324",
            "2.4e-324",
            "0.30000000000000004",
            "1.5",
            "NaN",
            "Infinity",
            "-Infinity",
            "null",
            "true",
            "false",
            "[]",
            "{}",
            "[1,2]",
            "{\"a\":{\"b\":[]}}",
            "\"acme\"",
            "\"\"",
            "\"\\u0000\"",
            "\"\\ud800\"",
            "\"\\udc00\\ud800\"",
            "\"\\ud83d\\ude00\"",
            "\"caf\u{e9}\"",
            "\"\\\"\"",
            "\"\\x41\"",
            "\"tab\there\"",
            "\"1\"",
            "'single'",
            "undefined",
        ])
        .prop_map(str::to_owned),
        (1usize..200).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
        (1usize..200).prop_map(|d| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))),
        (0usize..LIMIT + 64).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
        "\\PC{0,16}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ]
}

fn field_name() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "customer",
        "customer",
        "amount",
        "amount",
        "memo",
        "rate",
        "meta",
        "extra",
        "Amount",
        "",
        "cust\\u006fmer",
        "amount\u{0}",
    ])
    .prop_map(|s| {
        serde_json::to_string(s)
            .unwrap()
            .replace("\\\\u006f", "\\u006f")
    })
}

/// An object built from fields (duplicates likely), with odd whitespace; or arbitrary text.
fn args_text() -> impl Strategy<Value = String> {
    let object = (
        prop::collection::vec((field_name(), value_text()), 0..6),
        prop::sample::select(vec!["", " ", "\n\t", "\u{a0}"]),
        any::<bool>(),
    )
        .prop_map(|(fields, ws, trailing_comma)| {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{ws}{k}{ws}:{ws}{v}"))
                .collect();
            let comma = if trailing_comma && !body.is_empty() {
                ","
            } else {
                ""
            };
            format!("{ws}{{{}{comma}}}{ws}", body.join(","))
        });
    let valid = (
        "\\PC{0,12}",
        any::<u64>(),
        prop::option::of("\\PC{0,12}"),
        prop::option::of(any::<f64>()),
    )
        .prop_map(|(customer, amount, memo, rate)| {
            let mut m = Map::new();
            m.insert("customer".into(), Value::String(customer));
            m.insert("amount".into(), amount.into());
            if let Some(memo) = memo {
                m.insert("memo".into(), Value::String(memo));
            }
            if let Some(r) = rate.and_then(Number::from_f64) {
                m.insert("rate".into(), Value::Number(r));
            }
            serde_json::to_string(&Value::Object(m)).unwrap()
        });
    prop_oneof![
        4 => object,
        3 => valid.clone(),
        // A valid object with one byte cut off or one byte inserted.
        2 => (valid, any::<prop::sample::Index>(), any::<u8>(), any::<bool>()).prop_map(
            |(text, at, byte, cut)| {
                let mut bytes = text.into_bytes();
                let i = at.index(bytes.len() + 1);
                if cut && i < bytes.len() {
                    bytes.remove(i);
                } else {
                    bytes.insert(i.min(bytes.len()), byte);
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
        ),
        1 => "\\PC{0,64}",
        1 => ".{0,64}",
    ]
}

/// serde's verdict on a `Value`, or failing that on the `Value` with every whole float
/// below 2^53 written as an integer (an integer field given as `4900.0`, which JSON Schema's
/// `"integer"` allows).
/// How many levels `v` nests, as the registry counts them (a scalar is one).
fn levels(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(levels).max().unwrap_or(0),
        Value::Object(map) => map.values().map(levels).max().unwrap_or(0),
        _ => 0,
    }
}

fn decode_value(value: &Value) -> Option<ChargeArgs> {
    fn whole_floats_as_integers(v: &Value) -> Value {
        match v {
            Value::Number(n) if n.is_f64() => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                    Value::from(f as i64)
                }
                _ => v.clone(),
            },
            Value::Array(items) => {
                Value::Array(items.iter().map(whole_floats_as_integers).collect())
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), whole_floats_as_integers(v)))
                    .collect(),
            ),
            _ => v.clone(),
        }
    }
    serde_json::from_value(value.clone())
        .or_else(|_| serde_json::from_value(whole_floats_as_integers(value)))
        .ok()
}

#[test]
fn text_arguments_run_exactly_when_serde_accepts_them() {
    let rt = runtime();
    run_property("text arguments", args_text(), |text| {
        let first = text
            .bytes()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
        let too_large = text.len() > LIMIT;
        // Text that does not decode as it stands is parsed into a `Value` and decoded from
        // that (so text and `Value` calls are refused or accepted alike), except a field
        // given twice, which serde refuses and the `Value` would hide (the last one wins).
        let decoded = match serde_json::from_str::<ChargeArgs>(&text) {
            Ok(args) => Some(args),
            Err(e) if e.to_string().starts_with("duplicate field `") => None,
            Err(_) => serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| decode_value(&v)),
        };
        // Arguments nested past the limit are refused, however the type would read them.
        let too_deep =
            serde_json::from_str::<Value>(&text).is_ok_and(|v| levels(&v) > MAX_ARGS_DEPTH);
        let want = decoded.filter(|_| first == Some(b'{') && !too_large && !too_deep);
        check(
            &rt,
            || ToolCall::from_json(RUN, "charge", text.clone()),
            want,
            too_large,
        )
    });
    eprintln!(
        "longest model-facing text of a refused call: {} bytes",
        LONGEST_REFUSAL_TEXT.load(Ordering::Relaxed)
    );
}

// ---------------------------------------------------------------------------------------
// Arguments as `serde_json::Value`
// ---------------------------------------------------------------------------------------

fn edge_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            Value::from(0u64),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from(-1i64),
            Value::from(9_007_199_254_740_993u64),
        ]),
        prop::sample::select(vec![
            -0.0f64,
            0.0,
            1e308,
            -1e308,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            0.1 + 0.2,
            18_446_744_073_709_551_616.0,
            4900.0,
            f64::NAN,
            f64::INFINITY,
        ])
        // NaN and ±∞ have no JSON number: `from_f64` gives None, and the field is null.
        .prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<i64>().prop_map(Value::from),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        edge_number(),
        "\\PC{0,16}".prop_map(Value::String),
        ".{0,8}".prop_map(Value::String),
    ]
}

/// Any JSON value, a few levels deep and wide.
fn arb_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `inner` wrapped in `depth` arrays or single-key objects.
fn nested(depth: usize, objects: bool, inner: Value) -> Value {
    (0..depth).fold(inner, |v, i| {
        if objects && i % 2 == 0 {
            let mut m = Map::new();
            m.insert("k".into(), v);
            Value::Object(m)
        } else {
            Value::Array(vec![v])
        }
    })
}

fn field_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => leaf(),
        2 => arb_value(),
        // Inside the arguments object: at most 126 levels in all. Deeper accepted arguments
        // are a known bug (`deeply_nested_arguments_are_refused_or_saved_intact`); whole
        // arguments nested up to 200 levels are generated by `args_value` below.
        1 => (0usize..=124, any::<bool>(), leaf()).prop_map(|(d, o, v)| nested(d, o, v)),
        1 => (LIMIT - 128..LIMIT + 16).prop_map(|n| Value::String("y".repeat(n))),
    ]
}

fn args_value() -> impl Strategy<Value = Value> {
    let fields = prop::collection::btree_map(
        prop::sample::select(vec![
            "customer", "amount", "memo", "rate", "meta", "extra", "Amount", "",
        ]),
        field_value(),
        0..6,
    );
    let plausible = (
        "\\PC{0,12}",
        prop_oneof![edge_number(), any::<u64>().prop_map(Value::from)],
        prop::option::of(field_value()),
        prop::option::of(prop_oneof![
            3 => "\\PC{0,12}".prop_map(Value::String),
            1 => field_value(),
        ]),
    )
        .prop_map(|(customer, amount, meta, memo)| {
            let mut m = Map::new();
            m.insert("customer".into(), Value::String(customer));
            m.insert("amount".into(), amount);
            if let Some(meta) = meta {
                m.insert("meta".into(), meta);
            }
            if let Some(memo) = memo {
                m.insert("memo".into(), memo);
            }
            Value::Object(m)
        });
    prop_oneof![
        3 => plausible,
        2 => fields.prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        1 => arb_value(),
        1 => (0usize..=200, any::<bool>(), leaf()).prop_map(|(d, o, v)| nested(d, o, v)),
    ]
}

#[test]
fn value_arguments_run_exactly_when_serde_accepts_them() {
    let rt = runtime();
    run_property("value arguments", args_value(), |value| {
        let size = serde_json::to_vec(&value).unwrap().len();
        let too_large = size > LIMIT;
        let too_deep = levels(&value) > MAX_ARGS_DEPTH;
        let want = decode_value(&value).filter(|_| value.is_object() && !too_large && !too_deep);
        check(
            &rt,
            || ToolCall::new(RUN, "charge", value.clone()),
            want,
            too_large,
        )
    });
}

// ---------------------------------------------------------------------------------------
// The call around the arguments: ids and the tool's name
// ---------------------------------------------------------------------------------------

fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "\\PC{1,16}",
        1 => Just(String::new()),
        1 => (1020usize..1030).prop_map(|n| "r".repeat(n)),
        1 => (340usize..344).prop_map(|n| "\u{20ac}".repeat(n)),
        1 => "\u{0}{1,3}",
    ]
}

#[derive(Debug, Clone)]
struct CallShape {
    tool: String,
    run: String,
    tenant: Option<String>,
    principal: Option<String>,
    intent: Option<String>,
}

#[test]
fn invalid_calls_are_refused_before_anything_runs() {
    let rt = runtime();
    let shape = (
        prop_oneof![3 => Just("charge".to_owned()), 1 => "\\PC{0,80}", 1 => Just("Charge".to_owned())],
        id(),
        prop::option::of(id()),
        prop::option::of(id()),
        prop::option::of(id()),
    )
        .prop_map(|(tool, run, tenant, principal, intent)| CallShape {
            tool,
            run,
            tenant,
            principal,
            intent,
        });
    run_property("call shapes", shape, |c| {
        let f = fixture();
        let make = || {
            let mut call = ToolCall::from_json(
                c.run.clone(),
                c.tool.clone(),
                r#"{"customer":"a","amount":1}"#,
            );
            if let Some(t) = &c.tenant {
                call = call.tenant(t.clone());
            }
            if let Some(p) = &c.principal {
                call = call.principal(p.clone());
            }
            if let Some(i) = &c.intent {
                call = call.intent(i.clone());
            }
            call
        };
        let result = rt.block_on(f.registry.call(make()));
        let long = |s: &Option<String>| s.as_ref().is_some_and(|s| s.len() > 1024);
        let valid = !c.run.is_empty()
            && c.run.len() <= 1024
            && !long(&c.tenant)
            && !long(&c.principal)
            && !long(&c.intent)
            && c.intent.as_ref().is_none_or(|i| !i.is_empty());
        let runs = f.ledger.runs.load(Ordering::SeqCst);
        if c.tool != "charge" {
            let Some(CallError::UnknownTool { name }) = result.error() else {
                return Err(TestCaseError::fail(format!(
                    "unknown tool not refused: {result:?}"
                )));
            };
            prop_assert!(name.len() <= 64 + '…'.len_utf8(), "echoed name too long");
        } else if !valid {
            prop_assert!(
                matches!(result.error(), Some(CallError::InvalidCall { .. })),
                "an invalid call must be InvalidCall: {:?}",
                result
            );
        } else {
            prop_assert!(result.is_completed(), "a valid call must run: {:?}", result);
            prop_assert_eq!(runs, 1);
            prop_assert_eq!(f.store.len(), 1);
            return Ok(());
        }
        prop_assert_eq!(runs, 0, "a refused call ran the handler");
        prop_assert!(f.store.is_empty(), "a refused call left a record");
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// The canonical serializer against serde_json
// ---------------------------------------------------------------------------------------

/// True when serde_json's map keeps insertion order in this build (`preserve_order`).
fn maps_keep_insertion_order() -> bool {
    let v: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
    v.as_object().unwrap().keys().next().map(String::as_str) == Some("b")
}

/// `value` with every object's keys in sorted order (the key-sorted form of a parse).
fn key_sorted(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(key_sorted).collect()),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), key_sorted(v)))
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

#[test]
fn canonical_text_matches_serde_json() {
    let insertion_order = maps_keep_insertion_order();
    // serde_json's parser stops at 128 levels: deeper canonical text cannot be read back
    // with it at all (see `deeply_nested_arguments_are_refused_or_saved_intact`).
    let value = prop_oneof![
        4 => arb_value(),
        1 => (0usize..=126, any::<bool>(), leaf()).prop_map(|(d, o, v)| nested(d, o, v)),
    ];
    run_property("canonical vs serde_json", value, |v| {
        let canonical = to_canonical_vec(&v);
        let text = std::str::from_utf8(&canonical)
            .map_err(|e| TestCaseError::fail(format!("canonical text is not UTF-8: {e}")))?;
        let parsed: Value = serde_json::from_str(text).map_err(|e| {
            TestCaseError::fail(format!("canonical text does not parse: {e}: {text}"))
        })?;
        let theirs: Value = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        prop_assert_eq!(&parsed, &v, "canonical text parses back to another value");
        prop_assert_eq!(key_sorted(&parsed), key_sorted(&theirs));
        // Canonical is a fixed point, and whatever order the input's keys came in.
        prop_assert_eq!(to_canonical_vec(&parsed), canonical.clone());
        prop_assert_eq!(to_canonical_vec(&key_sorted(&theirs)), canonical.clone());
        // With sorted maps, serde_json's compact output is the canonical text byte for byte.
        if !insertion_order {
            prop_assert_eq!(serde_json::to_string(&v).unwrap(), text);
        } else {
            prop_assert_eq!(serde_json::to_string(&key_sorted(&v)).unwrap(), text);
        }
        Ok(())
    });
}

/// Arguments nested deeper than serde_json's parser reads back (128 levels): the call runs,
/// but the record's saved operation, which is canonical *text*, parses to `null`
/// (`CanonicalJson::value` falls back to it) and no longer decodes, so a person or the
/// reconciler sees `null` arguments and the reconciler escalates instead of retrying. Either
/// fix passes: refuse such arguments before anything runs (a depth limit under 127), or keep
/// them readable. Fixed by the registry's depth limit (`MAX_ARGS_DEPTH`).
#[test]
fn deeply_nested_arguments_are_refused_or_saved_intact() {
    let rt = runtime();
    for depth in [126usize, 127, 150, 200] {
        let f = fixture();
        let mut v = serde_json::json!({"customer": "a", "amount": 1});
        v["meta"] = nested(depth, false, Value::Null);
        let result = rt.block_on(f.registry.call(ToolCall::new(RUN, "charge", v.clone())));
        let runs = f.ledger.runs.load(Ordering::SeqCst);
        match result.key() {
            None => {
                assert!(
                    matches!(result.error(), Some(CallError::InvalidArgs { .. })),
                    "depth {depth}: {result:?}"
                );
                assert_eq!(runs, 0, "depth {depth}: a refused call ran");
                assert!(
                    f.store.is_empty(),
                    "depth {depth}: a refused call left a record"
                );
            }
            Some(key) => {
                assert_eq!(runs, 1, "depth {depth}");
                let record = rt.block_on(f.store.get(key)).unwrap().expect("a record");
                let op = record.operation.expect("the operation");
                let sent = serde_json::to_value(&f.ledger.args.lock().unwrap()[0]).unwrap();
                assert_eq!(*op.args, sent, "depth {depth}: the saved arguments changed");
                assert!(
                    op.args.decode::<ChargeArgs>().is_ok(),
                    "depth {depth}: the saved arguments no longer decode"
                );
            }
        }
    }
}
