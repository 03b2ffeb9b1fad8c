//! Arguments at the registry's limits, through a store: whatever a call may carry, a store
//! saves and gives back, byte for byte, on every path a repeat, a listing or the reconciler
//! reads it by.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use serde_json::{Map, Value};

use super::{key, skip, StoreFactory, StoreOptions, LEASE, RETENTION};
use crate::identity::canonical::{nesting_levels, to_canonical_vec};
use crate::identity::{Fingerprint, Scope, ARGS_BYTES_DEFAULT, ARGS_DEPTH_LIMIT};
use crate::store::{
    ClaimOutcome, ClaimRequest, Clock, IdemStore, ListCursor, ManualClock, OperationDraft, Record,
    RecordState, Settlement, Timestamp,
};

/// Cases per backend unless `PROPTEST_CASES` says otherwise: each case writes up to a MiB.
const DEFAULT_CASES: u32 = 32;

/// One generated call: its arguments, the ids it came with, and how its handler ended.
#[derive(Clone, Debug)]
struct Input {
    args: Value,
    run_id: String,
    intent: Option<String>,
    end: End,
}

/// How the call's handler ended.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Completed, returning its arguments as its output.
    Echoed,
    /// Failed with an error text made of the arguments' strings.
    Failed,
    /// Never settled: its worker died, the lease ran out, the record is unknown.
    Died,
}

/// Scalars at the edges of what JSON carries: each integer type's extremes, f64's largest,
/// smallest and subnormal values, and strings with every kind of character (NUL, control
/// characters, quotes, backslashes, astral code points).
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(i64::MIN),
            Just(i64::MAX),
            Just(-1i64),
            Just(0),
            Just(i64::from(i32::MIN)),
            Just(i64::from(u32::MAX)),
            Just(-(1i64 << 53) - 1),
        ]
        .prop_map(Value::from),
        prop_oneof![Just(u64::MAX), Just(u64::MAX - 1), Just(1u64 << 63)].prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(f64::MAX),
            Just(f64::MIN),
            Just(f64::MIN_POSITIVE),
            Just(f64::EPSILON),
            Just(5e-324),
            Just(-5e-324),
            Just(-0.0),
            Just(0.1),
            Just(9_007_199_254_740_993.0),
        ]
        .prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ]
}

/// Short strings of any character, NUL and the other control characters made likely.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\\x00-\\x1f\"\\\\\u{7f}\u{e9}\u{10ffff}\u{1f4b8}a]{0,12}",
        Just("\u{0}".to_owned()),
        Just(String::new()),
    ]
}

/// A call's arguments: an object holding a spine nested to `depth` levels in all (up to the
/// registry's limit), edge scalars, and a long string filling the rest of `fill` bytes of
/// compact text (up to the registry's default size limit).
fn args() -> impl Strategy<Value = Value> {
    let depth = prop_oneof![Just(ARGS_DEPTH_LIMIT), 1..=ARGS_DEPTH_LIMIT];
    let fill = prop_oneof![
        4 => Just(0usize),
        2 => 1usize..4096,
        1 => 60_000usize..70_000,
        1 => Just(ARGS_BYTES_DEFAULT),
    ];
    (
        depth,
        prop::collection::vec((any::<bool>(), text()), ARGS_DEPTH_LIMIT),
        scalar(),
        prop::collection::btree_map(text(), scalar(), 0..8),
        fill,
    )
        .prop_map(|(depth, wraps, leaf, edges, fill)| {
            let mut top = Map::new();
            top.extend(edges);
            if depth >= 2 {
                // The spine sits one level below the top object.
                let mut spine = leaf;
                for (array, key) in wraps.into_iter().take(depth - 2) {
                    spine = if array {
                        Value::Array(vec![spine])
                    } else {
                        Value::Object(Map::from_iter([(key, spine)]))
                    };
                }
                top.insert("spine".to_owned(), spine);
            }
            let mut args = Value::Object(top);
            let used = to_canonical_vec(&args).len();
            // `,"~fill":""` and the string's contents, escaped.
            let room = fill.saturating_sub(used + 12);
            if room > 0 {
                const CHUNK: &str = "ab\u{0}\u{e9}\u{6771}\u{1f4b8}\n\"";
                let chunk_len = serde_json::to_string(CHUNK).map_or(1, |s| s.len() - 2);
                let mut s = CHUNK.repeat(room / chunk_len);
                s.push_str(&"x".repeat(room % chunk_len));
                if let Value::Object(map) = &mut args {
                    map.insert("~fill".to_owned(), Value::String(s));
                }
            }
            args
        })
}

