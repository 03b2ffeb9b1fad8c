//! Every input the registry accepts round-trips through every store, end to end: a real
//! `#[tool(write)]` called through `Registry::call` with arguments up to the registry's
//! limits (depth, size, any Unicode including NUL, numbers at the edges of i64, u64 and
//! f64), as a value and as text, ends completed with its output saved; a repeat replays it
//! without running the handler; the record is listed. Arguments one level too deep are
//! refused and nothing runs or is stored. An output too deep to keep ends completed with a
//! null output, readable and replayed on every store.

use std::sync::{Arc, Mutex};

use idem::registry::{DEFAULT_MAX_ARGS_BYTES, MAX_ARGS_DEPTH};
use idem::store::{ListCursor, RecordState, Retention, Timestamp};
use idem::{toolbox, CallError, Registry, ToolCall, ToolError, WriteCtx};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use serde_json::{json, Map, Value};

use super::backends;

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct NoteArgs {
    body: Value,
}

/// Runs of the handler, by key.
#[derive(Default)]
struct Notes {
    runs: Mutex<Vec<String>>,
}

#[toolbox]
impl Notes {
    /// Keep a note and give it back.
    #[tool(write)]
    async fn keep(&self, ctx: WriteCtx, args: NoteArgs) -> Result<Value, ToolError> {
        self.runs
            .lock()
            .unwrap()
            .push(ctx.key().as_str().to_owned());
        Ok(args.body)
    }
}

/// A generated call: the note's body, how deep the arguments nest in all, whether it is
/// sent as text, and how much text to fill it to.
#[derive(Clone, Debug)]
struct Case {
    args: Value,
    levels: usize,
    as_text: bool,
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(i64::MIN)),
        Just(json!(i64::MAX)),
        Just(json!(u64::MAX)),
        Just(json!(f64::MAX)),
        Just(json!(f64::MIN_POSITIVE)),
        Just(json!(5e-324)),
        Just(json!(-0.0)),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\\u{10ffff}\u{1f4b8}a]{0,8}".prop_map(Value::String),
        Just(Value::Null),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    // Levels in all: the arguments' object, `body`, and the spine inside it. One past the
    // limit now and then, which must be refused.
    let levels = prop_oneof![
        3 => Just(MAX_ARGS_DEPTH),
        1 => Just(MAX_ARGS_DEPTH + 1),
        3 => 3..=MAX_ARGS_DEPTH,
    ];
    let fill = prop_oneof![
        4 => Just(0usize),
        2 => 1usize..8192,
        1 => Just(DEFAULT_MAX_ARGS_BYTES),
    ];
    (
        levels,
        prop::collection::vec(
            (any::<bool>(), "[\\x00-\\x1f\u{e9}\u{1f4b8}a]{0,4}"),
            MAX_ARGS_DEPTH,
        ),
        leaf(),
        prop::collection::vec(leaf(), 0..6),
        fill,
        any::<bool>(),
    )
        .prop_map(|(levels, wraps, leaf, edges, fill, as_text)| {
            // `{"body": [edges…, spine]}`: the spine's innermost leaf at `levels`.
            let mut spine = leaf;
            for (array, key) in wraps.into_iter().take(levels.saturating_sub(3)) {
                spine = if array {
                    Value::Array(vec![spine])
                } else {
                    Value::Object(Map::from_iter([(key, spine)]))
                };
            }
            let mut body = edges;
            body.push(spine);
            let mut args = json!({ "body": body });
            let used = serde_json::to_vec(&args).unwrap().len();
            let room = fill.saturating_sub(used + 8);
            if room > 0 {
                const CHUNK: &str = "ab\u{0}\u{e9}\u{6771}\u{1f4b8}\n\"";
                let chunk_len = serde_json::to_string(CHUNK).unwrap().len() - 2;
                let mut s = CHUNK.repeat(room / chunk_len);
                s.push_str(&"x".repeat(room % chunk_len));
                args["body"]
                    .as_array_mut()
                    .unwrap()
                    .insert(0, Value::String(s));
            }
            Case {
                args,
                levels,
                as_text,
            }
        })
}

#[test]
fn every_accepted_input_round_trips_through_every_store() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    for b in backends("inputs") {
        let store = rt.block_on((b.open)(Retention::default()));
        let notes = Arc::new(Notes::default());
        let registry = Registry::builder()
            .shared_store(store.clone())
            .toolbox(notes.clone())
            .build()
            .unwrap();
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 128,
            ..Config::default()
        });
        let n = std::sync::atomic::AtomicU32::new(0);
        let result = runner.run(&case(), |case| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(call_and_repeat(&registry, &notes, &case, i))
                .map_err(TestCaseError::fail)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, case)) => panic!(
                "{}: {why}\nminimal case: {} levels, {} bytes, as text: {}",
                b.name,
                case.levels,
                serde_json::to_vec(&case.args).unwrap().len(),
                case.as_text
            ),
            Err(e) => panic!("{}: {e}", b.name),
        }
    }
}

