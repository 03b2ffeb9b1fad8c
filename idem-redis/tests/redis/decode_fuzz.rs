//! Record decoding under garbage ([`idem_test::decode_fuzz`]) for Redis: the record's hash
//! is rewritten with redis-rs (one field set or deleted, or the key given another type),
//! under a key prefix of its own, removed afterwards; only when `IDEM_REDIS_URL` is set,
//! failing under `IDEM_REQUIRE_BACKENDS=1` without it.

use std::sync::Arc;

use idem_redis::RedisStore;
use idem_runtime::store::{IdemStore, ManualClock, StoreError};
use idem_test::decode_fuzz::{exercise, garbage_bytes, key, prepare, run, runtime, stage, Stage};
use idem_test::stores::RedisPrefix;

use crate::durable::redis_url;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[derive(Clone, Debug)]
enum Damage {
    Set(&'static str, Vec<u8>),
    Delete(&'static str),
    /// The record key holds another Redis type.
    WrongType,
}

fn damage() -> impl Strategy<Value = Damage> {
    let field = prop::sample::select(vec![
        "v", "k", "fp", "tool", "st", "tok", "lease", "ca", "ua", "rx", "att", "rb", "op", "pl",
        "msg", "ref",
    ]);
    prop_oneof![
        6 => (field.clone(), garbage_bytes()).prop_map(|(f, b)| Damage::Set(f, b)),
        2 => field.prop_map(Damage::Delete),
        1 => Just(Damage::WrongType),
    ]
}

/// Brings a record under a fresh prefix to `stage`, damages it, and runs every operation
/// on it.
async fn damaged(url: &str, stage: Stage, damage: &Damage) -> Result<(), TestCaseError> {
    let prefix = RedisPrefix::on(url.to_owned(), "decode");
    let clock = ManualClock::starting_now();
    let store = prefix
        .builder()
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect");
    let token = prepare(&store, stage).await;
    let mut conn = redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let rk = format!("{}r:{}", prefix.prefix, key().as_str());
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
    let Some(url) = redis_url("damaged_redis_records_are_corrupt_never_a_panic") else {
        return;
    };
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
    let Some(url) = redis_url("times_that_are_not_whole_numbers_are_corrupt") else {
        return;
    };
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

/// Found by the fuzz above: a record whose version or state field held bytes that are not
/// UTF-8 failed every operation with `Backend("redis: parse error …")` instead of `Corrupt`,
/// because the script quoted the raw value in its error reply.
#[test]
fn non_utf8_version_or_state_is_corrupt_in_redis() {
    let Some(url) = redis_url("non_utf8_version_or_state_is_corrupt_in_redis") else {
        return;
    };
    runtime().block_on(async {
        for field in ["v", "st"] {
            let prefix = RedisPrefix::on(url.clone(), "decode_utf8");
            let clock = ManualClock::starting_now();
            let store: RedisStore = prefix
                .builder()
                .clock(Arc::new(clock.clone()))
                .connect()
                .await
                .expect("connect");
            prepare(&store, Stage::Completed).await;
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let rk = format!("{}r:{}", prefix.prefix, key().as_str());
            redis::cmd("HSET")
                .arg(&rk)
                .arg(field)
                .arg(b"\x80\xff".as_slice())
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
            let got = store.get(&key()).await;
            assert!(
                matches!(got, Err(StoreError::Corrupt { .. })),
                "field `{field}` not UTF-8: {got:?}"
            );
        }
    });
}