fn input() -> impl Strategy<Value = Input> {
    (
        args(),
        prop_oneof![text(), "[a-z0-9-]{1,16}"],
        prop::option::of(text().prop_filter("an intent id is not empty", |s| !s.is_empty())),
        prop_oneof![Just(End::Echoed), Just(End::Failed), Just(End::Died)],
    )
        .prop_map(|(args, run_id, intent, end)| Input {
            args,
            run_id: if run_id.is_empty() {
                "run".to_owned()
            } else {
                run_id
            },
            intent,
            end,
        })
}

/// For arguments generated up to every limit the registry enforces (depth
/// [`MAX_ARGS_DEPTH`](crate::registry::MAX_ARGS_DEPTH) levels, the default
/// [`DEFAULT_MAX_ARGS_BYTES`](crate::registry::DEFAULT_MAX_ARGS_BYTES) of text, long strings,
/// any Unicode including NUL, integers at the edges of i64 and u64, f64's extremes), and
/// run and intent ids of any characters: a claim saves the operation, and a second handle
/// (for a durable backend: another process) reads it back exactly; the settlement (the
/// arguments echoed as the output, or an error text made of them) reads back exactly; a
/// repeat claim finds that record; a listing of its state shows it; and a claim whose
/// worker died reads back, and is listed, as unknown with its operation — what the
/// reconciler works from. `PROPTEST_CASES=N` sets the number of cases (32 by default).
///
/// Builds a runtime of its own: call it from a plain `#[test]`, not from inside a runtime.
pub fn arguments_round_trip<F: StoreFactory>(f: &F) {
    if let Some(reason) = f.unavailable() {
        skip("conformance check `arguments_round_trip`", &reason);
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let clock = ManualClock::starting_now();
    let options = StoreOptions::new(clock.clone(), RETENTION);
    let (location, store, other) = rt.block_on(async {
        let location = f
            .location()
            .await
            .unwrap_or_else(|e| panic!("`arguments_round_trip`: a fresh location: {e}"));
        let store = f
            .open(&location, &options)
            .await
            .unwrap_or_else(|e| panic!("`arguments_round_trip`: opening the store: {e}"));
        let store: Arc<dyn IdemStore> = Arc::new(store);
        let other = if f.durable() {
            let reopened = f
                .open(&location, &options)
                .await
                .unwrap_or_else(|e| panic!("`arguments_round_trip`: a second handle: {e}"));
            Arc::new(reopened) as Arc<dyn IdemStore>
        } else {
            store.clone()
        };
        (location, store, other)
    });
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    });
    let n = AtomicU32::new(0);
    let keeps_nul = f.keeps_nul();
    let result = runner.run(&input(), |input| {
        let case = n.fetch_add(1, Ordering::Relaxed);
        rt.block_on(round_trip(
            &*store, &*other, &clock, keeps_nul, case, &input,
        ))
        .map_err(TestCaseError::fail)
    });
    drop(location);
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => {
            let text = serde_json::to_string(&input.args).unwrap_or_default();
            let shown: String = text.chars().take(2000).collect();
            panic!(
                "{}: arguments the registry accepts do not round-trip: {why}\nminimal case: \
                 {:?} ({} levels, {} bytes), run id {:?}, intent {:?}\nargs: {shown}",
                std::any::type_name::<F::Store>(),
                input.end,
                nesting_levels(text.as_bytes()),
                text.len(),
                input.run_id,
                input.intent,
            )
        }
        Err(e) => panic!("{}: {e}", std::any::type_name::<F::Store>()),
    }
}