async fn call_and_repeat(
    registry: &Registry,
    notes: &Notes,
    case: &Case,
    i: u32,
) -> Result<(), String> {
    let runs = || notes.runs.lock().unwrap().len();
    let before = runs();
    let call = || {
        let run = format!("run-{i}");
        if case.as_text {
            ToolCall::from_json(run, "keep", serde_json::to_string(&case.args).unwrap())
        } else {
            ToolCall::new(run, "keep", case.args.clone())
        }
    };
    let first = registry.call(call()).await;
    if case.levels > MAX_ARGS_DEPTH {
        return match first.error() {
            Some(CallError::InvalidArgs { message, .. })
                if message.contains("deeper") && runs() == before && first.key().is_none() =>
            {
                Ok(())
            }
            _ => Err(format!(
                "arguments {} levels deep must be refused, nothing run: {:?}",
                case.levels,
                first.as_result().map(|_| ())
            )),
        };
    }
    let body = &case.args["body"];
    match first.outcome() {
        Some(idem::Outcome::Completed { output }) if output == body => {}
        other => {
            return Err(format!(
                "the call did not complete with its output: {other:?}"
            ))
        }
    }
    if runs() != before + 1 {
        return Err("the handler did not run exactly once".to_owned());
    }
    let key = first.key().ok_or("a write has a key")?.clone();
    let store = registry.store();
    let record = store
        .get(&key)
        .await
        .map_err(|e| format!("the record does not read back: {e}"))?
        .ok_or("no record")?;
    if record.state != RecordState::Completed || record.payload.as_ref() != Some(body) {
        return Err(format!("the record is {} without its output", record.state));
    }
    let repeat = registry.call(call()).await;
    match repeat.outcome() {
        Some(idem::Outcome::Completed { output }) if output == body && repeat.replayed() => {}
        other => return Err(format!("the repeat did not replay the output: {other:?}")),
    }
    if runs() != before + 1 {
        return Err("the repeat ran the handler again".to_owned());
    }
    // Listed, as the reconciler and `idem list` see records.
    let cursor = ListCursor {
        created_at: Timestamp(record.created_at.as_millis().saturating_sub(1)),
        key: key.clone(),
    };
    let listed = store
        .list_after(RecordState::Completed, Some(&cursor), 16)
        .await
        .map_err(|e| format!("the listing failed: {e}"))?;
    if !listed.iter().any(|r| r.key == key) {
        return Err("the record is not listed".to_owned());
    }
    Ok(())
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct NestArgs {
    levels: u32,
}

/// Runs of the handler, by key.
#[derive(Default)]
struct Nester {
    runs: Mutex<u32>,
}

#[toolbox]
impl Nester {
    /// Give back a value nested `levels` arrays deep.
    #[tool(write)]
    async fn nest(&self, _ctx: WriteCtx, args: NestArgs) -> Result<Value, ToolError> {
        *self.runs.lock().unwrap() += 1;
        let mut v = json!("core");
        for _ in 0..args.levels {
            v = Value::Array(vec![v]);
        }
        Ok(v)
    }
}

fn nests(mut v: &Value) -> usize {
    let mut levels = 0;
    while let Some([inner]) = v.as_array().map(Vec::as_slice) {
        levels += 1;
        v = inner;
    }
    levels
}

/// A handler's output is as free as its code: one that nests deeper than a record can keep
/// (the stores wrap it in forms that must parse back) still ends completed, with a null
/// output, on every store: readable, listed, replayed, never run again. One within the
/// limit is kept whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_too_deep_to_keep_is_completed_with_null_on_every_store() {
    for b in backends("deep_output") {
        let store = (b.open)(Retention::default()).await;
        let nester = Arc::new(Nester::default());
        let registry = Registry::builder()
            .shared_store(store.clone())
            .toolbox(nester.clone())
            .build()
            .unwrap();
        for (levels, kept) in [
            (MAX_ARGS_DEPTH, true),
            (MAX_ARGS_DEPTH + 1, false),
            (300, false),
        ] {
            let name = b.name;
            let call = || ToolCall::new(format!("run-{levels}"), "nest", json!({"levels": levels}));
            let before = *nester.runs.lock().unwrap();
            let first = registry.call(call()).await;
            let key = first.key().expect("a write has a key").clone();
            let output = match first.outcome() {
                Some(idem::Outcome::Completed { output }) => output.clone(),
                other => panic!("{name}, {levels} levels: not completed: {other:?}"),
            };
            let record = store
                .get(&key)
                .await
                .unwrap_or_else(|e| panic!("{name}, {levels} levels: unreadable: {e}"))
                .expect("a record");
            assert_eq!(record.state, RecordState::Completed, "{name}, {levels}");
            let saved = record.payload.clone().unwrap_or(Value::Null);
            if kept {
                assert_eq!(nests(&output), levels, "{name}");
                assert_eq!(nests(&saved), levels, "{name}");
            } else {
                assert_eq!(
                    (&output, &saved),
                    (&Value::Null, &Value::Null),
                    "{name}, {levels}"
                );
            }
            let repeat = registry.call(call()).await;
            assert!(
                repeat.replayed() && repeat.is_completed(),
                "{name}, {levels}: {}",
                repeat.text()
            );
            assert_eq!(*nester.runs.lock().unwrap(), before + 1, "{name}, {levels}");
            let cursor = ListCursor {
                created_at: Timestamp(record.created_at.as_millis().saturating_sub(1)),
                key: key.clone(),
            };
            let listed = store
                .list_after(RecordState::Completed, Some(&cursor), 16)
                .await
                .unwrap_or_else(|e| panic!("{name}, {levels} levels: listing failed: {e}"));
            assert!(
                listed.iter().any(|r| r.key == key),
                "{name}, {levels}: not listed"
            );
        }
    }
}
