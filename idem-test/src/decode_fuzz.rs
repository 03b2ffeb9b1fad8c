//! Record decoding under garbage, for every store: a stored record with one field
//! overwritten by arbitrary data (what a foreign writer, a bad migration or a bit flip can
//! leave) must be reported as `StoreError::Corrupt`, or read as the record it now is — never
//! a panic, never another kind of error, and never a claim granted over a record the store
//! reports corrupt.
//!
//! The decoders are private, so each store's test damages its own rows or hashes (a
//! [`Strategy`] of damages of its own) between [`prepare`] and [`exercise`]; [`run`] drives
//! the cases. 128 cases per store by default; `PROPTEST_CASES=N` raises it.

use std::time::Duration;

use idem::identity::Fingerprint;
use idem::identity::KeyMaterial;
use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::{ClaimToken, ListCursor, ManualClock, RecordState, StoreError, Timestamp};
use idem::{IdemKey, IdemStore, Scope};
use proptest::prelude::*;
pub use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

const DEFAULT_CASES: u32 = 128;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// The key every case damages.
pub fn key() -> IdemKey {
    IdemKey::derive(&Scope::run("decode-fuzz"), "t", KeyMaterial::Intent("k"))
}

/// The claim every case makes on [`key`], before and after the damage.
pub fn request() -> ClaimRequest {
    ClaimRequest {
        key: key(),
        fingerprint: Fingerprint::of_canonical(b"args"),
        tool: "t".into(),
        lease: Duration::from_secs(30),
        operation: Some(
            idem::store::Operation {
                scope: Scope::run("decode-fuzz"),
                intent: None,
                args: json!({"a": 1}).into(),
            }
            .into(),
        ),
    }
}

/// How far the record got before it was damaged.
#[derive(Clone, Copy, Debug)]
pub enum Stage {
    /// Claimed, not settled.
    Running,
    /// Settled completed, with a result.
    Completed,
    /// Settled unknown, with a message.
    Unknown,
}

/// Brings the key to `stage`; returns the token.
pub async fn prepare(s: &dyn IdemStore, stage: Stage) -> ClaimToken {
    let ClaimOutcome::Claimed(token) = s.claim(&request()).await.expect("claim") else {
        panic!("a fresh key must be claimed");
    };
    let settlement = match stage {
        Stage::Running => return token,
        Stage::Completed => Settlement::new(RecordState::Completed).payload(json!({"ok": true})),
        Stage::Unknown => Settlement::new(RecordState::Unknown).message("timed out"),
    };
    s.settle(&key(), token, settlement).await.expect("settle");
    token
}

/// An answer a damaged record may get: any but a kind of error that hides the damage.
fn allowed<T: std::fmt::Debug>(what: &str, r: &Result<T, StoreError>) -> Result<(), TestCaseError> {
    match r {
        Ok(_)
        | Err(StoreError::Corrupt { .. })
        | Err(StoreError::StaleToken { .. })
        | Err(StoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "{what} on a damaged record: expected Corrupt (or an ordinary answer), got {e:?}"
        ))),
    }
}

/// Runs every operation on the damaged key (and again an hour later on `clock`, the store's
/// clock); checks the answers.
pub async fn exercise(
    s: &dyn IdemStore,
    clock: &ManualClock,
    token: ClaimToken,
) -> Result<(), TestCaseError> {
    let k = key();
    let got = s.get(&k).await;
    allowed("get", &got)?;
    for state in RecordState::ALL {
        allowed("list", &s.list(state, 10).await)?;
        let cursor = ListCursor {
            created_at: Timestamp(0),
            key: k.clone(),
        };
        allowed("list_after", &s.list_after(state, Some(&cursor), 10).await)?;
    }
    let claim = s.claim(&request()).await;
    allowed("claim", &claim)?;
    // A record the store cannot read may hold anything: no claim is granted over it.
    if matches!(got, Err(StoreError::Corrupt { .. })) {
        prop_assert!(
            !matches!(claim, Ok(ClaimOutcome::Claimed(_))),
            "a claim was granted over a record `get` reports corrupt"
        );
    }
    allowed("renew", &s.renew(&k, token, Duration::from_secs(5)).await)?;
    allowed(
        "settle",
        &s.settle(&k, token, Settlement::new(RecordState::Failed).message("x"))
            .await,
    )?;
    allowed(
        "reclaim",
        &s.reclaim(&k, token, Duration::from_secs(5)).await,
    )?;
    allowed("release", &s.release(&k, token).await)?;
    clock.advance(Duration::from_secs(3600));
    allowed("get after an hour", &s.get(&k).await)?;
    for state in RecordState::ALL {
        allowed("list after an hour", &s.list(state, 10).await)?;
    }
    Ok(())
}

/// Every [`Stage`].
pub fn stage() -> impl Strategy<Value = Stage> {
    prop_oneof![
        Just(Stage::Running),
        Just(Stage::Completed),
        Just(Stage::Unknown)
    ]
}

/// Garbage text: arbitrary bytes (often not UTF-8), near-misses of valid values, JSON of the
/// wrong shape.
pub fn garbage_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        "\\PC{0,24}".prop_map(String::into_bytes),
        prop::sample::select(vec![
            "",
            "null",
            "[]",
            "{}",
            "[{}]",
            "[null]",
            "\"x\"",
            "-1",
            "1e400",
            "18446744073709551616",
            "running",
            "completed",
            "failed",
            "pending",
            "unknown",
            "escalated",
            "Running",
            "0",
            "1",
            "2",
            "true",
            "0000000000000000000000000000000g",
            "00000000000000000000000000000000",
            "[{\"attempt\":1}]",
            "[{\"at\":1,\"result\":2}]",
            "{\"scope\":1}",
            "nan",
            "inf",
            "9007199254740993",
            "-0",
            " 1",
            "1 ",
            "1.5",
            "0x10",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
    ]
}

/// The runtime the cases block on (proptest's runner is synchronous).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `test` over `strategy`'s cases; panics with `name` and the minimal failing case.
pub fn run<S: Strategy>(
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
        panic!("{name}: {e}");
    }
    eprintln!(
        "{name}: {} cases passed in {:.1?}",
        cases(),
        started.elapsed()
    );
}