async fn round_trip(
    store: &dyn IdemStore,
    other: &dyn IdemStore,
    clock: &ManualClock,
    keeps_nul: bool,
    case: u32,
    input: &Input,
) -> Result<(), String> {
    let canonical = to_canonical_vec(&input.args);
    if nesting_levels(&canonical) > ARGS_DEPTH_LIMIT || canonical.len() > ARGS_BYTES_DEFAULT {
        return Err("the generator left the registry's limits".to_owned());
    }
    // Each case claims a second later than the last, so a listing from just before its
    // claim shows it first.
    clock.advance(Duration::from_secs(1));
    let claimed_at = clock.now();
    let draft = OperationDraft::from_canonical_bytes(
        Scope::run(input.run_id.clone()).with_tenant(input.run_id.clone()),
        input.intent.clone(),
        canonical.clone(),
    );
    let operation = Some(draft.to_operation());
    let req = ClaimRequest {
        key: key(&format!("inputs-{case}")),
        fingerprint: Fingerprint::of_canonical(&canonical),
        tool: "inputs_tool".into(),
        lease: LEASE,
        operation: Some(draft),
    };
    let token = match store.claim(&req).await {
        Ok(ClaimOutcome::Claimed(t)) => t,
        other => return Err(format!("the claim was not granted: {other:?}")),
    };
    let running = read(other, &req, "the claim, from a second handle").await?;
    if running.operation != operation {
        return Err("the saved operation does not read back as claimed".to_owned());
    }
    let strings: String = to_strings(&input.args);
    let (state, settlement) = match input.end {
        End::Echoed => (
            RecordState::Completed,
            Some(Settlement::new(RecordState::Completed).payload(input.args.clone())),
        ),
        End::Failed => (
            RecordState::Failed,
            Some(Settlement::new(RecordState::Failed).message(strings.clone())),
        ),
        End::Died => (RecordState::Unknown, None),
    };
    match settlement {
        Some(s) => store
            .settle(&req.key, token, s)
            .await
            .map_err(|e| format!("the settle failed: {e}"))?,
        None => clock.advance(LEASE + Duration::from_millis(1)),
    }
    let settled = read(other, &req, "the settled record, from a second handle").await?;
    // The error text the handler gave (a store that cannot keep NUL in text keeps U+FFFD
    // in its place); an unknown record's note is the store's, not checked.
    let expected_message = match input.end {
        End::Failed if keeps_nul => Some(Some(strings)),
        End::Failed => Some(Some(strings.replace('\0', "\u{FFFD}"))),
        End::Echoed => Some(None),
        End::Died => None,
    };
    let expected_payload = matches!(input.end, End::Echoed).then(|| input.args.clone());
    check(
        &settled,
        state,
        &operation,
        &expected_payload,
        &expected_message,
    )?;
    // A repeat finds the record, and replays (or, unknown, reconciles) from it.
    let repeat = match other.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => Record::clone(&r),
        other => return Err(format!("a repeat did not find the record: {other:?}")),
    };
    check(
        &repeat,
        state,
        &operation,
        &expected_payload,
        &expected_message,
    )?;
    if repeat.token != settled.token || repeat.created_at != claimed_at {
        return Err("a repeat found another record".to_owned());
    }
    // A listing of its state (the reconciler's, for an unknown one) shows it.
    let before = ListCursor {
        created_at: Timestamp(claimed_at.as_millis() - 1),
        key: req.key.clone(),
    };
    let listed = other
        .list_after(state, Some(&before), 1)
        .await
        .map_err(|e| format!("listing {state} failed: {e}"))?;
    match listed.as_slice() {
        [r] if r.key == req.key => {
            check(r, state, &operation, &expected_payload, &expected_message)
        }
        _ => Err(format!(
            "a listing of {state} does not show the record: {:?}",
            listed.iter().map(|r| &r.key).collect::<Vec<_>>()
        )),
    }
}

async fn read(store: &dyn IdemStore, req: &ClaimRequest, what: &str) -> Result<Record, String> {
    match store.get(&req.key).await {
        Ok(Some(r)) => Ok(r),
        other => Err(format!("{what} does not read back: {other:?}")),
    }
}

fn check(
    r: &Record,
    state: RecordState,
    operation: &Option<crate::store::Operation>,
    payload: &Option<Value>,
    message: &Option<Option<String>>,
) -> Result<(), String> {
    if r.state != state {
        return Err(format!("the record is {}, not {state}", r.state));
    }
    if &r.operation != operation {
        return Err(format!("the operation of the {state} record changed"));
    }
    // Compared as canonical text: equal values, and numbers written alike.
    let canonical = |v: &Option<Value>| v.as_ref().map(to_canonical_vec);
    if canonical(&r.payload) != canonical(payload) {
        return Err(format!("the output of the {state} record changed"));
    }
    if message.as_ref().is_some_and(|m| &r.message != m) {
        return Err(format!("the error text of the {state} record changed"));
    }
    Ok(())
}

/// Every string of `v` (keys and values) joined: an error text made of the arguments.
fn to_strings(v: &Value) -> String {
    let mut out = String::new();
    let mut pending = vec![v];
    while let Some(v) = pending.pop() {
        match v {
            Value::String(s) => out.push_str(s),
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => {
                for (k, v) in map {
                    out.push_str(k);
                    pending.push(v);
                }
            }
            _ => {}
        }
        if out.len() > 4096 {
            break;
        }
    }
    // A long error text, cut at a character.
    let mut end = out.len().min(4096);
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    out.truncate(end);
    out
}
