//! Record decoding under garbage: a stored record with one field overwritten by arbitrary
//! data (what a foreign writer, a bad migration or a bit flip can leave) must be reported as
//! `StoreError::Corrupt`, or read as the record it now is — never a panic, never another
//! kind of error, and never a claim granted over a record the store reports corrupt.
//!
//! The decoders are private, so this goes through the stores: Redis hashes with redis-rs (under a key prefix of its own, removed afterwards;
//! only when `IDEM_REDIS_URL` is set, failing under `IDEM_REQUIRE_BACKENDS=1` without it).
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

mod redis_backend {
    use super::*;
    use idem_redis::RedisStore;
    use std::sync::atomic::{AtomicU64, Ordering};

    const VAR: &str = "IDEM_REDIS_URL";

    fn url() -> Option<String> {
        if let Some(url) = std::env::var(VAR).ok().filter(|s| !s.trim().is_empty()) {
            return Some(url);
        }
        let why = format!(
            "{VAR} not set; export it (or source .ci/services.sh) to run the Redis decoding fuzz"
        );
        assert!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() != Ok("1"),
            "IDEM_REQUIRE_BACKENDS=1, but {why}"
        );
        eprintln!("skipped: {why}");
        None
    }

    /// Deletes everything under the prefix when dropped.
    struct Prefix(redis::Client, String);

    impl Drop for Prefix {
        fn drop(&mut self) {
            if let Ok(mut conn) = self.0.get_connection() {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{}*", self.1))
                    .query(&mut conn)
                    .unwrap_or_default();
                if !keys.is_empty() {
                    let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut conn);
                }
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Damage {
        Set(&'static str, Vec<u8>),
        Delete(&'static str),
        /// The record key holds another Redis type.
        WrongType,
    }

    fn damage() -> impl Strategy<Value = Damage> {
        let field = prop::sample::select(vec![
            "v", "k", "fp", "tool", "st", "tok", "lease", "ca", "ua", "rx", "att", "rb", "op",
            "pl", "msg", "ref",
        ]);
        prop_oneof![
            6 => (field.clone(), garbage_bytes()).prop_map(|(f, b)| Damage::Set(f, b)),
            2 => field.prop_map(Damage::Delete),
            1 => Just(Damage::WrongType),
        ]
    }

    /// Brings a record under a fresh prefix to `stage`, damages it, and runs every
    /// operation on it.
    async fn damaged(url: &str, stage: Stage, damage: &Damage) -> Result<(), TestCaseError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let client = redis::Client::open(url).expect("client");
        let prefix = Prefix(
            client.clone(),
            format!(
                "idem-decode:{}-{}:",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
        );
        let clock = ManualClock::starting_now();
        let store = RedisStore::builder(url)
            .prefix(prefix.1.as_str())
            .clock(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect");
        let token = prepare(&store, stage).await;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let rk = format!("{}r:{}", prefix.1, key().as_str());
        let r: redis::RedisResult<()> = match damage {
            Damage::Set(f, b) => {
                redis::cmd("HSET")
                    .arg(&rk)
                    .arg(*f)
                    .arg(b.as_slice())
                    .query_async(&mut conn)
                    .await
            }
            Damage::Delete(f) => {
                redis::cmd("HDEL")
                    .arg(&rk)
                    .arg(*f)
                    .query_async(&mut conn)
                    .await
            }
            Damage::WrongType => {
                redis::pipe()
                    .del(&rk)
                    .rpush(&rk, "x")
                    .query_async(&mut conn)
                    .await
            }
        };
        r.expect("damage the record");
        exercise(&store, &clock, token).await
    }

    #[test]
    fn damaged_redis_records_are_corrupt_never_a_panic() {
        let Some(url) = url() else { return };
        let rt = runtime();
        run("Redis records", (stage(), damage()), |(stage, damage)| {
            rt.block_on(damaged(&url, stage, &damage))
        });
    }

    /// Found by the fuzz above: Lua's `tonumber` reads `nan`, `inf` and `1e999` as numbers,
    /// so a time field holding one passed the script's checks and a settle failed halfway,
    /// at `ZADD`, with `Backend("… value is not a valid float")` instead of `Corrupt`.
    #[test]
    fn times_that_are_not_whole_numbers_are_corrupt() {
        let Some(url) = url() else { return };
        let rt = runtime();
        for stage in [Stage::Running, Stage::Completed, Stage::Unknown] {
            for field in ["ca", "ua", "lease"] {
                for value in ["nan", "-nan", "inf", "-inf", "1e999", "-1", "1.5", "0x10"] {
                    let damage = Damage::Set(field, value.as_bytes().to_vec());
                    if let Err(e) = rt.block_on(damaged(&url, stage, &damage)) {
                        panic!("{stage:?}, {field} = {value}: {e}");
                    }
                }
            }
        }
    }
}

/// Found by the fuzz above: a record whose version or state field held bytes that are not
/// UTF-8 failed every operation with `Backend("redis: parse error …")` instead of `Corrupt`,
/// because the script quoted the raw value in its error reply.
#[test]
fn non_utf8_version_or_state_is_corrupt_in_redis() {
    let Ok(url) = std::env::var("IDEM_REDIS_URL") else {
        assert!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() != Ok("1"),
            "IDEM_REQUIRE_BACKENDS=1, but IDEM_REDIS_URL is not set"
        );
        eprintln!("skipped: IDEM_REDIS_URL not set");
        return;
    };
    runtime().block_on(async {
        for field in ["v", "st"] {
            let prefix = format!("idem-decode-utf8:{}-{field}:", std::process::id());
            let clock = ManualClock::starting_now();
            let store = idem_redis::RedisStore::builder(url.as_str())
                .prefix(prefix.as_str())
                .clock(Arc::new(clock.clone()))
                .connect()
                .await
                .expect("connect");
            prepare(&store, Stage::Completed).await;
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let rk = format!("{prefix}r:{}", key().as_str());
            redis::cmd("HSET")
                .arg(&rk)
                .arg(field)
                .arg(b"\x80\xff".as_slice())
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
            let got = store.get(&key()).await;
            redis::cmd("DEL")
                .arg(&rk)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
            assert!(
                matches!(got, Err(StoreError::Corrupt { .. })),
                "field `{field}` not UTF-8: {got:?}"
            );
        }
    });
}
