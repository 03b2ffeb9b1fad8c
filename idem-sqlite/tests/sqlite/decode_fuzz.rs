//! Record decoding under garbage: a stored record with one field overwritten by arbitrary
//! data (what a foreign writer, a bad migration or a bit flip can leave) must be reported as
//! `StoreError::Corrupt`, or read as the record it now is — never a panic, never another
//! kind of error, and never a claim granted over a record the store reports corrupt.
//!
//! The decoders are private, so this goes through the stores: SQLite rows are rewritten with
//! rusqlite.
//! Then every operation runs against the damaged key. 128 cases per backend by default;
//! `PROPTEST_CASES=N` raises it.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::identity::KeyMaterial;
use idem_runtime::identity::{Fingerprint, IdemKey, Scope};
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{
    ClaimToken, IdemStore, ListCursor, ManualClock, RecordState, StoreError, Timestamp,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

const DEFAULT_CASES: u32 = 128;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn key() -> IdemKey {
    IdemKey::derive(&Scope::run("decode-fuzz"), "t", KeyMaterial::Intent("k"))
}

fn request() -> ClaimRequest {
    ClaimRequest {
        key: key(),
        fingerprint: Fingerprint::of_canonical(b"args"),
        tool: "t".into(),
        lease: Duration::from_secs(30),
        operation: Some(
            idem_runtime::store::Operation {
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
enum Stage {
    Running,
    Completed,
    Unknown,
}

/// Brings the key to `stage`; returns the token.
async fn prepare(s: &dyn IdemStore, stage: Stage) -> ClaimToken {
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

/// Runs every operation on the damaged key; checks the answers.
async fn exercise(
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

fn stage() -> impl Strategy<Value = Stage> {
    prop_oneof![
        Just(Stage::Running),
        Just(Stage::Completed),
        Just(Stage::Unknown)
    ]
}

/// Garbage text: arbitrary bytes (often not UTF-8), near-misses of valid values, JSON of the
/// wrong shape.
fn garbage_bytes() -> impl Strategy<Value = Vec<u8>> {
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
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

mod sqlite {
    use super::*;
    use idem_sqlite::SqliteStore;

    /// A column and what to put in it (STRICT tables: text columns take text, possibly
    /// invalid UTF-8; integer columns take any integer).
    #[derive(Clone, Debug)]
    enum Damage {
        Text(&'static str, Vec<u8>),
        Int(&'static str, i64),
        Null(&'static str),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        let text_cols = prop::sample::select(vec![
            "state",
            "fingerprint",
            "tool",
            "token",
            "payload",
            "message",
            "downstream_ref",
            "attempts",
            "operation",
            "read_backs",
        ]);
        let int_cols = prop::sample::select(vec![
            "lease_until",
            "created_at",
            "updated_at",
            "result_expired",
        ]);
        let ints = prop_oneof![
            any::<i64>(),
            prop::sample::select(vec![i64::MIN, -1, 0, 1, 2, i64::MAX])
        ];
        prop_oneof![
            3 => (text_cols.clone(), garbage_bytes()).prop_map(|(c, b)| Damage::Text(c, b)),
            2 => (int_cols.clone(), ints).prop_map(|(c, n)| Damage::Int(c, n)),
            1 => prop_oneof![text_cols, int_cols].prop_map(Damage::Null),
        ]
    }

    #[test]
    fn damaged_sqlite_rows_are_corrupt_never_a_panic() {
        let rt = runtime();
        run("SQLite rows", (stage(), damage()), |(stage, damage)| {
            rt.block_on(async {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("idem.sqlite3");
                let clock = ManualClock::starting_now();
                let store = SqliteStore::builder(&path)
                    .clock(Arc::new(clock.clone()))
                    .open()
                    .await
                    .expect("open");
                let token = prepare(&store, stage).await;
                let conn = rusqlite::Connection::open(&path).expect("open the file directly");
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                let k = key();
                let written = match &damage {
                    Damage::Text(col, bytes) => conn.execute(
                        &format!("UPDATE idem_records SET {col} = CAST(?1 AS TEXT) WHERE key = ?2"),
                        rusqlite::params![bytes, k.as_str()],
                    ),
                    Damage::Int(col, n) => conn.execute(
                        &format!("UPDATE idem_records SET {col} = ?1 WHERE key = ?2"),
                        rusqlite::params![n, k.as_str()],
                    ),
                    Damage::Null(col) => conn.execute(
                        &format!("UPDATE idem_records SET {col} = NULL WHERE key = ?1"),
                        rusqlite::params![k.as_str()],
                    ),
                };
                // A NOT NULL column refuses NULL: nothing was damaged, nothing to check.
                if written.is_err() {
                    return Ok(());
                }
                exercise(&store, &clock, token).await
            })
        });
    }
}
